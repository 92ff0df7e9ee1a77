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
  ``engine.analysis.frames.step_time_frame``);

and, for the claims that name them in ``Claim.options``, ``timings`` (each run's own
step times and whether it shared its machine, ``engine.analysis.frames.run_time_frame``)
and ``margin`` (δ, the equivalence margin of a Δ val, ``engine.core.stats.MARGIN``).

A verdict also says what would decide it (``Verdict.power``): the seeds (or runs) that
reach 80 % power at the spread observed (a stated prior when nothing is observed).

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

from engine.core.stats import (
    CONFIDENCE,
    EQUIVALENCE_ALPHA,
    MARGIN,
    POWER,
    PRIOR_DELTA_SD,
    WITHIN_NOISE,
    seeds_needed,
    slope,
    slope_runs_needed,
    tost_power,
)

SUPPORTED, INCONCLUSIVE, NOT_SUPPORTED, NOT_MEASURED = "supported", "inconclusive", "not supported", "not measured"
VERDICTS = (SUPPORTED, INCONCLUSIVE, NOT_SUPPORTED, NOT_MEASURED)
LOWER, HIGHER = "lower", "higher"  # a ratio's interval below / above 1 (else WITHIN_NOISE)
LOWERING = {LOWER: SUPPORTED, WITHIN_NOISE: INCONCLUSIVE, HIGHER: NOT_SUPPORTED}  # a claim that x₁ < x₂, by its ratio
Z = float(stats.norm.ppf(0.5 + CONFIDENCE / 2))  # the two-sided normal quantile of CONFIDENCE

MATCH_RANK = 32  # claim (c): the rank said to match exact backprop
MATCH_DELTA = MARGIN  # claim (c): the default δ; a Δ val whose 90 % interval lies inside ±δ is a match
MEMORY_FALL = 0.01  # claim (d): the smallest R saves at least this share of exact's bytes less than the largest R
TIME_FALL = 0.05  # claim (e): a fall in step time across the ranks below this share of the largest R's is none
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
    rule: str | Callable[[float], str]  # a callable takes the margin δ
    judge: Callable[..., tuple[str, str]]  # (table3, diagnoses, step_times, **options) -> (verdict, evidence)
    options: tuple[str, ...] = ()  # keyword arguments of ``judge`` beyond the three tables (``timings``, ``margin``)
    plan: Callable[..., str] | None = None  # (table3, diagnoses, step_times, **options) -> what would decide it

    def rule_text(self, margin: float = MARGIN) -> str:
        return self.rule(margin) if callable(self.rule) else self.rule


@dataclass(frozen=True)
class Verdict:
    key: str
    sentence: str
    verdict: str
    evidence: str
    rule: str
    power: str = ""  # the seeds (or keys, runs) that would decide it at the observed spread


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


def _match_rows(table3: pd.DataFrame) -> pd.DataFrame:
    if not len(table3):
        return table3
    return table3[(table3["estimator"] == CLAIM_ESTIMATOR) & (table3["rank"] == MATCH_RANK)]


def _matches_exact(table3: pd.DataFrame, diagnoses: pd.DataFrame, step_times: pd.DataFrame, *,
                   margin: float = MATCH_DELTA) -> tuple[str, str]:
    """Each basis R = MATCH_RANK row of Table 3 (λ, setup) by its equivalence test against ±margin
    (``engine.core.stats.paired_delta``): supported when "equivalent", not supported when the
    90 % interval lies wholly beyond +δ or −δ (a one-sided 5 % test that |Δ| > δ), else inconclusive."""
    results = []
    for r in _match_rows(table3).itertuples():
        name = _group_name(f"{r.estimator} R={MATCH_RANK}", r.lam, r.setup)
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
    return _combine(results)


def _match_plan(table3: pd.DataFrame, diagnoses: pd.DataFrame, step_times: pd.DataFrame, *,
                margin: float = MATCH_DELTA) -> str:
    """The seeds TOST needs for 80 % power at the observed SD of Δ (each R = MATCH_RANK row
    with ≥ 2 paired seeds), else at ``PRIOR_DELTA_SD``."""
    parts = []
    for r in _match_rows(table3).itertuples():
        if r.paired_seeds >= 2 and pd.notna(r.delta_val_std):
            name = _group_name(f"{r.estimator} R={MATCH_RANK}", r.lam, r.setup)
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


def _timed_groups(timings: pd.DataFrame | None):
    """Per (λ, setup) of CLAIM_ESTIMATOR: (name, all its timed runs, those that trained alone)."""
    if timings is None or timings.empty:
        return []
    for name, g in _by_group(timings, "ms"):
        yield name, g, g[~g["shared"].astype(bool)]


def _step_time(table3: pd.DataFrame, diagnoses: pd.DataFrame, step_times: pd.DataFrame, *,
               timings: pd.DataFrame | None = None) -> tuple[str, str]:
    """Per (λ, setup): the least-squares slope of each lone run's median step time on R, and
    the change it gives across the ranks, C = b·(R_max − R_min), against ±TIME_FALL of the
    largest R's mean time (the rule in ``CLAIMS``)."""
    results = []
    groups = list(_timed_groups(timings))
    if not groups:
        return NOT_MEASURED, "no run has per-window step times"
    for name, g, alone in groups:
        left = len(g) - len(alone)
        left_text = (f"{left} of {len(g)} runs left out: they trained while another run used the same machine"
                     if left else "")
        if alone["rank"].nunique() < 2 or len(alone) < 3:
            why = left_text or f"{len(alone)} run(s) at {alone['rank'].nunique()} rank(s)"
            results.append((NOT_MEASURED, f"{name}: {why}; the slope needs 3 runs timed alone at 2 ranks or more"))
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
    return _combine(results)


def _time_plan(table3: pd.DataFrame, diagnoses: pd.DataFrame, step_times: pd.DataFrame, *,
               timings: pd.DataFrame | None = None) -> str:
    """Runs per rank that find a TIME_FALL change across the ranks (80 % power, 5 % two-sided)
    at the residual SD of the slope fit."""
    parts = []
    for name, g, alone in _timed_groups(timings):
        if alone["rank"].nunique() < 2 or len(alone) < 3:
            parts.append(f"{name}: time each rank alone (one run at a time on a machine), 2 or more runs per rank")
            continue
        ranks, ms = alone["rank"].to_numpy(float), alone["ms"].to_numpy(float)
        fit = slope(ranks, ms)
        detect = TIME_FALL * float(ms[ranks == ranks.max()].mean()) / float(ranks.max() - ranks.min())
        need = slope_runs_needed(ranks, fit.residual_sd, detect)
        parts.append(f"{name}: at the observed residual SD {fit.residual_sd:.3g} ms, {need} run(s) per rank timed "
                     f"alone find a {100 * TIME_FALL:g} % change with {POWER:.0%} power")
    return "; ".join(parts) or "time each rank alone (one run at a time on a machine), 2 or more runs per rank"


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
    Claim("c", f"BASIS at R = {MATCH_RANK} matches exact backprop.", lambda margin: (
          f"(c) is an equivalence claim, tested by two one-sided t-tests (TOST, each at "
          f"{100 * EQUIVALENCE_ALPHA:g} %) on Δ, the validation loss of basis at R = {MATCH_RANK} minus exact paired "
          f"over seeds (Table 3): supported when the 90 % interval of Δ lies inside ±δ, δ = {margin:g} nats; not "
          "supported when it lies wholly above +δ or wholly below −δ (|Δ| > δ at 5 %); inconclusive otherwise (more "
          f"seeds decide: see the seeds needed); not measured without a basis R = {MATCH_RANK} row with at least two "
          f"paired seeds. The default δ, {MATCH_DELTA:g} nats (set with --margin), is no more than exact backprop's "
          "own seed-to-seed SD of validation loss in this lab's CPU reproductions (0.01–0.026 nats): a difference "
          "inside ±δ is one that reseeding exact backprop makes."),
          _matches_exact, options=("margin",), plan=_match_plan),
    Claim("d", "Activation memory falls with R: the fewer rows a sketch keeps, the fewer bytes the backward pass holds.",
          f"(d) is supported when, for basis (each λ and setup), the bytes saved for backward never decrease as R "
          f"grows over the ranks measured, the smallest R saves at least {100 * MEMORY_FALL:g} % of exact's bytes "
          "less than the largest R, and less than exact; not supported otherwise; not measured with fewer than two "
          "ranks.", _memory,
          plan=lambda *_: "deterministic: the compiled step's bytes do not depend on the seed; one run per rank "
                          "decides it"),
    Claim("e", "Step time falls with R: a smaller sketch makes a faster train step.",
          "(e) is supported when, for basis (each λ and setup), over the runs that trained alone (a run that "
          "overlapped another on the same machine times the sharing, not the method, and is left out), the "
          "least-squares slope b of each run's median step time (over its evaluation windows, train steps only) on "
          "R gives a change across the ranks, b·(R_max − R_min), whose 95 % t-interval (n − 2 degrees of freedom) "
          f"lies above 0; not supported when its 90 % interval lies within ±{100 * TIME_FALL:g} % of the largest "
          "R's step time (no material change) or its 95 % interval lies below 0; inconclusive otherwise; not "
          "measured with fewer than 3 runs timed alone at 2 ranks or more.", _step_time, options=("timings",),
          plan=_time_plan),
)


def judge(table3: pd.DataFrame, diagnoses: pd.DataFrame | None = None,
          step_times: pd.DataFrame | None = None, *, timings: pd.DataFrame | None = None,
          margin: float = MATCH_DELTA) -> list[Verdict]:
    """The verdict of every claim in ``CLAIMS`` on the given tables (module docstring), with
    what would decide it; ``timings``: ``frames.run_time_frame`` (None: (e) is not measured);
    ``margin``: δ of claim (c)."""
    diagnoses = pd.DataFrame(columns=DIAGNOSIS_COLUMNS) if diagnoses is None else diagnoses
    step_times = pd.DataFrame(columns=STEP_TIME_COLUMNS) if step_times is None else step_times
    context = {"timings": timings, "margin": margin}
    out = []
    for c in CLAIMS:
        options = {k: context[k] for k in c.options}
        verdict, evidence = c.judge(table3, diagnoses, step_times, **options)
        power = c.plan(table3, diagnoses, step_times, **options) if c.plan is not None else ""
        out.append(Verdict(c.key, c.sentence, verdict, evidence, c.rule_text(margin), power))
    return out


def verdict_frame(verdicts: list[Verdict]) -> pd.DataFrame:
    """The claims table: claim, verdict, the numbers behind it."""
    return pd.DataFrame({"claim": [f"({v.key}) {v.sentence}" for v in verdicts],
                         "verdict": [v.verdict for v in verdicts],
                         "numbers": [v.evidence for v in verdicts]})
