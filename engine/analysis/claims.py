"""The paper's claims, and the stated rules by which the stored data support them.

Each claim is a sentence, a rule (printed under the claims table of every report),
and a pure function of three tables that returns a verdict with the numbers behind it:

* ``table3``: ``engine.analysis.summary.table3`` (paired Δ vs exact, its 95 %
  t-interval, saved-for-backward bytes, per method);
* ``diagnoses``: estimator diagnosis rows (``DIAGNOSIS_COLUMNS``: per stored
  diagnosis, layer, estimator, R and λ, the squared bias, variance and MSE of dW
  relative to ‖dW‖², ``engine.analysis.diagnostics``);
* ``step_times``: the mean train-step time per method (``STEP_TIME_COLUMNS``,
  ``engine.analysis.frames.step_time_frame``).

A verdict is ``supported``, ``not supported`` or ``not measured``. Where a claim is
checked on several groups (each λ and setup, each estimator pair), it is supported
when every measured group supports it, not supported when any measured group does
not, and not measured when no group could be measured. The thresholds are data
(``MATCH_RANK``, ``MATCH_DELTA``, ``MEMORY_FALL``, ``TIME_FALL``), named in the rules.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pandas as pd
from scipy import stats

SUPPORTED, NOT_SUPPORTED, NOT_MEASURED = "supported", "not supported", "not measured"
VERDICTS = (SUPPORTED, NOT_SUPPORTED, NOT_MEASURED)

MATCH_RANK = 32  # claim (c): the rank said to match exact backprop
MATCH_DELTA = 0.02  # claim (c): |Δ val loss| below this many nats/token is a match
MEMORY_FALL = 0.01  # claim (d): the smallest R saves at least this share of exact's bytes less than the largest R
TIME_FALL = 0.05  # claim (e): the smallest R's step is at least this much faster than the largest R's
CLAIM_ESTIMATOR = "basis"  # claims (c)–(e) are about BASIS
POOLED_LAYER = "all"  # the diagnosis row that pools every sketched layer
HASHING_PAIRS = (("balanced", "countsketch"), ("basis", "scalars"))  # (balanced hashing, uniform hashing), same scalars
SCALAR_PAIRS = (("scalars", "countsketch"), ("basis", "balanced"))  # (with scalars, without), same hashing
EXACT_VARIANCE = 1e-12  # a variance this small is an exact sketch (R = B·T with balanced hashing)

DIAGNOSIS_COLUMNS = ["diagnosis_id", "run_id", "layer", "estimator", "rank", "lam", "bias2", "variance", "mse"]
STEP_TIME_COLUMNS = ["estimator", "rank", "lam", "setup", "seeds", "mean", "std"]


@dataclass(frozen=True)
class Claim:
    """One of the paper's claims: a key (``a``–``e``), its sentence and its rule."""

    key: str
    sentence: str
    rule: str
    judge: Callable[[pd.DataFrame, pd.DataFrame, pd.DataFrame], tuple[str, str]]


@dataclass(frozen=True)
class Verdict:
    key: str
    sentence: str
    verdict: str
    evidence: str
    rule: str


def _combine(results: list[tuple[str, str]]) -> tuple[str, str]:
    """(verdict, evidence) of a claim from those of its groups (module docstring)."""
    measured = [r for r in results if r[0] != NOT_MEASURED]
    if not measured:
        return NOT_MEASURED, "; ".join(e for _, e in results if e) or "no data"
    verdict = SUPPORTED if all(v == SUPPORTED for v, _ in measured) else NOT_SUPPORTED
    return verdict, "; ".join(e for _, e in measured)


def _lam_text(lam) -> str:
    return f" λ={float(lam):g}" if pd.notna(lam) and float(lam) else ""


def _group_name(estimator, lam, setup) -> str:
    return f"{estimator}{_lam_text(lam)}" + (f" [{setup}]" if isinstance(setup, str) and setup else "")


# --------------------------------------------------------------------------- (a), (b): diagnoses


def _pooled_means(diagnoses: pd.DataFrame) -> pd.DataFrame:
    """Mean over the stored diagnoses of the pooled-layer rows, per (estimator, R, λ)."""
    if diagnoses is None or diagnoses.empty:
        return pd.DataFrame(columns=["estimator", "rank", "lam", "bias2", "variance", "mse", "n"])
    d = diagnoses[diagnoses["layer"] == POOLED_LAYER].copy()
    d["lam"] = d["lam"].astype(float).round(12)
    return (d.groupby(["estimator", "rank", "lam"], as_index=False)
            .agg(bias2=("bias2", "mean"), variance=("variance", "mean"), mse=("mse", "mean"),
                 n=("diagnosis_id", "nunique")))


def _pairs(diagnoses: pd.DataFrame, pairs) -> list[tuple[str, str, pd.DataFrame]]:
    """For each (first, second) estimator pair: the (R, λ) both were measured at, with
    ``_first``/``_second`` columns of the pooled means."""
    means = _pooled_means(diagnoses)
    out = []
    for first, second in pairs:
        a, b = means[means["estimator"] == first], means[means["estimator"] == second]
        both = a.merge(b, on=["rank", "lam"], suffixes=("_first", "_second")).sort_values(["lam", "rank"])
        out.append((first, second, both))
    return out


def _hashing(table3: pd.DataFrame, diagnoses: pd.DataFrame, step_times: pd.DataFrame) -> tuple[str, str]:
    results = []
    for first, second, both in _pairs(diagnoses, HASHING_PAIRS):
        if both.empty:
            results.append((NOT_MEASURED, ""))
            continue
        lower = both["variance_first"] < both["variance_second"]
        parts = [f"R={int(r.rank)}{_lam_text(r.lam)} {r.variance_first:.3g} vs {r.variance_second:.3g}"
                 for r in both.itertuples()]
        results.append((SUPPORTED if lower.all() else NOT_SUPPORTED,
                        f"variance {first} vs {second}: " + ", ".join(parts)))
    return _combine(results)


def _scalars(table3: pd.DataFrame, diagnoses: pd.DataFrame, step_times: pd.DataFrame) -> tuple[str, str]:
    results = []
    for first, second, both in _pairs(diagnoses, SCALAR_PAIRS):
        both = both[both["variance_second"] > EXACT_VARIANCE]
        if both.empty:
            results.append((NOT_MEASURED, ""))
            continue
        trade = (both["variance_first"] < both["variance_second"]) & (both["mse_first"] <= both["mse_second"])
        parts = [f"R={int(r.rank)}{_lam_text(r.lam)} bias² {r.bias2_first:.2g} vs {r.bias2_second:.2g}, "
                 f"variance {r.variance_first:.3g} vs {r.variance_second:.3g}, MSE {r.mse_first:.3g} vs {r.mse_second:.3g}"
                 for r in both.itertuples()]
        results.append((SUPPORTED if trade.all() else NOT_SUPPORTED, f"{first} vs {second}: " + "; ".join(parts)))
    return _combine(results)


# --------------------------------------------------------------------------- (c): Table 3


def _matches_exact(table3: pd.DataFrame, diagnoses: pd.DataFrame, step_times: pd.DataFrame) -> tuple[str, str]:
    rows = table3[(table3["estimator"] == CLAIM_ESTIMATOR) & (table3["rank"] == MATCH_RANK)] if len(table3) else table3
    results = []
    for r in rows.itertuples():
        name = _group_name(f"{r.estimator} R={MATCH_RANK}", r.lam, r.setup)
        if r.paired_seeds < 2 or pd.isna(r.delta_val_ci95_low):
            results.append((NOT_MEASURED, f"{name}: {r.paired_seeds} paired seed(s), no interval"))
            continue
        includes_zero = r.delta_val_ci95_low <= 0 <= r.delta_val_ci95_high
        small = abs(r.delta_val_mean) < MATCH_DELTA
        results.append((SUPPORTED if includes_zero and small else NOT_SUPPORTED,
                        f"{name}: Δ {r.delta_val_mean:+.4f} [{r.delta_val_ci95_low:+.4f}, {r.delta_val_ci95_high:+.4f}] "
                        f"over {r.paired_seeds} seeds at step {r.step}"))
    return _combine(results)


# --------------------------------------------------------------------------- (d), (e): trends in R


def _by_group(frame: pd.DataFrame, value: str) -> list[tuple[str, pd.DataFrame]]:
    """The CLAIM_ESTIMATOR rows with a ``value``, per (λ, setup), sorted by R."""
    if frame is None or frame.empty:
        return []
    rows = frame[(frame["estimator"] == CLAIM_ESTIMATOR) & frame[value].notna() & frame["rank"].notna()].copy()
    rows["_lam"] = rows["lam"].astype(float).fillna(0.0)
    groups = []
    for (lam, setup), g in rows.groupby(["_lam", "setup"], sort=True):
        groups.append((_group_name(CLAIM_ESTIMATOR, lam, setup), g.sort_values("rank")))
    return groups


def _memory(table3: pd.DataFrame, diagnoses: pd.DataFrame, step_times: pd.DataFrame) -> tuple[str, str]:
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
    return _combine(results)


def _step_time(table3: pd.DataFrame, diagnoses: pd.DataFrame, step_times: pd.DataFrame) -> tuple[str, str]:
    results = []
    exact = step_times[step_times["estimator"] == "exact"]["mean"] if step_times is not None and len(step_times) else pd.Series(dtype=float)
    for name, g in _by_group(step_times, "mean"):
        if g["rank"].nunique() < 2:
            results.append((NOT_MEASURED, f"{name}: one rank"))
            continue
        ms = g["mean"].to_numpy(float)
        fall = 1 - ms[0] / ms[-1]
        # equal times have no rank order (ρ undefined: not a fall)
        rho = float(stats.spearmanr(g["rank"].to_numpy(float), ms).statistic) if np.ptp(ms) > 0 else math.nan
        ok = bool(fall >= TIME_FALL and rho > 0)
        parts = ", ".join(f"R={int(r)} {m:.2f}" for r, m in zip(g["rank"], ms))
        exact_text = f"; exact {exact.mean():.2f}" if len(exact) else ""
        results.append((SUPPORTED if ok else NOT_SUPPORTED,
                        f"{name}: ms per step {parts}{exact_text}; smallest R {100 * fall:.1f} % faster than the "
                        f"largest, Spearman ρ(R, time) = {rho:+.2f}"))
    return _combine(results)


CLAIMS = (
    Claim("a", "Balanced hashing lowers the variance of the dW estimate.",
          "(a) is supported when, in the stored estimator diagnoses (all sketched layers pooled, mean over diagnoses), "
          "balanced hashing has a lower dW variance than uniform hashing at every rank and λ measured with both, for "
          "each pair measured (balanced vs countsketch; basis vs scalars); not supported when at some of them it is "
          "not lower; not measured when no diagnosis holds such a pair.", _hashing),
    Claim("b", "The invariant scalars trade a little bias for lower variance.",
          "(b) is supported when, in the stored diagnoses (pooled as in (a)), the estimator with the scalars has a "
          "lower variance and an MSE no higher than the same hashing without them (the bias² it adds is smaller "
          "than the variance it removes) at every rank and λ measured with both (scalars vs countsketch; basis vs "
          "balanced; ranks where the estimator without scalars is exact are left out); not supported otherwise; not "
          "measured when no diagnosis holds such a pair.", _scalars),
    Claim("c", f"BASIS at R = {MATCH_RANK} matches exact backprop.",
          f"(c) is supported when the 95 % interval of Δ (validation loss of basis at R = {MATCH_RANK} minus exact, "
          f"paired over seeds, Table 3) includes 0 and |Δ| < {MATCH_DELTA}; not supported when the interval "
          f"excludes 0 or |Δ| ≥ {MATCH_DELTA}; not measured without a basis R = {MATCH_RANK} row with at least two "
          "paired seeds.", _matches_exact),
    Claim("d", "Activation memory falls with R: the fewer rows a sketch keeps, the fewer bytes the backward pass holds.",
          f"(d) is supported when, for basis (each λ and setup), the bytes saved for backward never decrease as R "
          f"grows over the ranks measured, the smallest R saves at least {100 * MEMORY_FALL:g} % of exact's bytes "
          "less than the largest R, and less than exact; not supported otherwise; not measured with fewer than two "
          "ranks.", _memory),
    Claim("e", "Step time falls with R: a smaller sketch makes a faster train step.",
          f"(e) is supported when, for basis (each λ and setup), the mean train-step time at the smallest R is at "
          f"least {100 * TIME_FALL:g} % below that at the largest R and the Spearman rank correlation of step time "
          "with R is positive; not supported otherwise; not measured with fewer than two ranks timed.", _step_time),
)


def judge(table3: pd.DataFrame, diagnoses: pd.DataFrame | None = None,
          step_times: pd.DataFrame | None = None) -> list[Verdict]:
    """The verdict of every claim in ``CLAIMS`` on the given tables (module docstring)."""
    diagnoses = pd.DataFrame(columns=DIAGNOSIS_COLUMNS) if diagnoses is None else diagnoses
    step_times = pd.DataFrame(columns=STEP_TIME_COLUMNS) if step_times is None else step_times
    out = []
    for c in CLAIMS:
        verdict, evidence = c.judge(table3, diagnoses, step_times)
        out.append(Verdict(c.key, c.sentence, verdict, evidence, c.rule))
    return out


def verdict_frame(verdicts: list[Verdict]) -> pd.DataFrame:
    """The claims table: claim, verdict, the numbers behind it."""
    return pd.DataFrame({"claim": [f"({v.key}) {v.sentence}" for v in verdicts],
                         "verdict": [v.verdict for v in verdicts],
                         "numbers": [v.evidence for v in verdicts]})
