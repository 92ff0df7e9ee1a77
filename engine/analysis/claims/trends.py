"""Claims (d) and (e), trends in R: the bytes saved for backward and the step time of BASIS
against the rank, per λ and setup, and the runs that would decide (e)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from engine.analysis.claims.verdicts import (
    CLAIM_ESTIMATOR,
    INCONCLUSIVE,
    NOT_MEASURED,
    NOT_SUPPORTED,
    SUPPORTED,
    combine,
    group_name,
)
from engine.core.stats import POWER, slope, slope_runs_needed

MEMORY_FALL = 0.01  # claim (d): the smallest R saves at least this share of exact's bytes less than the largest R
TIME_FALL = 0.05  # claim (e): a fall in step time across the ranks below this share of the largest R's is none
ALONE = ("time each rank alone (one run at a time on a machine, its load within its cores), 2 or more runs per "
         "rank")


def _by_group(frame: pd.DataFrame, value: str) -> list[tuple[str, pd.DataFrame]]:
    """The CLAIM_ESTIMATOR rows with a ``value``, per (λ, setup), sorted by R."""
    if frame is None or frame.empty:
        return []
    rows = frame[(frame["estimator"] == CLAIM_ESTIMATOR) & frame[value].notna() & frame["rank"].notna()].copy()
    rows["_lam"] = rows["lam"].astype(float).fillna(0.0)
    groups = []
    for (lam, setup), g in rows.groupby(["_lam", "setup"], sort=True):
        groups.append((group_name(CLAIM_ESTIMATOR, lam, setup), g.sort_values("rank")))
    return groups


def memory(table3: pd.DataFrame, diagnoses: pd.DataFrame, step_times: pd.DataFrame) -> tuple[str, str]:
    results = []
    for name, g in _by_group(table3, "mem_saved_bytes_mean"):
        if g["rank"].nunique() < 2:
            results.append((NOT_MEASURED, f"{name}: one rank"))
            continue
        mib = g["mem_saved_bytes_mean"].to_numpy(float) / 2**20
        exact = float(g["mem_saved_bytes_exact_mean"].mean()) / 2**20
        rises = bool(np.all(np.diff(mib) >= 0))
        fall = (mib[-1] - mib[0]) / exact if exact > 0 else math.nan
        ok = rises and fall >= MEMORY_FALL and mib[0] < exact
        parts = ", ".join(f"R={int(r)} {m:.3f}" for r, m in zip(g["rank"], mib))
        results.append((SUPPORTED if ok else NOT_SUPPORTED,
                        f"{name}: saved for backward (MiB) {parts}; exact {exact:.3f}; smallest R saves "
                        f"{100 * fall:.1f} % of exact's bytes less than the largest"))
    return combine(results)


def _loaded(g: pd.DataFrame) -> pd.Series:
    """Which runs of ``g`` measured their step time while the host load exceeded the host's
    cores (``load`` > ``cores``, ``method_frames.run_time_frame``; not recorded: not loaded)."""
    if "load" not in g or "cores" not in g:
        return pd.Series(False, index=g.index)
    return (g["load"].astype(float) > g["cores"].astype(float)).fillna(False).astype(bool)


def _timed_groups(timings: pd.DataFrame | None):
    """Per (λ, setup) of CLAIM_ESTIMATOR: (name, all its timed runs, those that trained alone:
    no other run on their machine and the host load within its cores)."""
    if timings is None or timings.empty:
        return []
    for name, g in _by_group(timings, "ms"):
        yield name, g, g[~g["shared"].astype(bool) & ~_loaded(g)]


def _left_text(g: pd.DataFrame, alone: pd.DataFrame) -> str:
    """Which runs of ``g`` were left out and why: they overlapped another run on their machine,
    or their host load exceeded its cores (the highest such load shown, "load 12.3 on 2 cores")."""
    left = len(g) - len(alone)
    if not left:
        return ""
    shared, loaded = g["shared"].astype(bool), _loaded(g)
    reasons = []
    if shared.any():
        reasons.append(f"{'they' if shared.sum() == left else int(shared.sum())} trained while another run used "
                       "the same machine")
    if loaded.any():
        top = g[loaded].sort_values("load").iloc[-1]
        reasons.append(f"{'they' if loaded.sum() == left else int(loaded.sum())} trained while the host load "
                       f"exceeded its cores (load {float(top['load']):.1f} on {int(top['cores'])} cores)")
    return f"{left} of {len(g)} runs left out: " + " and ".join(reasons)


def _unmeasured(g: pd.DataFrame, alone: pd.DataFrame) -> str | None:
    """Why the slope cannot be read on the lone runs of ``g`` (fewer than 3 at 2 ranks or more),
    "not measured (machine shared)" when the runs left out are what it lacks; None when it can."""
    if alone["rank"].nunique() >= 2 and len(alone) >= 3:
        return None
    left = _left_text(g, alone)
    if left and g["rank"].nunique() >= 2 and len(g) >= 3:
        why = f"not measured (machine shared): {left}"
    else:
        why = left or f"{len(alone)} run(s) at {alone['rank'].nunique()} rank(s)"
    return f"{why}; the slope needs 3 runs timed alone at 2 ranks or more"


def step_time(table3: pd.DataFrame, diagnoses: pd.DataFrame, step_times: pd.DataFrame, *,
               timings: pd.DataFrame | None = None) -> tuple[str, str]:
    """Per (λ, setup): the least-squares slope of each lone run's median step time on R, and
    the change it gives across the ranks, C = b·(R_max − R_min), against ±TIME_FALL of the
    largest R's mean time (the rule in ``CLAIMS``). A lone run had its machine to itself: no
    other stored run overlapped it there, and its host load was within the host's cores; when
    the runs left out are what the slope lacks, the group reads "not measured (machine shared)"
    with the load shown."""
    results = []
    groups = list(_timed_groups(timings))
    if not groups:
        return NOT_MEASURED, "no run has per-window step times"
    for name, g, alone in groups:
        left_text = _left_text(g, alone)
        if (why := _unmeasured(g, alone)) is not None:
            results.append((NOT_MEASURED, f"{name}: {why}"))
            continue
        ranks, ms = alone["rank"].to_numpy(float), alone["ms"].to_numpy(float)
        fit = slope(ranks, ms)
        span = float(ranks.max() - ranks.min())
        top = float(ms[ranks == ranks.max()].mean())
        band = TIME_FALL * top
        change = (fit.slope * span, fit.low * span, fit.high * span, fit.low90 * span, fit.high90 * span)
        if -band < change[3] and change[4] < band:
            verdict = NOT_SUPPORTED  # no material change: the 90 % interval lies within ±TIME_FALL
        elif change[1] > 0:
            verdict = SUPPORTED
        elif change[2] < 0:
            verdict = NOT_SUPPORTED
        else:
            verdict = INCONCLUSIVE
        per_rank = ", ".join(f"R={int(r)} {x['ms'].mean():.2f} ({len(x)} run{'s' if len(x) > 1 else ''}, windows "
                             f"{x['ms_low'].min():.1f}–{x['ms_high'].max():.1f})" for r, x in alone.groupby("rank"))
        results.append((verdict, f"{name}: ms per step {per_rank}; slope {fit.slope:+.3g} ms per unit R "
                                 f"[{fit.low:+.3g}, {fit.high:+.3g}], so R={int(ranks.min())}→{int(ranks.max())} adds "
                                 f"{change[0]:+.2f} ms [{change[1]:+.2f}, {change[2]:+.2f}] (90 % [{change[3]:+.2f}, "
                                 f"{change[4]:+.2f}] vs ±{band:.2f}, {100 * TIME_FALL:g} % of R={int(ranks.max())}'s)"
                                 + (f"; {left_text}" if left_text else "")))
    return combine(results)


def time_plan(table3: pd.DataFrame, diagnoses: pd.DataFrame, step_times: pd.DataFrame, *,
               timings: pd.DataFrame | None = None) -> str:
    """Runs per rank that find a TIME_FALL change across the ranks (80 % power, 5 % two-sided)
    at the residual SD of the slope fit."""
    parts = []
    for name, g, alone in _timed_groups(timings):
        if alone["rank"].nunique() < 2 or len(alone) < 3:
            parts.append(f"{name}: {ALONE}")
            continue
        ranks, ms = alone["rank"].to_numpy(float), alone["ms"].to_numpy(float)
        fit = slope(ranks, ms)
        detect = TIME_FALL * float(ms[ranks == ranks.max()].mean()) / float(ranks.max() - ranks.min())
        need = slope_runs_needed(ranks, fit.residual_sd, detect)
        parts.append(f"{name}: at the observed residual SD {fit.residual_sd:.3g} ms, {need} run(s) per rank timed "
                     f"alone find a {100 * TIME_FALL:g} % change with {POWER:.0%} power")
    return "; ".join(parts) or ALONE
