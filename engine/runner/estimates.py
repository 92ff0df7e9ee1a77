"""Step-time estimates from the lab's own history: what finished runs of the same
timing key measured (``engine.training.timing`` measures when there are none), and the
estimated time of a whole grid (``grid_estimate``)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from engine.config import ConfigError, RunConfig
from engine.core.units import format_seconds
from engine.training import timing
from engine.training.timing import StepTiming, timing_key
from storage import RunStore


def timing_from_history(store: RunStore, config: RunConfig) -> StepTiming | None:
    """Step time and start-up of ``config`` from the finished runs in ``store``
    with the same timing key, or None when there are none.

    Step time: the median over those runs of B·T / median(tokens_per_s);
    start-up: the median wall time of their step-0 records.
    """
    key = timing_key(config)
    same = []
    for r in store.list_runs(statuses=["finished"]):
        try:
            if timing_key(RunConfig.from_dict(r.config)) == key:
                same.append(r.id)
        except (ConfigError, TypeError):
            continue
    if not same:
        return None
    m = store.metrics(same, names=["tokens_per_s", "val_loss"])
    tps = m[m["name"] == "tokens_per_s"].groupby("run_id")["value"].median()
    tps = tps[np.isfinite(tps) & (tps > 0)]
    if tps.empty:
        return None
    tokens = config.effective_batch_size * config.effective_seq_len
    step_s = statistics.median(tokens / v for v in tps)
    first = m[(m["name"] == "val_loss") & (m["step"] == 0)]["wall_time"]
    startup = float(first.median()) if len(first) else 0.0
    n = len(tps)
    return StepTiming(step_s=float(step_s), startup_s=startup, source=f"history ({n} run{'s' if n > 1 else ''})")


@dataclass(frozen=True)
class GridEstimate:
    """The estimated wall time of a grid (``engine.training.timing.grid_seconds``), or
    None while a model of the grid has no step time; the step times per timing key."""

    seconds: float | None
    timings: dict[tuple, StepTiming | None]

    @property
    def known(self) -> bool:
        return self.seconds is not None

    def step_ms_text(self) -> str:
        """``21 ms`` or ``21–25 ms``: the range of the grid's step times."""
        known = [t.step_s for t in self.timings.values() if t is not None]
        if not known:
            return "?"
        fast, slow = (f"{1000 * f(known):.0f}" for f in (min, max))
        return f"{fast} ms" if fast == slow else f"{fast}–{slow} ms"

    def text(self) -> str:
        """``≈ 2 h 07 min (step time 21–25 ms, timed by earlier runs)``, or what is missing."""
        if not self.known:
            return "unknown (no finished run of this model yet, and its step time was not measured)"
        return (f"≈ {format_seconds(self.seconds)} (step time {self.step_ms_text()}, "
                f"{timing.describe_sources(self.timings.values())})")


def grid_estimate(store: RunStore, configs: Sequence[RunConfig], concurrent: int = 1, *,
                  measure: bool = False) -> GridEstimate:
    """Estimate the wall time of training ``configs``, ``concurrent`` at a time: the step
    time of each distinct model from the lab's history (``timing_from_history``), else
    from an earlier measurement in this process, else (with ``measure``) measured now by
    compiling and timing its train step (``timing.measure_step``)."""
    timings: dict[tuple, StepTiming | None] = {}
    for c in configs:
        key = timing_key(c)
        if key not in timings:
            timings[key] = (timing_from_history(store, c) or timing.measured(c)
                            or (timing.measure_step(c) if measure else None))
    each = [t for c in configs if (t := timings[timing_key(c)]) is not None]
    seconds = timing.grid_seconds(configs, each, concurrent) if configs and len(each) == len(configs) else None
    return GridEstimate(seconds, timings)
