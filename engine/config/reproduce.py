"""The paper's grid, defined once: ``python -m engine reproduce``, the Launch page's
"Reproduce the paper" and its "Paper settings" all take it from here.

The paper (section 4 and its public code) trains the paper preset (batch 1, T 64,
d 64, 2 heads, 2 layers) with SGD, momentum 0.9, lr 0.01, for 50,000 steps; exact
backprop against BASIS at R ∈ {1, 8, 16, 32, 64} with the shrink λ = 0.01 of its
code. The lab repeats it over seeds (the same seed: the same initial parameters
and batches for every method) and tags the runs ``reproduce``; when the last of
them ends, its report is built and stored with the sweep
(``engine.reads.reports``).
"""

from __future__ import annotations

from typing import Iterable

from engine.config.run import RunConfig
from engine.config.sweep import Sweep

PAPER_STEPS = 50_000
PAPER_RANKS = (1, 8, 16, 32, 64)
PAPER_LAM = 0.01
REPRODUCE_SEEDS = (0, 1, 2)
REPRODUCE_TAG = "reproduce"
PAPER_EVAL_INTERVAL = 1000  # the paper validates every 1,000 steps
MIN_EVALS = 10  # a shorter reproduction still validates this many times (plus step 0)


def eval_interval_for(steps: int) -> int:
    """The paper's 1,000 steps between validations, or ``steps / MIN_EVALS`` for a
    run too short to validate ``MIN_EVALS`` times at that interval (at least 1)."""
    return max(1, min(PAPER_EVAL_INTERVAL, steps // MIN_EVALS))


def reproduction_sweep(steps: int = PAPER_STEPS, seeds: Iterable[int] = REPRODUCE_SEEDS) -> Sweep:
    """The paper's grid over ``seeds``: exact once per seed and basis at every rank of
    ``PAPER_RANKS`` with λ = ``PAPER_LAM``, ``steps`` steps each (validation and dW
    probes every ``eval_interval_for(steps)``), tagged ``REPRODUCE_TAG``."""
    interval = eval_interval_for(steps)
    base = RunConfig(preset="paper", steps=steps, eval_interval=interval, probe_interval=interval)
    return Sweep(base, estimators=("exact", "basis"), ranks=PAPER_RANKS, lams=(PAPER_LAM,), seeds=tuple(seeds),
                 tags=(REPRODUCE_TAG,))
