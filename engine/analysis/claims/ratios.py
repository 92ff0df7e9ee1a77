"""Ratios of two estimators' pooled dW moments and their 95 % intervals: from per-key values
(``keystats.ratio_interval``), or the bounds of diagnoses stored without them
(``engine.analysis.claims``: the formulas)."""

from __future__ import annotations

import math
import statistics
from typing import NamedTuple

import numpy as np

from engine.analysis import keystats
from engine.analysis.claims.verdicts import HIGHER, LOWER
from engine.core.stats import CONFIDENCE, WITHIN_NOISE

Z = statistics.NormalDist().inv_cdf(0.5 + CONFIDENCE / 2)  # the two-sided normal quantile of CONFIDENCE
INTERVAL = keystats.DELTA  # how (a) and (b) make intervals from per-key values (or keystats.BOOTSTRAP)
NO_EFFECT = "no effect"  # a ratio whose interval lies inside the no-effect margin


class Pooled(NamedTuple):
    """A moment pooled over diagnoses, and the variance of its log (``engine.analysis.claims``)."""

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
    """V̄ = Σ (K_j−1) V_j / Σ (K_j−1) and Var V̄ / V̄² = 2/ν (``engine.analysis.claims``)."""
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
    (``engine.analysis.claims``); read with ``margin`` as in ``_reading``."""
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
