"""Step-time estimates from the lab's own history: what finished runs of the same
timing key measured (``engine.training.timing`` measures when there are none)."""

from __future__ import annotations

import statistics

import numpy as np

from engine.config import ConfigError, RunConfig
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
