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
  ``engine.analysis.method_frames.step_time_frame``);

and, for the claims that name them in ``Claim.options``, ``timings`` (each run's own
step times and whether it shared its machine, ``engine.analysis.method_frames.run_time_frame``)
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

Claims (a) and (b) compare two estimators' dW variance V, MSE M and squared bias b²
(relative to ‖dW‖², ``engine.analysis.diagnostics``: V = 1/(K−1) Σ_k ‖e_k − ē‖²,
M = (1/K) Σ_k ‖e_k‖², b² = M − V over K sketch keys, e_k = d̂W_k − dW) on the same
states, batches and keys. A diagnosis stores every key's values
(``engine.analysis.keystats``), and estimators that differ in one component share their
keys, so each ratio V₁/V₂ and M₁/M₂ is a ratio of two paired per-key means, and its
95 % interval comes from the per-key values: by default the delta method with a t
quantile (``INTERVAL``, ``keystats.ratio_interval``; the BCa bootstrap over keys is the
other choice); the diagnoses j that hold both estimators at an (R, λ) are pooled, their
keys combined as independent strata. The bias half of (b) reads θ = (b₁² − b₂²)/M₂, the
bias² the scalars add as a share of the MSE without them, with its per-key delta-method
t interval (``keystats.bias_interval``). Each verdict names the interval it used.

Diagnoses stored before per-key values (``key_values`` None) keep the old intervals,
marked as bounds: if e_k ~ N(b, Σ) with tr Σ = V,

    Var V = 2 tr(Σ²)/(K−1) ≤ 2 V²/(K−1),
    Var M = (2 tr(Σ²) + 4 bᵀΣb)/K ≤ (2 V² + 4 max(b², 0) V)/K,

by tr(Σ²) ≤ (tr Σ)² and bᵀΣb ≤ ‖b‖² tr Σ (equality only when Σ has rank one, so these
are 5–8× too wide for errors that spread over many directions), pooled over diagnoses
as (``pooled_variance``, ``pooled_mse``)::

    V̄ = Σ_j (K_j−1) V_j / Σ_j (K_j−1),   Var V̄ / V̄² = 2/ν,   ν = (Σ_j (K_j−1) V_j)² / Σ_j (K_j−1) V_j²
    M̄ = Σ_j K_j M_j / Σ_j K_j,           Var M̄ = Σ_j K_j (2 V_j² + 4 max(b_j², 0) V_j) / (Σ_j K_j)²

and the ratio's interval x₁/x₂ · exp(± z √(Var x₁/x₁² + Var x₂/x₂²)), z = Φ⁻¹(0.975)
(``ratio``); the bias half uses the stored bias2_se, also a bound.

A ratio is "lower" when its interval lies below 1, "higher" when above, else "within
noise"; for (b)'s variance, "no effect" when the interval lies inside
[1 − NO_EFFECT_MARGIN, 1/(1 − NO_EFFECT_MARGIN)]. The added bias is "a little" when its
interval lies below BIAS_MARGIN, "not a little" when above. (a) leaves out every rank
where balanced and uniform hashing are the same distribution (R = 1,
``engine.sketch.basis.hashings_agree``) and ranks where both are exact. A claim
supported only when every group is significantly lower is an intersection–union test,
so it keeps the 95 % level however many groups there are; a contradiction is read per
group at 95 %, not corrected for the number of groups.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, NamedTuple, TypeVar

import numpy as np
import pandas as pd
from scipy import stats

from engine.analysis import keystats
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
from engine.sketch.basis import hashings_agree

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
INTERVAL = keystats.DELTA  # how (a) and (b) make intervals from per-key values (or keystats.BOOTSTRAP)
NO_EFFECT_MARGIN = 0.05  # (b): a variance ratio inside [0.95, 1/0.95] is no effect
BIAS_MARGIN = 0.10  # (b): added bias² below 10 % of the MSE without scalars is "a little"
NO_EFFECT, LITTLE, NOT_LITTLE = "no effect", "a little", "not a little"
KEY_VALUES = keystats.KEY_VALUES
BOUND_TEXT = "bound: diagnoses without per-key values, worst-case Gaussian variance"

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
    """x₁/x₂, its 95 % interval, what the interval says (``LOWER``, ``HIGHER``, ``WITHIN_NOISE``,
    ``NO_EFFECT``) and how it was made (``keystats.DELTA``, ``BOOTSTRAP`` or ``BOUND``)."""

    value: float
    low: float
    high: float
    reading: str
    method: str = keystats.BOUND
    df: float = math.nan  # the t quantile's degrees of freedom (delta method)

    def text(self) -> str:
        return f"{self.value:.3g} [{self.low:.3g}, {self.high:.3g}] {self.reading}"


def _reading(low: float, high: float, margin: float | None = None) -> str:
    """LOWER / HIGHER when [low, high] lies below / above 1; with ``margin``, NO_EFFECT when it
    lies inside [1 − margin, 1/(1 − margin)]; else WITHIN_NOISE."""
    if high < 1:
        return LOWER
    if low > 1:
        return HIGHER
    if margin is not None and low >= 1 - margin and high <= 1 / (1 - margin):
        return NO_EFFECT
    return WITHIN_NOISE


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


def _degenerate(first: float, second: float, method: str) -> Ratio | None:
    """A zero x (every key gave the same dW) has no noise: 0 / x₂ is lower, x₁ / 0 higher."""
    if first > 0 and second > 0:
        return None
    if first <= 0 and second <= 0:
        return Ratio(math.nan, math.nan, math.nan, WITHIN_NOISE, method)
    r = 0.0 if first <= 0 else math.inf
    return Ratio(r, r, r, LOWER if r == 0 else HIGHER, method)


def ratio(first: Pooled, second: Pooled, margin: float | None = None) -> Ratio:
    """The bound interval of an old diagnosis: x₁/x₂ · exp(± Z √(Var log x₁ + Var log x₂))
    (module docstring); read with ``margin`` as in ``_reading``."""
    zero = _degenerate(first.value, second.value, keystats.BOUND)
    if zero is not None:
        return zero
    r, half = first.value / second.value, Z * math.sqrt(first.log_var + second.log_var)
    low, high = r * math.exp(-half), r * math.exp(half)
    return Ratio(r, low, high, _reading(low, high, margin), keystats.BOUND)


def key_ratio(first, second, strata=None, margin: float | None = None, method: str = INTERVAL) -> Ratio:
    """The ratio of the means of paired per-key values and its interval from them
    (``keystats.ratio_interval``), read with ``margin`` as in ``_reading``."""
    zero = _degenerate(float(np.mean(first)), float(np.mean(second)), method)
    if zero is not None:
        return zero
    iv = keystats.ratio_interval(first, second, confidence=CONFIDENCE, method=method, strata=strata)
    return Ratio(iv.value, iv.low, iv.high, _reading(iv.low, iv.high, margin), method, iv.df)


class Compared(NamedTuple):
    """One (R, λ) of an estimator pair: the pooled moments of each, their ratios, the
    added bias² (θ = (b₁² − b₂²)/M₂ with its interval), the diagnoses behind them."""

    rank: int
    lam: float
    bias2: tuple[float, float]  # keys-weighted like M̄
    variance: tuple[Pooled, Pooled]
    mse: tuple[Pooled, Pooled]
    variance_ratio: Ratio
    mse_ratio: Ratio
    diagnoses: int
    keys: tuple[int, ...]
    added_bias: keystats.Interval | None = None
    interval: str = ""  # how the intervals were made, in words

    def name(self) -> str:
        return f"R={self.rank}{_lam_text(self.lam)}"


def _pooled_rows(diagnoses: pd.DataFrame) -> pd.DataFrame:
    """The pooled-layer rows with keys (at least 2: a variance needs two draws), λ rounded."""
    if diagnoses is None or diagnoses.empty:
        return pd.DataFrame(columns=DIAGNOSIS_COLUMNS)
    d = diagnoses[diagnoses["layer"] == POOLED_LAYER].copy()
    d["lam"] = d["lam"].astype(float).round(12)
    d["keys"] = pd.to_numeric(d["keys"], errors="coerce").astype(float)
    if KEY_VALUES not in d.columns:
        d[KEY_VALUES] = None
    return d[d["keys"] >= 2]


def _bound_bias(g: pd.DataFrame, mse2: float) -> keystats.Interval:
    """θ from stored bias² and their bound standard errors (old diagnoses), keys-weighted;
    without a stored ``bias2_se``, the same bound from b², V and K: √(4 max(b², 0) V/K + 2 V²/K²)."""
    se = []
    for i in (1, 2):
        k, b2, v = (g[f"{c}_{i}"].to_numpy(float) for c in ("keys", "bias2", "variance"))
        stored = g[f"bias2_se_{i}"].to_numpy(float) if f"bias2_se_{i}" in g else np.full(len(g), np.nan)
        each = np.where(np.isnan(stored), np.sqrt(4 * np.maximum(b2, 0) * v / k + 2 * v**2 / k**2), stored)
        se.append(math.sqrt(float(np.sum((k * each) ** 2))) / float(np.sum(k)))
    k1, k2 = g["keys_1"].to_numpy(float), g["keys_2"].to_numpy(float)
    b1 = float(np.sum(k1 * g["bias2_1"]) / np.sum(k1))
    b2 = float(np.sum(k2 * g["bias2_2"]) / np.sum(k2))
    theta, half = (b1 - b2) / mse2, Z * math.hypot(*se) / mse2
    return keystats.Interval(theta, theta - half, theta + half, keystats.BOUND)


T = TypeVar("T")


def _pair(of: Callable[[int], T]) -> tuple[T, T]:
    """(``of(1)``, ``of(2)``): a quantity of the first and of the second estimator."""
    return of(1), of(2)


def _compared(diagnoses: pd.DataFrame, first: str, second: str, margin: float | None = None) -> list[Compared]:
    """Each (R, λ) at which some stored diagnoses hold both ``first`` and ``second``,
    pooled over those diagnoses (module docstring), by λ then R; the variance ratio read
    with ``margin``. Per-key intervals where every diagnosis behind a group kept its
    per-key values with equal K for both estimators, else the bounds."""
    rows = _pooled_rows(diagnoses)
    a, b = rows[rows["estimator"] == first], rows[rows["estimator"] == second]
    both = a.merge(b, on=["diagnosis_id", "rank", "lam"], suffixes=("_1", "_2"))
    out = []
    for (lam, rank), g in both.groupby(["lam", "rank"], sort=True):
        var = _pair(lambda i: pooled_variance(g[f"variance_{i}"], g[f"keys_{i}"]))
        mse = _pair(lambda i: pooled_mse(g[f"mse_{i}"], g[f"bias2_{i}"], g[f"variance_{i}"], g[f"keys_{i}"]))
        bias2 = _pair(lambda i: float(np.sum(g[f"keys_{i}"] * g[f"bias2_{i}"]) / np.sum(g[f"keys_{i}"])))
        keys = tuple(sorted({int(k) for i in (1, 2) for k in g[f"keys_{i}"]}))
        values = [(v1, v2) for v1, v2 in zip(g[f"{KEY_VALUES}_1"], g[f"{KEY_VALUES}_2"])]
        paired = all(isinstance(v1, np.ndarray) and isinstance(v2, np.ndarray) and v1.shape == v2.shape
                     for v1, v2 in values)
        if paired:
            p1 = [keystats.per_key(v1) for v1, _ in values]
            p2 = [keystats.per_key(v2) for _, v2 in values]
            pk1, pk2 = (keystats.PerKey(*(np.concatenate([getattr(p, f) for p in ps]) for f in keystats.PerKey._fields))
                        for ps in (p1, p2))
            strata = np.repeat(np.arange(len(p1)), [p.keys for p in p1])
            var_ratio = key_ratio(pk1.variance, pk2.variance, strata, margin)
            mse_ratio = key_ratio(pk1.mse, pk2.mse, strata)
            added = (keystats.bias_interval(pk1, pk2, confidence=CONFIDENCE, strata=strata)
                     if pk2.mse.mean() > 0 else None)
            how = (f"per-key delta method, t with {var_ratio.df:.0f} df" if INTERVAL == keystats.DELTA
                   else f"BCa bootstrap over {len(strata)} keys; bias by the per-key delta method")
        else:
            var_ratio, mse_ratio = ratio(*var, margin=margin), ratio(*mse)
            added = _bound_bias(g, mse[1].value) if mse[1].value > 0 else None
            how = BOUND_TEXT
        out.append(Compared(int(rank), float(lam), bias2, var, mse, var_ratio, mse_ratio,
                            int(g["diagnosis_id"].nunique()), keys, added, how))
    return out


def _basis_text(groups: list[Compared]) -> str:
    counts = sorted({g.diagnoses for g in groups})
    keys = sorted({k for g in groups for k in g.keys})
    hows = list(dict.fromkeys(g.interval for g in groups))
    return (f"{'/'.join(map(str, counts))} diagnos{'is' if counts == [1] else 'es'}, {'/'.join(map(str, keys))} keys; "
            f"intervals: {' / '.join(hows)}")


def _hashing(table3: pd.DataFrame, diagnoses: pd.DataFrame, step_times: pd.DataFrame) -> tuple[str, str]:
    results = []
    for first, second in HASHING_PAIRS:
        groups = [g for g in _compared(diagnoses, first, second)
                  if not hashings_agree(g.rank) and max(g.variance[0].value, g.variance[1].value) > EXACT_VARIANCE]
        if not groups:
            results.append((NOT_MEASURED, ""))
            continue
        verdict = _combine([(LOWERING[g.variance_ratio.reading], "") for g in groups])[0]
        parts = [f"{g.name()} {g.variance[0].value:.3g} vs {g.variance[1].value:.3g}, ratio {g.variance_ratio.text()}"
                 for g in groups]
        results.append((verdict, f"variance {first} vs {second} ({_basis_text(groups)}): " + "; ".join(parts)))
    return _combine(results)


def _bias_reading(added: keystats.Interval | None) -> str:
    if added is None:
        return WITHIN_NOISE
    return LITTLE if added.high < BIAS_MARGIN else NOT_LITTLE if added.low > BIAS_MARGIN else WITHIN_NOISE


def _scalars_verdict(g: Compared) -> str:
    """(b) on one group: both halves (module docstring)."""
    variance, bias = g.variance_ratio.reading, _bias_reading(g.added_bias)
    if variance in (HIGHER, NO_EFFECT) or g.mse_ratio.reading == HIGHER or bias == NOT_LITTLE:
        return NOT_SUPPORTED
    return SUPPORTED if variance == LOWER and bias == LITTLE else INCONCLUSIVE


def _scalars(table3: pd.DataFrame, diagnoses: pd.DataFrame, step_times: pd.DataFrame) -> tuple[str, str]:
    results = []
    for first, second in SCALAR_PAIRS:
        groups = [g for g in _compared(diagnoses, first, second, margin=NO_EFFECT_MARGIN)
                  if g.variance[1].value > EXACT_VARIANCE]
        if not groups:
            results.append((NOT_MEASURED, ""))
            continue
        verdict = _combine([(_scalars_verdict(g), "") for g in groups])[0]
        parts = []
        for g in groups:
            added = g.added_bias
            bias_text = ("no interval" if added is None else
                         f"added {added.value:+.3g} [{added.low:+.3g}, {added.high:+.3g}] of the MSE without, "
                         f"{_bias_reading(added)}")
            parts.append(f"{g.name()} bias² {g.bias2[0]:.2g} vs {g.bias2[1]:.2g} ({bias_text}), variance "
                         f"{g.variance[0].value:.3g} vs {g.variance[1].value:.3g} ratio {g.variance_ratio.text()}, "
                         f"MSE {g.mse[0].value:.3g} vs {g.mse[1].value:.3g} ratio {g.mse_ratio.text()}")
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


def _keys_plan(table3: pd.DataFrame, diagnoses: pd.DataFrame, step_times: pd.DataFrame) -> str:
    """The keys a diagnosis needs to detect a variance ratio of ``keystats.PLAN_RATIO`` with
    ``keystats.PLAN_POWER`` (``keystats.keys_for_power``), and the power the stored diagnoses' K gives."""
    need = keystats.DEFAULT_KEYS
    text = (f"{need} keys per diagnosis detect a variance ratio of {keystats.PLAN_RATIO:g} with probability "
            f"{keystats.PLAN_POWER:.0%} (per-key CV {keystats.PLAN_CV:g}; python -m engine diagnose RUN --keys {need})")
    keys = pd.to_numeric(diagnoses.get("keys", pd.Series(dtype=float)), errors="coerce").dropna()
    if not keys.empty:
        k = int(keys.min())
        text += f"; the stored diagnoses' K = {k} gives {keystats.power(keystats.PLAN_RATIO, max(k, 2)):.0%}"
    return text


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
          "variance than uniform hashing at every rank and λ measured with both, for each pair measured (balanced vs "
          f"countsketch; basis vs scalars): the {100 * CONFIDENCE:g} % interval of the variance ratio V₁/V₂ lies below "
          "1. Ranks where the two hashings are the same distribution (R = 1: one bin holds every row) and ranks where "
          "both are exact are left out. The interval comes from each sketch key's ‖e − ē‖², which the two estimators "
          "share keys for (paired): the delta method of the log ratio with a t quantile (or a BCa bootstrap over "
          "keys), as the numbers say; a diagnosis stored without per-key values gives the old bound "
          f"V₁/V₂ · exp(± {Z:.2f} √(2/ν₁ + 2/ν₂)), ν = K − 1, marked 'bound'. Not supported when at some rank the "
          "interval lies above 1; inconclusive when neither (some interval holds 1, none lies above it); not measured "
          "when no diagnosis holds such a pair.", _hashing, plan=_keys_plan),
    Claim("b", "The invariant scalars trade a little bias for lower variance.",
          "(b) tests both halves against the same hashing without the scalars (scalars vs countsketch; basis vs "
          "balanced), at every rank and λ measured with both, pooled as in (a) (ranks where the estimator without "
          "scalars is exact are left out). Lower variance: the "
          f"{100 * CONFIDENCE:g} % interval of the variance ratio V₁/V₂ (as in (a); scalars on and off share S) lies "
          f"below 1; it is no effect when it lies inside [{1 - NO_EFFECT_MARGIN:g}, {1 / (1 - NO_EFFECT_MARGIN):.4g}]. "
          "A little bias: the interval of the bias² the scalars add, (b₁² − b₂²)/M₂ as a share of the MSE without "
          f"them (b² = M − V per key, delta method, t quantile), lies below {BIAS_MARGIN:g}; not a little when it "
          f"lies above {BIAS_MARGIN:g}. Supported when at every rank the variance is lower and the bias a little, "
          "and the MSE ratio's interval does not lie above 1; not supported when at some rank the variance is higher "
          "or no effect, the bias not a little, or the MSE higher; inconclusive otherwise; not measured when no "
          "diagnosis holds such a pair. Old diagnoses without per-key values use the bounds of (a) and their stored "
          "standard error of b², marked 'bound'.", _scalars, plan=_keys_plan),
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
    what would decide it; ``timings``: ``method_frames.run_time_frame`` (None: (e) is not measured);
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
