"""Step-time estimates from the lab's own history: what finished runs of the same
timing key measured (``engine.training.timing`` measures when there are none), and the
estimated time of a whole grid (``grid_estimate``).

A sketched model whose rank has no finished run yet borrows from the finished runs of the
same model (estimator, shape, batch, optimizer) at other ranks (``timing_from_ranks``):
their step times, interpolated linearly in the effective rank between the two nearest
ranks timed (extrapolated along the line through the two nearest outside them; with one
rank timed, that rank's step time as it is). The estimate says which models it scaled so."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np

from engine.config import ConfigError, RunConfig
from engine.core.units import format_seconds
from engine.training import timing
from engine.training.timing import StepTiming, timing_key
from storage import RunStore

MISSING_NAMED = 4  # an unknown estimate names this many models without a step time, then counts the rest

Finished = list[tuple[RunConfig, int]]  # the lab's finished runs that read as RunConfigs, with their ids


def finished_runs(store: RunStore) -> Finished:
    """(config, id) of every finished run in ``store`` whose config reads as a ``RunConfig``."""
    out = []
    for r in store.runs.list_runs(statuses=["finished"]):
        try:
            out.append((RunConfig.from_dict(r.config), r.id))
        except (ConfigError, TypeError):
            continue
    return out


def _timing_of(store: RunStore, config: RunConfig, ids: Sequence[int], source: str) -> StepTiming | None:
    """Step time of ``config`` from runs ``ids`` (the median over them of B·T / median(tokens_per_s))
    and their start-up (the median wall time of their step-0 records); None without a tokens/s."""
    if not ids:
        return None
    m = store.metrics(list(ids), names=["tokens_per_s", "val_loss"])
    tps = m[m["name"] == "tokens_per_s"].groupby("run_id")["value"].median()
    tps = tps[np.isfinite(tps) & (tps > 0)]
    if tps.empty:
        return None
    tokens = config.effective_batch_size * config.effective_seq_len
    first = m[(m["name"] == "val_loss") & (m["step"] == 0)]["wall_time"]
    n = len(tps)
    return StepTiming(step_s=float(statistics.median(tokens / v for v in tps)),
                      startup_s=float(first.median()) if len(first) else 0.0,
                      source=source.format(runs=f"{n} run{'s' if n > 1 else ''}"))


def timing_from_history(store: RunStore, config: RunConfig, finished: Finished | None = None) -> StepTiming | None:
    """Step time and start-up of ``config`` from the finished runs in ``store`` (or
    ``finished``, ``finished_runs``'s answer) with the same timing key, or None when there
    are none.

    Step time: the median over those runs of B·T / median(tokens_per_s);
    start-up: the median wall time of their step-0 records.
    """
    key = timing_key(config)
    same = [i for c, i in (finished_runs(store) if finished is None else finished) if timing_key(c) == key]
    return _timing_of(store, config, same, "history ({runs})")


def _rankless(config: RunConfig) -> tuple:
    model, *rest = timing_key(config)
    return (model.replace(rank=1), *rest)


def _at_rank(rank: int, points: dict[int, StepTiming]) -> tuple[float, str]:
    """(step seconds at ``rank``, how they were had) from the step times of other ranks."""
    ranks = sorted(points)
    times = [points[r].step_s for r in ranks]
    if rank in points:  # another timing key of the same effective rank (R clipped to B·T)
        return points[rank].step_s, f"R={rank}'s step time"
    if len(ranks) == 1:
        return times[0], f"R={ranks[0]}'s step time, not scaled (one rank timed)"
    if ranks[0] < rank < ranks[-1]:
        above = next(i for i, r in enumerate(ranks) if r > rank)
        return float(np.interp(rank, ranks, times)), f"interpolated between R={ranks[above - 1]} and R={ranks[above]}"
    i, j = (0, 1) if rank < ranks[0] else (-2, -1)
    slope = (times[j] - times[i]) / (ranks[j] - ranks[i])
    nearest = ranks[i] if rank < ranks[0] else ranks[j]
    step = max(times[i if rank < ranks[0] else j] + slope * (rank - nearest), min(times) / 2)
    return step, f"extrapolated from R={ranks[i]} and R={ranks[j]}"


def timing_from_ranks(store: RunStore, config: RunConfig,
                      finished: Finished | None = None) -> tuple[StepTiming, str] | None:
    """For a sketched ``config``: (its step time scaled from the finished runs of the same model
    at other ranks, how: ``interpolated between R=8 and R=32``), or None when the lab has no
    finished run of this model at any rank (or ``config`` is exact backprop)."""
    if config.is_exact:
        return None
    want = _rankless(config)
    by_rank: dict[int, list[int]] = {}
    for c, i in finished_runs(store) if finished is None else finished:
        if not c.is_exact and _rankless(c) == want:
            by_rank.setdefault(c.effective_rank, []).append(i)
    points = {r: t for r, ids in by_rank.items() if (t := _timing_of(store, config, ids, "")) is not None}
    if not points:
        return None
    step_s, how = _at_rank(config.effective_rank, points)
    n = sum(len(by_rank[r]) for r in points)
    startup = statistics.median(t.startup_s for t in points.values())
    return StepTiming(step_s=step_s, startup_s=startup, source=f"history ({n} runs at other ranks)"), how


@dataclass(frozen=True)
class GridEstimate:
    """The estimated wall time of a grid (``engine.training.timing.grid_seconds``), or
    None while a model of the grid has no step time; the step times per timing key; the
    models whose step time was scaled from other ranks (label → how), and those with none."""

    seconds: float | None
    timings: dict[tuple, StepTiming | None]
    scaled: dict[str, str] = field(default_factory=dict)
    missing: tuple[str, ...] = ()

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

    def scaled_text(self) -> str:
        """``basis R=16: interpolated between R=8 and R=32`` for each scaled model, or ``""``."""
        return "; ".join(f"{label}: {how}" for label, how in self.scaled.items())

    def missing_text(self) -> str:
        """Why the estimate is unknown: ``no finished run of basis R=16, nor of its model at another
        rank, and no step time measured`` (the first ``MISSING_NAMED`` models, then how many more)."""
        one, shown = len(self.missing) <= 1, list(self.missing[:MISSING_NAMED])
        if len(self.missing) > MISSING_NAMED:
            shown.append(f"{len(self.missing) - MISSING_NAMED} more")
        named = ", ".join(shown) or "this model"
        return (f"no finished run of {named}, nor of {'its model' if one else 'their models'} at another rank, "
                "and no step time measured")

    def text(self) -> str:
        """``≈ 2 h 07 min (step time 21–25 ms, timed by earlier runs)``, or what is missing."""
        if not self.known:
            return f"unknown ({self.missing_text()})"
        scaled = f"; {self.scaled_text()}" if self.scaled else ""
        return (f"≈ {format_seconds(self.seconds)} (step time {self.step_ms_text()}, "
                f"{timing.describe_sources(self.timings.values())}{scaled})")


def _model_label(config: RunConfig) -> str:
    return config.method() if config.is_exact else f"{config.estimator} R={config.effective_rank}"


def grid_estimate(store: RunStore, configs: Sequence[RunConfig], concurrent: int = 1, *,
                  measure: bool = False) -> GridEstimate:
    """Estimate the wall time of training ``configs``, ``concurrent`` at a time: the step
    time of each distinct model from the lab's history (``timing_from_history``), else
    from an earlier measurement in this process, else from the lab's runs of the same model
    at other ranks (``timing_from_ranks``), else (with ``measure``) measured now by
    compiling and timing its train step (``timing.measure_step``)."""
    finished = finished_runs(store)
    timings: dict[tuple, StepTiming | None] = {}
    scaled: dict[str, str] = {}
    for c in _distinct(configs):
        timed = timing_from_history(store, c, finished) or timing.measured(c)
        if timed is None and (ranked := timing_from_ranks(store, c, finished)) is not None:
            timed, scaled[_model_label(c)] = ranked
        timings[timing_key(c)] = timed or (timing.measure_step(c) if measure else None)
    each = [t for c in configs if (t := timings[timing_key(c)]) is not None]
    seconds = timing.grid_seconds(configs, each, concurrent) if configs and len(each) == len(configs) else None
    missing = tuple(dict.fromkeys(_model_label(c) for c in configs if timings[timing_key(c)] is None))
    return GridEstimate(seconds, timings, scaled, missing)


def _distinct(configs: Iterable[RunConfig]) -> list[RunConfig]:
    """The first config of each timing key, in order."""
    first: dict[tuple, RunConfig] = {}
    for c in configs:
        first.setdefault(timing_key(c), c)
    return list(first.values())
