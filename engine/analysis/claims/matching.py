"""Claim (c), read from Table 3: does BASIS at ``MATCH_RANK`` match exact backprop within ±δ
(TOST), and the seeds that would decide it."""

from __future__ import annotations

import math

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
from engine.analysis.summary import DIVERGED
from engine.core.stats import (
    BETTER,
    DECIDED,
    EQUIVALENCE_ALPHA,
    EQUIVALENT,
    MARGIN,
    MAX_SEEDS,
    NOT_EQUIVALENT,
    POWER,
    PRIOR_DELTA_SD,
    WORSE,
    seeds_needed,
    tost_power,
)
from engine.core.stats import INCONCLUSIVE as UNDECIDED

MATCH_RANK = 32  # claim (c): the rank said to match exact backprop
MATCH_DELTA = MARGIN  # claim (c): the default δ; a Δ val whose 90 % interval lies inside ±δ is a match


def _match_rows(table3: pd.DataFrame) -> pd.DataFrame:
    if not len(table3):
        return table3
    return table3[(table3["estimator"] == CLAIM_ESTIMATOR) & (table3["rank"] == MATCH_RANK)]


def _diverged(row) -> str:
    """The row's ``diverged`` text ("" where none, or a table from before the column)."""
    text = getattr(row, "diverged", "")
    return text if isinstance(text, str) else ""


def _claim_word(row, margin: float) -> str:
    """Claim (c)'s verdict of one Table 3 row, read from the row's own verdict word (so the table
    and the claim never disagree): "equivalent" supports it; "not equivalent" and "diverged" do
    not; "worse" and "better" do not when the non-equivalence test (|Δ| > δ, Holm-adjusted where
    the table was) rejects too, else they leave equivalence undecided (inconclusive)."""
    word = row.verdict
    if word == EQUIVALENT:
        return SUPPORTED
    if word in (NOT_EQUIVALENT, DIVERGED):
        return NOT_SUPPORTED
    if word in (WORSE, BETTER):
        noneq = row.noneq_p_holm if pd.notna(getattr(row, "noneq_p_holm", math.nan)) else row.noneq_p
        return NOT_SUPPORTED if noneq < EQUIVALENCE_ALPHA else INCONCLUSIVE
    return INCONCLUSIVE if word == UNDECIDED else NOT_MEASURED


def matches_exact(table3: pd.DataFrame, diagnoses: pd.DataFrame, step_times: pd.DataFrame, *,
                   margin: float = MATCH_DELTA) -> tuple[str, str]:
    """Each basis R = MATCH_RANK row of Table 3 (λ, setup) by its verdict word (``_claim_word``):
    supported when "equivalent", not supported when its 90 % interval lies wholly beyond ±δ (a
    one-sided 5 % test that |Δ| > δ) or the method diverged where exact did not, else
    inconclusive; not measured without an interval (fewer than two seeds, no spread, not
    trained yet)."""
    results = []
    for r in _match_rows(table3).itertuples():
        name = group_name(f"{r.estimator} R={MATCH_RANK}", r.lam, r.setup)
        verdict = _claim_word(r, margin)
        if pd.isna(r.delta_val_ci90_low) or verdict == NOT_MEASURED:
            why = f"diverged in {_diverged(r)}" if _diverged(r) else f"{r.paired_seeds} paired seed(s)"
            results.append((NOT_SUPPORTED if verdict == NOT_SUPPORTED else NOT_MEASURED,
                            f"{name}: Table 3 reads {r.verdict} ({why}), no interval at step {r.step}"))
            continue
        low, high = r.delta_val_ci90_low, r.delta_val_ci90_high
        results.append((verdict, f"{name}: Table 3 reads {r.verdict}; Δ {r.delta_val_mean:+.4f}, 90 % [{low:+.4f}, "
                                 f"{high:+.4f}] vs ±{margin:g} (TOST p = {r.tost_p:.2g}), 95 % "
                                 f"[{r.delta_val_ci95_low:+.4f}, {r.delta_val_ci95_high:+.4f}]; per seed "
                                 f"{r.delta_val_by_seed}; {r.paired_seeds} seeds at step {r.step}"
                                 + (f"; diverged in {_diverged(r)}" if _diverged(r) else "")))
    return combine(results)


def match_plan(table3: pd.DataFrame, diagnoses: pd.DataFrame, step_times: pd.DataFrame, *,
               margin: float = MATCH_DELTA) -> str:
    """What would decide claim (c), per R = MATCH_RANK row of Table 3 with ≥ 2 paired seeds, by
    that row's verdict: a decided row (``engine.core.stats.DECIDED``: equivalent, better, worse,
    not equivalent) says "decided" and no seeds; an "inconclusive" row says the seeds TOST needs
    for ``POWER`` at its own observed SD of Δ (``delta_val_std``), both if it truly matches (true
    Δ = 0) and if the true Δ is the mean observed (none when |mean| ≥ δ: no seed count shows
    equivalence there); any other row (no spread, diverged) says nothing. Without such a row
    (claim (c) not measured), the seeds that give ``POWER`` at ``PRIOR_DELTA_SD``."""
    parts = []
    for r in _match_rows(table3).itertuples():
        if r.paired_seeds < 2 or pd.isna(r.delta_val_std):
            continue
        name = group_name(f"{r.estimator} R={MATCH_RANK}", r.lam, r.setup)
        if r.verdict in DECIDED:
            parts.append(f"{name}: decided ({r.verdict}), no more seeds needed")
        elif r.verdict == UNDECIDED:
            parts.append(_undecided_plan(name, int(r.paired_seeds), float(r.delta_val_std), float(r.delta_val_mean),
                                         margin, _floor(r), _alpha(r)))
    if not parts:
        parts.append(_seed_plan(f"{CLAIM_ESTIMATOR} R={MATCH_RANK}", 0, PRIOR_DELTA_SD, "prior", margin))
    return "; ".join(parts)


def _count(seeds: int | None) -> str:
    return f"{seeds} seeds" if seeds else f"more than {MAX_SEEDS:,} seeds"


def _floor(row) -> float:
    """The validation batches' variance of the row's Δ (0 where none was measured): seeds cannot shrink it."""
    se = getattr(row, "delta_val_se_batch", math.nan)
    return float(se) ** 2 if pd.notna(se) else 0.0


def _alpha(row) -> float:
    """The level each one-sided test of the row is read at: Holm's first step over the table's tests."""
    tests = getattr(row, "holm_tests", 0)
    return EQUIVALENCE_ALPHA / int(tests) if pd.notna(tests) and int(tests) > 0 else EQUIVALENCE_ALPHA


def _undecided_plan(name: str, seeds: int, sd: float, mean: float, margin: float, floor: float = 0.0,
                    alpha: float = EQUIVALENCE_ALPHA) -> str:
    """The seeds an inconclusive row needs for ``POWER`` at its observed Δ SD ``sd``: at a true
    Δ of 0 and at the observed mean ``mean`` (``seeds_needed(..., true_delta=mean)``), with the
    validation batches' variance ``floor`` that seeds do not shrink and each test at ``alpha``."""
    def need(true_delta: float) -> str:
        return _count(seeds_needed(sd, margin, true_delta=true_delta, alpha=alpha, floor=floor))

    seen = f"if the true Δ is the {mean:+.4f} seen, "
    seen += (f"no number of seeds shows equivalence (|Δ| ≥ δ = {margin:g})" if abs(mean) >= margin else need(mean))
    terms = (f" (with the validation batches' SE {math.sqrt(floor):.3g}, which more seeds do not shrink"
             + (f", and each test at Holm's α/m = {alpha:.3g}" if alpha < EQUIVALENCE_ALPHA else "") + ")"
             if floor or alpha < EQUIVALENCE_ALPHA else "")
    return (f"{name}: inconclusive; at the observed Δ SD {sd:.3g}{terms}, {seeds} seeds give "
            f"{tost_power(seeds, sd, margin, alpha=alpha, floor=floor):.0%} power to read equivalent within "
            f"±{margin:g}, and {POWER:.0%} takes {need(0.0)} if it truly matches (true Δ 0), {seen}")


def _seed_plan(name: str, seeds: int, sd: float, source: str, margin: float) -> str:
    need = seeds_needed(sd, margin)
    have = f"{seeds} seeds give {tost_power(seeds, sd, margin):.0%}; " if seeds else ""
    want = f"{need} seeds give {POWER:.0%}" if need else f"no practical seed count reaches {POWER:.0%}"
    return (f"{name}: at the {source} Δ SD {sd:.3g}, a method that truly matches reads equivalent within ±{margin:g} "
            f"with probability: {have}{want}")
