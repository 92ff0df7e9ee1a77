"""Per-key values of an estimator diagnosis, and the intervals built from them.

A diagnosis draws K sketch keys per (layer, batch) and measures, for each key k, the
error e_k = d̂W_k − dW of an estimator (``engine.analysis.diagnostics``). What it keeps
per result row (one layer, or ``all`` of them, one estimator, R and λ) is, per batch b,
the float64 vector (``KEY_VALUES``; shape (batches, 1 + 2K))::

    [‖dW_b‖²,  s_b1 … s_bK,  d_b1 … d_bK],   s_bk = ‖e_bk‖²,  d_bk = ‖e_bk − ē_b‖²

(the ``all`` row sums the layers' vectors per batch). Every moment of the row is a mean
over keys of a per-key value, relative to N = Σ_b ‖dW_b‖² (``per_key``)::

    m_k = Σ_b s_bk / N                 M  = mean_k m_k    (MSE)
    v_k = K/(K−1) · Σ_b d_bk / N       V  = mean_k v_k    (variance, 1/(K−1) Σ_k ‖e_k − ē‖²)
    w_k = m_k − v_k                    b² = mean_k w_k    (= ‖ē‖² − V/K)

Estimators that differ in one component draw the same keys (scalars on and off share S;
balanced and uniform hashing share their signs), so the values of two estimators at the
same key index are paired, and keys of one diagnosis are independent of each other.

Intervals of a ratio Ā/B̄ of two paired per-key means (``ratio_interval``)
---------------------------------------------------------------------------
* ``delta``: log(Ā/B̄) has the influence values u_k = a_k/Ā − b_k/B̄, so

      Var log(Ā/B̄) ≈ Σ_j n_j s_j²(u) / n²,    interval  Ā/B̄ · exp(± t_{ν, (1+c)/2} · √Var),

  over diagnoses j with n_j keys each (n = Σ n_j, s_j² the sample variance of u within
  diagnosis j, ν the Welch–Satterthwaite degrees of freedom, K − 1 for one diagnosis).
  Pairing enters through u: a
  shared key that moves both estimators alike cancels.
* ``bootstrap``: ``scipy.stats.bootstrap`` over keys, ``paired``, BCa, of log(Ā/B̄)
  (several diagnoses are resampled as one pool of keys, which only widens the interval
  when the diagnoses differ).

The variance's v_k are centred on the sample mean ē, not on E e: this is the usual
O(1/K) dependence of a sample variance's terms, which the simulations of
tests/engine/test_keystats.py show the intervals absorb (coverage ≥ 93 % at K ≥ 32).

The added bias of one estimator over another, θ = (b₁² − b₂²)/M₂ (``bias_interval``),
has the influence values u_k = (w₁ₖ − w₂ₖ − θ m₂ₖ)/M₂ and the t interval θ ± t·se from
them as above. With e_k ~ (b, Σ), w_k ≈ 2⟨e_k, ē⟩ − ‖ē‖², so Var(mean w) ≈ 4 ēᵀΣē/K:
to first order 4 bᵀΣb/K, the delta method of ‖ē‖², and where b ≈ 0 about 4 tr(Σ²)/K²
against the true 2 tr(Σ²)/K², so the interval is conservative (√2 too wide) where the
bias is small.

Power: how many keys (``keys_for_power``)
-----------------------------------------
The delta interval of a ratio r reads "lower" with probability about
Φ(|log r|·√K/σ_u − t_{K−1, (1+c)/2}), σ_u the SD of u_k. With each estimator's per-key
value of relative SD (coefficient of variation) ``cv`` and correlation ρ between the
two, σ_u² = 2 cv² (1 − ρ). The smallest K with power ≥ p at ratio r solves

    (t_{K−1, (1+c)/2} + z_p) · σ_u / √K ≤ |log r|.

The default K of a diagnosis (``DEFAULT_KEYS``) is this K at r = 0.8, p = 0.8, c = 0.95,
ρ = 0 (balanced and uniform hashing share only their signs: treat them as independent)
and the planning ``PLAN_CV`` = 0.5: the spread of ‖e‖² when the error lies in about 8
equally strong directions (CV² = 2/8 for a Gaussian e), where the pooled row of a real
diagnosis, summing ≥ 2 layers × batches of errors that each spread over tens of
directions (DESIGN.md, round 4: ≈ 70 for one layer, CV of log V 0.18–0.31 per key),
spreads less. It gives K = 81.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Sequence

import numpy as np
import scipy  # scipy.stats loads on first use: a process that reads no interval starts without it
from numpy.typing import ArrayLike

KEY_VALUES = "key_values"  # the column of a diagnosis row's ``pack`` array (None: stored without)
DELTA, BOOTSTRAP, BOUND = "delta", "bootstrap", "bound"
METHODS = (DELTA, BOOTSTRAP)
BOOTSTRAP_RESAMPLES = 4999
PLAN_RATIO, PLAN_POWER, PLAN_CV = 0.8, 0.8, 0.5


class PerKey(NamedTuple):
    """One row's per-key values pooled over batches, relative to Σ_b ‖dW_b‖² (module docstring)."""

    mse: np.ndarray  # m_k
    variance: np.ndarray  # v_k
    bias2: np.ndarray  # w_k = m_k − v_k

    @property
    def keys(self) -> int:
        return len(self.mse)


class Interval(NamedTuple):
    """An estimate, its interval and how the interval was made (``method``)."""

    value: float
    low: float
    high: float
    method: str  # DELTA, BOOTSTRAP or BOUND
    df: float = math.nan  # the t quantile's degrees of freedom (delta)


def pack(dw_norm2: Sequence[float], sq: ArrayLike, dev: ArrayLike) -> np.ndarray:
    """The (batches, 1 + 2K) ``KEY_VALUES`` array of a row from per-batch ‖dW_b‖² and
    per-batch, per-key ‖e_bk‖² and ‖e_bk − ē_b‖² (each (batches, K))."""
    norm = np.asarray(dw_norm2, np.float64).reshape(-1, 1)
    sq, dev = np.atleast_2d(np.asarray(sq, np.float64)), np.atleast_2d(np.asarray(dev, np.float64))
    if sq.shape != dev.shape or sq.shape[0] != norm.shape[0]:
        raise ValueError(f"per-key arrays disagree: ‖dW‖² {norm.shape[0]} batches, ‖e‖² {sq.shape}, "
                         f"‖e − ē‖² {dev.shape}; need (batches, K) each")
    return np.concatenate([norm, sq, dev], axis=1)


def unpack(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(‖dW_b‖² (batches,), ‖e_bk‖² (batches, K), ‖e_bk − ē_b‖² (batches, K)) of a ``pack`` array."""
    values = np.atleast_2d(np.asarray(values, np.float64))
    if values.shape[1] < 5 or values.shape[1] % 2 != 1:
        raise ValueError(f"per-key values of shape {values.shape}: need (batches, 1 + 2K) with K >= 2")
    k = (values.shape[1] - 1) // 2
    return values[:, 0], values[:, 1:1 + k], values[:, 1 + k:]


def per_key(values: np.ndarray) -> PerKey:
    """m_k, v_k and w_k of a ``pack`` array (module docstring); all zero for a zero dW."""
    norm, sq, dev = unpack(values)
    k = sq.shape[1]
    total = float(norm.sum())
    scale = 1.0 / total if total > 0 else 0.0
    m = sq.sum(axis=0) * scale
    v = dev.sum(axis=0) * (k / (k - 1)) * scale
    return PerKey(m, v, m - v)


def summary(values: np.ndarray) -> dict[str, float]:
    """bias², its standard error (the SD of w_k over √K), variance and MSE of a ``pack``
    array, relative to Σ_b ‖dW_b‖²."""
    p = per_key(values)
    se = float(np.std(p.bias2, ddof=1) / math.sqrt(p.keys)) if np.ptp(p.bias2) > 0 else 0.0
    return dict(bias2=float(p.bias2.mean()), bias2_se=se, variance=float(p.variance.mean()), mse=float(p.mse.mean()))


def _strata(n: int, strata) -> list[np.ndarray]:
    labels = np.zeros(n, int) if strata is None else np.asarray(strata)
    return [np.flatnonzero(labels == s) for s in np.unique(labels)]


def _t_interval(center: float, u: np.ndarray, groups: list[np.ndarray], confidence: float) -> tuple[float, float]:
    """(half-width, df) of the t interval of a mean whose influence values are u, within groups:
    Var = Σ_j n_j s_j² / n², and the Welch–Satterthwaite df (Σ_j n_j s_j²)² / Σ_j (n_j s_j²)²/(n_j − 1),
    which is n − 1 for one group and falls towards the keys of the noisiest group."""
    n = len(u)
    parts = np.array([len(g) * np.var(u[g], ddof=1) if len(g) > 1 else 0.0 for g in groups])
    sizes = np.array([len(g) for g in groups], float)
    var = float(parts.sum()) / n**2
    keep = sizes > 1
    denominator = float(np.sum(parts[keep] ** 2 / (sizes[keep] - 1)))
    df = float(parts.sum()) ** 2 / denominator if denominator > 0 else float(max(n - len(groups), 1))
    return float(scipy.stats.t.ppf(0.5 + confidence / 2, df)) * math.sqrt(max(var, 0.0)), float(df)


def ratio_interval(first, second, *, confidence: float = 0.95, method: str = DELTA, strata=None,
                   resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0) -> Interval:
    """Ā/B̄ of paired per-key values ``first`` (a_k) and ``second`` (b_k), both means
    positive, with its ``confidence`` interval by ``method`` (module docstring).
    ``strata``: a label per key naming its diagnosis (keys of different diagnoses are
    independent); None: one diagnosis."""
    a, b = np.asarray(first, np.float64), np.asarray(second, np.float64)
    if a.shape != b.shape or a.ndim != 1 or len(a) < 2:
        raise ValueError(f"paired per-key values of shapes {a.shape} and {b.shape}: need two equal 1-D arrays of "
                         "at least 2 keys")
    mean_a, mean_b = float(a.mean()), float(b.mean())
    if mean_a <= 0 or mean_b <= 0:
        raise ValueError(f"a ratio of means needs both positive (got {mean_a:g} and {mean_b:g})")
    r = mean_a / mean_b
    if method == BOOTSTRAP:
        if np.ptp(a / mean_a - b / mean_b) == 0:  # every key gives the same ratio: no spread to resample
            return Interval(r, r, r, BOOTSTRAP)

        def log_ratio(x, y, axis=-1):
            return np.log(np.mean(x, axis=axis) / np.mean(y, axis=axis))

        res = scipy.stats.bootstrap((a, b), log_ratio, paired=True, vectorized=True, method="BCa",
                              n_resamples=resamples, confidence_level=confidence,
                              random_state=np.random.default_rng(seed))
        low, high = res.confidence_interval
        return Interval(r, float(np.exp(low)), float(np.exp(high)), BOOTSTRAP)
    if method != DELTA:
        raise ValueError(f"unknown interval method {method!r}; choose one of {', '.join(METHODS)}")
    u = a / mean_a - b / mean_b
    half, df = _t_interval(r, u, _strata(len(u), strata), confidence)
    return Interval(r, r * math.exp(-half), r * math.exp(half), DELTA, df)


def bias_interval(first: PerKey, second: PerKey, *, confidence: float = 0.95, strata=None) -> Interval:
    """θ = (b₁² − b₂²)/M₂, the bias² ``first`` adds over ``second`` as a share of the
    second's MSE, with its per-key delta-method t interval (module docstring)."""
    if first.keys != second.keys or first.keys < 2:
        raise ValueError(f"paired per-key values of {first.keys} and {second.keys} keys: need equal counts >= 2")
    m2 = float(second.mse.mean())
    if m2 <= 0:
        raise ValueError("the added bias needs a second estimator with a positive MSE")
    theta = float(first.bias2.mean() - second.bias2.mean()) / m2
    u = (first.bias2 - second.bias2 - theta * second.mse) / m2
    half, df = _t_interval(theta, u, _strata(len(u), strata), confidence)
    return Interval(theta, theta - half, theta + half, DELTA, df)


def power(ratio: float, keys: int, cv: float = PLAN_CV, correlation: float = 0.0, confidence: float = 0.95) -> float:
    """The probability that the delta interval of the ratio of two per-key means reads
    "lower" at a true ``ratio`` < 1 with ``keys`` keys (module docstring)."""
    sigma = math.sqrt(2 * cv**2 * (1 - correlation))
    if sigma == 0:
        return 1.0
    t = float(scipy.stats.t.ppf(0.5 + confidence / 2, keys - 1))
    return float(scipy.stats.norm.cdf(abs(math.log(ratio)) * math.sqrt(keys) / sigma - t))


def keys_for_power(ratio: float = PLAN_RATIO, wanted: float = PLAN_POWER, cv: float = PLAN_CV,
                   correlation: float = 0.0, confidence: float = 0.95, most: int = 1_000_000) -> int:
    """The smallest K ≥ 2 whose ``power`` at ``ratio`` is at least ``wanted`` (module docstring)."""
    if not 0 < ratio < 1 or not 0 < wanted < 1:
        raise ValueError(f"ratio {ratio} and power {wanted} must lie in (0, 1)")
    for keys in range(2, most + 1):
        if power(ratio, keys, cv, correlation, confidence) >= wanted:
            return keys
    raise ValueError(f"no K up to {most:,} reaches power {wanted} at ratio {ratio} (cv {cv})")


DEFAULT_KEYS = 81  # keys_for_power() (tests/engine/test_claims_diagnoses.py: it is the least K), written out so that no process loads scipy.stats to import this module; see "Power" in the module docstring
