"""Paired comparison of a method against exact backprop over seeds.

The same seed means the same initial parameters and the same batches, so the
differences d_s = val(method, s) − val(exact, s) are paired observations. With
n ≥ 2 of them, the 95 % t-interval of their mean is

    d̄ ± t_{0.975, n−1} · s_d / √n,     s_d the sample std (ddof = 1),

which is the interval of ``scipy.stats.ttest_rel``. The verdict reads the
interval: "better" when it lies entirely below 0 (the method's loss is lower),
"worse" when entirely above, else "within noise". All-equal differences have
s_d = 0: the interval is the point d̄, so the verdict is "better"/"worse" by the
sign of d̄ ("within noise" only when d̄ = 0). One seed has no interval (NaN),
never a zero std; no pair at all gives NaN everywhere.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from scipy import stats

CONFIDENCE = 0.95
BETTER, WORSE, WITHIN_NOISE, ONE_SEED, NO_PAIR = "better", "worse", "within noise", "one seed", "no exact pair"


class PairedDelta(NamedTuple):
    """Mean, sample std and 95 % t-interval of paired differences, and the verdict."""

    n: int
    mean: float
    std: float
    ci_low: float
    ci_high: float
    verdict: str


def paired_delta(d, confidence: float = CONFIDENCE) -> PairedDelta:
    """Statistics of the paired differences ``d`` (NaNs dropped); see the module docstring."""
    d = np.asarray(d, dtype=float).ravel()
    d = d[~np.isnan(d)]
    n = len(d)
    if n == 0:
        return PairedDelta(0, math.nan, math.nan, math.nan, math.nan, NO_PAIR)
    mean = float(d.mean())
    if n == 1:
        return PairedDelta(1, mean, math.nan, math.nan, math.nan, ONE_SEED)
    std = 0.0 if np.ptp(d) == 0 else float(d.std(ddof=1))  # exact 0, not rounding noise, for equal d
    half = float(stats.t.ppf(0.5 + confidence / 2, n - 1)) * std / math.sqrt(n)
    low, high = mean - half, mean + half
    verdict = BETTER if high < 0 else WORSE if low > 0 else WITHIN_NOISE
    return PairedDelta(n, mean, std, low, high, verdict)
