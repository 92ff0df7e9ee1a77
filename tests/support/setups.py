"""Many runs of distinct setups, written fast (``RunsRepository.runs.create_runs``, then one
``add_metrics`` per run): what Compare over hundreds of setups reads. ``setup_config(i)``
is run ``i``'s setup (estimators, ranks and λ in turn, a learning rate of its own, so no
two runs share a comparable config group), ``write_setups`` writes ``count`` finished runs
of them into one sweep."""

from __future__ import annotations

from engine.config import RunConfig
from storage import RunStore

SWEEP = "20261201-120000-5e7a11"
STEPS, EVERY = 100, 10
METHODS = [("exact", 8, 0.0), ("basis", 8, 0.0), ("basis", 32, 0.0), ("countsketch", 8, 0.0), ("basis", 8, 0.01)]
BATCH = 500  # runs per create_runs transaction


def setup_config(i: int) -> RunConfig:
    """Run ``i``'s setup: a method of ``METHODS`` in turn and a learning rate no other run has."""
    estimator, rank, lam = METHODS[i % len(METHODS)]
    return RunConfig(preset="tiny", steps=STEPS, eval_interval=EVERY, probe_interval=EVERY, estimator=estimator,
                     rank=rank, lam=lam, seed=0, lr=1e-3 * (1 + i / 1000))


def setup_rows(i: int, config: RunConfig) -> list[tuple[int, float, str, float]]:
    """Run ``i``'s metrics, as a probed run records them: memory at step 0; the losses,
    tokens/s, host load and (sketched runs) the mean cosine at every eval."""
    saved_exact = 13e6
    saved = saved_exact if config.is_exact else 7e6
    rows = [(0, 0.5, "mem_saved_bytes", saved), (0, 0.5, "mem_saved_bytes_exact", saved_exact),
            (0, 0.5, "mem_saved_ratio", saved / saved_exact)]
    for step in range(0, STEPS + 1, EVERY):
        wall = 0.5 + 0.01 * step
        val = 6.0 + 4.8 / (1 + step / 10) + 1e-4 * i
        rows += [(step, wall, "val_loss", val), (step, wall, "train_loss", val - 0.1),
                 (step, wall, "tokens_per_s", 1000.0 + i), (step, wall, "sys/load1", 1.5)]
        if step and not config.is_exact:
            rows.append((step, wall, "cos_mean", 0.5 + 0.001 * (i % 100)))
    return rows


def write_setups(store: RunStore, count: int, sweep_id: str = SWEEP) -> list[int]:
    """``count`` finished runs, each of its own setup (``setup_config``), in sweep
    ``sweep_id``; their ids in order."""
    ids: list[int] = []
    for first in range(0, count, BATCH):
        configs = [setup_config(i) for i in range(first, min(first + BATCH, count))]
        specs = [dict(name=c.label(), config=c.to_dict(), estimator=c.estimator, rank=None if c.is_exact else c.rank,
                      lam=c.lam, seed=c.seed, preset=c.preset, steps=c.steps, status="finished", sweep_id=sweep_id)
                 for c in configs]
        for i, (c, run_id) in enumerate(zip(configs, store.runs.create_runs(specs)), start=first):
            store.metrics.add_metrics(run_id, setup_rows(i, c))
            store.runs.heartbeat(run_id, c.steps)
            ids.append(run_id)
    return ids
