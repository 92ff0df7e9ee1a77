"""Claim (c), read from Table 3: does BASIS at ``MATCH_RANK`` match exact backprop within ±δ
(TOST), and the seeds that would decide it."""

from __future__ import annotations

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
from engine.core.stats import MARGIN, POWER, PRIOR_DELTA_SD, seeds_needed, tost_power

MATCH_RANK = 32  # claim (c): the rank said to match exact backprop
MATCH_DELTA = MARGIN  # claim (c): the default δ; a Δ val whose 90 % interval lies inside ±δ is a match


def _match_rows(table3: pd.DataFrame) -> pd.DataFrame:
    if not len(table3):
        return table3
    return table3[(table3["estimator"] == CLAIM_ESTIMATOR) & (table3["rank"] == MATCH_RANK)]


def matches_exact(table3: pd.DataFrame, diagnoses: pd.DataFrame, step_times: pd.DataFrame, *,
                   margin: float = MATCH_DELTA) -> tuple[str, str]:
    """Each basis R = MATCH_RANK row of Table 3 (λ, setup) by its equivalence test against ±margin
    (``engine.core.stats.paired_delta``): supported when "equivalent", not supported when the
    90 % interval lies wholly beyond +δ or −δ (a one-sided 5 % test that |Δ| > δ), else inconclusive."""
    results = []
    for r in _match_rows(table3).itertuples():
        name = group_name(f"{r.estimator} R={MATCH_RANK}", r.lam, r.setup)
        if r.paired_seeds < 2 or pd.isna(r.delta_val_ci90_low):
            results.append((NOT_MEASURED, f"{name}: {r.paired_seeds} paired seed(s), no interval"))
            continue
        low, high = r.delta_val_ci90_low, r.delta_val_ci90_high
        if -margin < low and high < margin:  # Table 3's "equivalent" (``paired_delta``), at this margin
            verdict = SUPPORTED
        elif low > margin or high < -margin:
            verdict = NOT_SUPPORTED
        else:
            verdict = INCONCLUSIVE
        results.append((verdict, f"{name}: Δ {r.delta_val_mean:+.4f}, 90 % [{low:+.4f}, {high:+.4f}] vs ±{margin:g} "
                                 f"(TOST p = {r.tost_p:.2g}), 95 % [{r.delta_val_ci95_low:+.4f}, "
                                 f"{r.delta_val_ci95_high:+.4f}]; per seed {r.delta_val_by_seed}; "
                                 f"{r.paired_seeds} seeds at step {r.step}"))
    return combine(results)


def match_plan(table3: pd.DataFrame, diagnoses: pd.DataFrame, step_times: pd.DataFrame, *,
                margin: float = MATCH_DELTA) -> str:
    """The seeds TOST needs for 80 % power at the observed SD of Δ (each R = MATCH_RANK row
    with ≥ 2 paired seeds), else at ``PRIOR_DELTA_SD``."""
    parts = []
    for r in _match_rows(table3).itertuples():
        if r.paired_seeds >= 2 and pd.notna(r.delta_val_std):
            name = group_name(f"{r.estimator} R={MATCH_RANK}", r.lam, r.setup)
            parts.append(_seed_plan(name, int(r.paired_seeds), float(r.delta_val_std), "observed", margin))
    if not parts:
        parts.append(_seed_plan(f"{CLAIM_ESTIMATOR} R={MATCH_RANK}", 0, PRIOR_DELTA_SD, "prior", margin))
    return "; ".join(parts)


def _seed_plan(name: str, seeds: int, sd: float, source: str, margin: float) -> str:
    need = seeds_needed(sd, margin)
    have = f"{seeds} seeds give {tost_power(seeds, sd, margin):.0%}; " if seeds else ""
    want = f"{need} seeds give {POWER:.0%}" if need else f"no practical seed count reaches {POWER:.0%}"
    return (f"{name}: at the {source} Δ SD {sd:.3g}, a method that truly matches reads equivalent within ±{margin:g} "
            f"with probability: {have}{want}")
