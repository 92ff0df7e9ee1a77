"""The paper's claims, and the stated rules by which the stored data support them.

Each claim is a sentence, a rule (printed under the claims table of every report),
and a pure function of three tables that returns a verdict with the numbers behind it:

* ``table3``: ``engine.analysis.summary.table3`` (paired Δ vs exact, its 95 %
  t-interval, saved-for-backward bytes, per method);
* ``diagnoses``: estimator diagnosis rows (``DIAGNOSIS_COLUMNS``: per stored
  diagnosis, layer, estimator, R and λ, the squared bias, variance and MSE of dW
  relative to ‖dW‖², ``engine.analysis.diagnostics``, and the number of sketch keys K
  behind them);
* ``step_times``: the mean train-step time per method (``STEP_TIME_COLUMNS``,
  ``engine.analysis.frames.step_time_frame``).

A verdict is ``supported``, ``inconclusive``, ``not supported`` or ``not measured``.
Where a claim is checked on several groups (each λ and setup, each estimator pair and
rank), it is supported when every measured group supports it, not supported when any
measured group contradicts it, inconclusive when neither (some group is within noise,
none contradicts), and not measured when no group could be measured. The thresholds
are data (``MATCH_RANK``, ``MATCH_DELTA``, ``MEMORY_FALL``, ``TIME_FALL``,
``CONFIDENCE``), named in the rules.

Claims (a) and (b) compare two estimators' dW variance V and MSE M (relative to
‖dW‖², ``engine.analysis.diagnostics``: V = 1/(K−1) Σ_k ‖e_k − ē‖², b² = ‖ē‖² − V/K,
M = (1/K) Σ_k ‖e_k‖² = b² + V over K sketch keys, e_k = d̂W_k − dW) on the same
states and batches, with standard errors from the numbers a diagnosis stores. If the
errors are Gaussian, e_k ~ N(b, Σ) with tr Σ = V:

    Var V = 2 tr(Σ²)/(K−1) ≤ 2 V²/(K−1),
    Var M = (2 tr(Σ²) + 4 bᵀΣb)/K ≤ (2 V² + 4 max(b², 0) V)/K,

by tr(Σ²) ≤ (tr Σ)² and bᵀΣb ≤ ‖b‖² tr Σ (equality when Σ has rank one). The pooled-
layer row sums such independent terms over layers and batches, and Σ x_i² ≤ (Σ x_i)²
keeps both bounds for the sums, so they are conservative standard errors under the
Gaussian approximation (excess kurtosis of ‖e_k‖², which they do not see, would widen
the truth). The diagnoses j that hold both estimators at an (R, λ) are pooled, their
keys combined (``pooled_variance``, ``pooled_mse``)::

    V̄ = Σ_j (K_j−1) V_j / Σ_j (K_j−1),   Var V̄ / V̄² = 2/ν,   ν = (Σ_j (K_j−1) V_j)² / Σ_j (K_j−1) V_j²
    M̄ = Σ_j K_j M_j / Σ_j K_j,           Var M̄ = Σ_j K_j (2 V_j² + 4 max(b_j², 0) V_j) / (Σ_j K_j)²

(ν = K − 1 for one diagnosis, Σ_j (K_j − 1) when the V_j agree). The two estimators
draw independent keys, so by the delta method log(x₁/x₂) is about normal with
variance Var x₁/x₁² + Var x₂/x₂² (``ratio``), and its 95 % interval is

    x₁/x₂ · exp(± z · √(Var x₁/x₁² + Var x₂/x₂²)),   z = Φ⁻¹(0.975) ≈ 1.96;

for two variances, x₁/x₂ · exp(± z √(2/ν₁ + 2/ν₂)). The ratio is "lower" when the
interval lies below 1, "higher" when above, else "within noise". A claim supported
only when every group is significantly lower is an intersection–union test, so it
keeps the 95 % level however many groups there are; a contradiction is read per group
at 95 %, not corrected for the number of groups.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, NamedTuple

import numpy as np
import pandas as pd
from scipy import stats

from engine.core.stats import CONFIDENCE, WITHIN_NOISE

SUPPORTED, INCONCLUSIVE, NOT_SUPPORTED, NOT_MEASURED = "supported", "inconclusive", "not supported", "not measured"
VERDICTS = (SUPPORTED, INCONCLUSIVE, NOT_SUPPORTED, NOT_MEASURED)
LOWER, HIGHER = "lower", "higher"  # a ratio's interval below / above 1 (else WITHIN_NOISE)
LOWERING = {LOWER: SUPPORTED, WITHIN_NOISE: INCONCLUSIVE, HIGHER: NOT_SUPPORTED}  # a claim that x₁ < x₂, by its ratio
Z = float(stats.norm.ppf(0.5 + CONFIDENCE / 2))  # the two-sided normal quantile of CONFIDENCE

MATCH_RANK = 32  # claim (c): the rank said to match exact backprop
MATCH_DELTA = 0.02  # claim (c): |Δ val loss| below this many nats/token is a match
MEMORY_FALL = 0.01  # claim (d): the smallest R saves at least this share of exact's bytes less than the largest R
TIME_FALL = 0.05  # claim (e): the smallest R's step is at least this much faster than the largest R's
CLAIM_ESTIMATOR = "basis"  # claims (c)–(e) are about BASIS
POOLED_LAYER = "all"  # the diagnosis row that pools every sketched layer
HASHING_PAIRS = (("balanced", "countsketch"), ("basis", "scalars"))  # (balanced hashing, uniform hashing), same scalars
SCALAR_PAIRS = (("scalars", "countsketch"), ("basis", "balanced"))  # (with scalars, without), same hashing
EXACT_VARIANCE = 1e-12  # a variance this small is an exact sketch (R = B·T with balanced hashing)

DIAGNOSIS_COLUMNS = ["diagnosis_id", "run_id", "layer", "estimator", "rank", "lam", "bias2", "variance", "mse", "keys"]
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
    verdicts = {v for v, _ in measured}
    verdict = NOT_SUPPORTED if NOT_SUPPORTED in verdicts else SUPPORTED if verdicts == {SUPPORTED} else INCONCLUSIVE
    return verdict, "; ".join(e for _, e in measured)


def _lam_text(lam) -> str:
    return f" λ={float(lam):g}" if pd.notna(lam) and float(lam) else ""


def _group_name(estimator, lam, setup) -> str:
    return f"{estimator}{_lam_text(lam)}" + (f" [{setup}]" if isinstance(setup, str) and setup else "")


# --------------------------------------------------------------------------- (a), (b): diagnoses


class Pooled(NamedTuple):
    """A moment pooled over diagnoses, and the variance of its log (module docstring)."""

    value: float
    log_var: float  # Var x / x² (delta method)


class Ratio(NamedTuple):
    """x₁/x₂, its 95 % interval and what the interval says (``LOWER``, ``HIGHER``, ``WITHIN_NOISE``)."""

    value: float
    low: float
    high: float
    reading: str

    def text(self) -> str:
        return f"{self.value:.3g} [{self.low:.3g}, {self.high:.3g}] {self.reading}"


def pooled_variance(variance, keys) -> Pooled:
    """V̄ = Σ (K_j−1) V_j / Σ (K_j−1) and Var V̄ / V̄² = 2/ν (module docstring)."""
    v, w = np.asarray(variance, float), np.asarray(keys, float) - 1
    total = float(np.sum(w * v))
    return Pooled(total / float(np.sum(w)), 2 * float(np.sum(w * v**2)) / total**2 if total > 0 else 0.0)


def pooled_mse(mse, bias2, variance, keys) -> Pooled:
    """M̄ = Σ K_j M_j / Σ K_j and Var M̄ / M̄², Var M̄ = Σ K_j (2 V_j² + 4 max(b_j², 0) V_j) / (Σ K_j)²."""
    m, b2, v, k = (np.asarray(x, float) for x in (mse, bias2, variance, keys))
    value = float(np.sum(k * m) / np.sum(k))
    var = float(np.sum(k * (2 * v**2 + 4 * np.maximum(b2, 0.0) * v)) / np.sum(k) ** 2)
    return Pooled(value, var / value**2 if value > 0 else 0.0)


def ratio(first: Pooled, second: Pooled) -> Ratio:
    """x₁/x₂ with its interval x₁/x₂ · exp(± Z √(Var log x₁ + Var log x₂)) (module docstring);
    a zero x (every key gave the same dW) has no noise: 0 / x₂ is lower, x₁ / 0 higher."""
    if first.value <= 0 or second.value <= 0:
        if first.value <= 0 and second.value <= 0:
            return Ratio(math.nan, math.nan, math.nan, WITHIN_NOISE)
        r = 0.0 if first.value <= 0 else math.inf
        return Ratio(r, r, r, LOWER if r == 0 else HIGHER)
    r, half = first.value / second.value, Z * math.sqrt(first.log_var + second.log_var)
    low, high = r * math.exp(-half), r * math.exp(half)
    return Ratio(r, low, high, LOWER if high < 1 else HIGHER if low > 1 else WITHIN_NOISE)


class Compared(NamedTuple):
    """One (R, λ) of an estimator pair: the pooled moments of each, their ratios, the diagnoses behind them."""

    rank: int
    lam: float
    bias2: tuple[float, float]  # keys-weighted like M̄
    variance: tuple[Pooled, Pooled]
    mse: tuple[Pooled, Pooled]
    variance_ratio: Ratio
    mse_ratio: Ratio
    diagnoses: int
    keys: tuple[int, ...]

    def name(self) -> str:
        return f"R={self.rank}{_lam_text(self.lam)}"


def _pooled_rows(diagnoses: pd.DataFrame) -> pd.DataFrame:
    """The pooled-layer rows with keys (at least 2: a variance needs two draws), λ rounded."""
    if diagnoses is None or diagnoses.empty:
        return pd.DataFrame(columns=DIAGNOSIS_COLUMNS)
    d = diagnoses[diagnoses["layer"] == POOLED_LAYER].copy()
    d["lam"] = d["lam"].astype(float).round(12)
    d["keys"] = pd.to_numeric(d["keys"], errors="coerce").astype(float)
    return d[d["keys"] >= 2]


def _compared(diagnoses: pd.DataFrame, first: str, second: str) -> list[Compared]:
    """Each (R, λ) at which some stored diagnoses hold both ``first`` and ``second``,
    pooled over those diagnoses (module docstring), by λ then R."""
    rows = _pooled_rows(diagnoses)
    a, b = rows[rows["estimator"] == first], rows[rows["estimator"] == second]
    both = a.merge(b, on=["diagnosis_id", "rank", "lam"], suffixes=("_1", "_2"))
    out = []
    for (lam, rank), g in both.groupby(["lam", "rank"], sort=True):
        var = tuple(pooled_variance(g[f"variance_{i}"], g[f"keys_{i}"]) for i in (1, 2))
        mse = tuple(pooled_mse(g[f"mse_{i}"], g[f"bias2_{i}"], g[f"variance_{i}"], g[f"keys_{i}"]) for i in (1, 2))
        bias2 = tuple(float(np.sum(g[f"keys_{i}"] * g[f"bias2_{i}"]) / np.sum(g[f"keys_{i}"])) for i in (1, 2))
        keys = tuple(sorted({int(k) for i in (1, 2) for k in g[f"keys_{i}"]}))
        out.append(Compared(int(rank), float(lam), bias2, var, mse, ratio(*var), ratio(*mse),
                            int(g["diagnosis_id"].nunique()), keys))
    return out


def _basis_text(groups: list[Compared]) -> str:
    counts = sorted({g.diagnoses for g in groups})
    keys = sorted({k for g in groups for k in g.keys})
    return f"{'/'.join(map(str, counts))} diagnos{'is' if counts == [1] else 'es'}, {'/'.join(map(str, keys))} keys"


def _hashing(table3: pd.DataFrame, diagnoses: pd.DataFrame, step_times: pd.DataFrame) -> tuple[str, str]:
    results = []
    for first, second in HASHING_PAIRS:
        groups = [g for g in _compared(diagnoses, first, second)
                  if max(g.variance[0].value, g.variance[1].value) > EXACT_VARIANCE]
        if not groups:
            results.append((NOT_MEASURED, ""))
            continue
        verdict = _combine([(LOWERING[g.variance_ratio.reading], "") for g in groups])[0]
        parts = [f"{g.name()} {g.variance[0].value:.3g} vs {g.variance[1].value:.3g}, ratio {g.variance_ratio.text()}"
                 for g in groups]
        results.append((verdict, f"variance {first} vs {second} ({_basis_text(groups)}): " + "; ".join(parts)))
    return _combine(results)


def _scalars(table3: pd.DataFrame, diagnoses: pd.DataFrame, step_times: pd.DataFrame) -> tuple[str, str]:
    results = []
    for first, second in SCALAR_PAIRS:
        groups = [g for g in _compared(diagnoses, first, second) if g.variance[1].value > EXACT_VARIANCE]
        if not groups:
            results.append((NOT_MEASURED, ""))
            continue
        verdict = _combine([(NOT_SUPPORTED if g.mse_ratio.reading == HIGHER else LOWERING[g.variance_ratio.reading], "")
                            for g in groups])[0]
        parts = [f"{g.name()} bias² {g.bias2[0]:.2g} vs {g.bias2[1]:.2g}, variance {g.variance[0].value:.3g} vs "
                 f"{g.variance[1].value:.3g} ratio {g.variance_ratio.text()}, MSE {g.mse[0].value:.3g} vs "
                 f"{g.mse[1].value:.3g} ratio {g.mse_ratio.text()}" for g in groups]
        results.append((verdict, f"{first} vs {second} ({_basis_text(groups)}): " + "; ".join(parts)))
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
          "(a) is supported when, in the stored estimator diagnoses (all sketched layers pooled; the diagnoses that "
          "hold both estimators of a pair pooled, their keys combined), balanced hashing has a significantly lower dW "
          "variance than uniform hashing at every rank and λ measured with both (ranks where both are exact are left out), for each pair "
          f"measured (balanced vs countsketch; basis vs scalars): the {100 * CONFIDENCE:g} % interval of the variance ratio, "
          f"V₁/V₂ · exp(± {Z:.2f} √(2/ν₁ + 2/ν₂)) with ν = K − 1 for one diagnosis of K keys and "
          "ν = (Σ (Kⱼ − 1) Vⱼ)² / Σ (Kⱼ − 1) Vⱼ² for several (the Gaussian approximation of a sample variance, "
          "conservative: Var V ≤ 2V²/(K − 1)), lies below 1; not supported when "
          "at some rank it lies above 1; inconclusive when neither (some interval holds 1, none lies above it); not "
          "measured when no diagnosis holds such a pair.", _hashing),
    Claim("b", "The invariant scalars trade a little bias for lower variance.",
          "(b) is supported when, in the stored diagnoses (pooled as in (a)), the estimator with the scalars has a "
          "significantly lower variance (the interval of (a) below 1) and an MSE not significantly higher (the "
          f"{100 * CONFIDENCE:g} % interval of the MSE ratio, M₁/M₂ · exp(± {Z:.2f} √(s₁² + s₂²)) with "
          "s² = (2V² + 4·max(b², 0)·V) / (K·M²) for one diagnosis of K keys (M keys-weighted over several), the "
          "Gaussian bound on Var M / M², does not lie above 1) than the "
          "same hashing without them, at every rank and λ measured with both (scalars vs countsketch; basis vs "
          "balanced; ranks where the estimator without scalars is exact are left out); not supported when at some "
          "rank its variance or MSE is significantly higher; inconclusive otherwise (some variance ratio within "
          "noise); not measured when no diagnosis holds such a pair.", _scalars),
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
