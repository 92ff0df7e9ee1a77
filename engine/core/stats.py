"""Paired comparison of a method against exact backprop over seeds, equivalence within
a margin, and the seeds such a comparison needs.

The same seed means the same initial parameters and the same batches, so the
differences d_s = val(method, s) − val(exact, s) are paired observations. With
n ≥ 2 of them, se = s_d / √n (s_d the sample std, ddof = 1) and the level-c t-interval

    d̄ ± t_{(1+c)/2, n−1} · se

is the interval of ``scipy.stats.ttest_rel`` (c = 0.95: ``ci_low``/``ci_high``).

Equivalence within a margin δ > 0 (``paired_delta``'s ``margin``) is the two one-sided
tests (TOST, Schuirmann 1987) at level α = ``EQUIVALENCE_ALPHA`` = 0.05: H₀⁻: μ ≤ −δ is
rejected when t⁻ = (d̄ + δ)/se > t_{1−α, n−1}, H₀⁺: μ ≥ δ when t⁺ = (d̄ − δ)/se < −t_{1−α, n−1};
both reject exactly when the 90 % interval d̄ ± t_{0.95, n−1}·se lies inside (−δ, δ). Its
p-value is max(P(T > t⁻), P(T < t⁺)), T ~ t_{n−1} (``statsmodels.stats.weightstats.ttost_paired``).

The verdict of a row, in this order:

* ``equivalent``: the 90 % interval lies inside (−δ, δ) (TOST rejects both): any difference is
  smaller than the margin, even a significant one (a +0.0019 [+0.0008, +0.0031] at δ 0.02);
* ``better`` / ``worse``: not equivalent, and the 95 % interval lies below / above 0;
* ``inconclusive``: neither (the interval holds 0 and reaches past a margin: more seeds decide).

All-equal differences have s_d = 0: both intervals are the point d̄ (equivalent when |d̄| < δ,
else better/worse by its sign, inconclusive only for d̄ = 0 with δ = 0). One seed has no
interval (NaN) and the verdict "one seed"; no pair at all gives NaN everywhere.

The default margin is δ = ``MARGIN`` = 0.02 nats/token. Exact backprop's own seed-to-seed SD
of validation loss in this lab's CPU reproductions is 0.01–0.026 nats, so a method within ±δ
of exact differs from it by no more than reseeding exact does; and δ is under half the 0.041
nats between the paper's exact and R = 32 figures, which the paper reads as a match, so the
lab is the stricter of the two. A margin chosen from the data being judged would void the
test's level: it is fixed before looking, and set with ``--margin`` (or the dashboard).

Power (``tost_power``): with d_s ~ N(μ, σ²) independent, d̄ ~ N(μ, σ²/n) is independent of
s² ~ σ² χ²_{n−1}/(n−1), so, with q = t_{1−α, n−1} and h(s) = δ − q s/√n,

    P(equivalent) = E_s[ max(0, Φ((h(s) − μ)√n/σ) − Φ((−h(s) − μ)√n/σ)) ],

one integral over the χ² density (``scipy.integrate.quad``). ``seeds_needed`` is the least
n ≥ 2 whose power at μ = 0 reaches ``POWER`` (0.8): the seeds that decide "equivalent"
for a method that truly matches. ``PRIOR_DELTA_SD`` is the spread assumed before any
run of a config exists.

``slope`` is an ordinary least-squares line with the t-interval of its slope (n − 2
degrees of freedom, ``scipy.stats.linregress``'s standard error); ``slope_power`` the power
of its t-test (noncentral t) and ``slope_runs_needed`` the replicates per x value that find
a given slope at a given residual spread.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import scipy  # its submodules load on first use: a `run` that computes no test starts without them

from engine.core.choices import EQUIVALENCE_MARGIN

CONFIDENCE = 0.95
EQUIVALENCE_ALPHA = 0.05  # each one-sided test of TOST: the 90 % interval
POWER = 0.8  # the power a plan asks for
MARGIN = EQUIVALENCE_MARGIN  # δ, nats/token: the default equivalence margin of a validation-loss difference
# The seed-to-seed SD of a paired Δ val assumed before a config has runs: the largest seen
# in this lab's CPU reproductions (exact's seed SD there is 0.01–0.026 nats).
PRIOR_DELTA_SD = 0.026
MAX_SEEDS = 10_000  # ``seeds_needed`` gives up beyond this (None)
EQUIVALENT, BETTER, WORSE, INCONCLUSIVE = "equivalent", "better", "worse", "inconclusive"
WITHIN_NOISE = "within noise"  # a ratio's interval that holds 1 (engine.analysis.claims)
ONE_SEED, NO_PAIR = "one seed", "no exact pair"
TABLE3_VERDICTS = (EQUIVALENT, BETTER, WORSE, INCONCLUSIVE, ONE_SEED, NO_PAIR)


def check_margin(margin) -> float:
    """``margin`` as a float; ValueError naming the fix unless it is a finite number > 0."""
    try:
        value = float(margin)
    except (TypeError, ValueError):
        raise ValueError(f"the equivalence margin must be a number of nats > 0 (got {margin!r})") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"the equivalence margin must be a number of nats > 0 (got {margin!r})")
    return value


class PairedDelta(NamedTuple):
    """Mean, sample std, 95 % and 90 % t-intervals of paired differences, the TOST
    p-value against ±``margin``, and the verdict (module docstring)."""

    n: int
    mean: float
    std: float
    ci_low: float
    ci_high: float
    verdict: str
    ci90_low: float = math.nan
    ci90_high: float = math.nan
    tost_p: float = math.nan
    margin: float = MARGIN


def _interval(mean: float, se: float, n: int, level: float) -> tuple[float, float]:
    half = float(scipy.stats.t.ppf(0.5 + level / 2, n - 1)) * se
    return mean - half, mean + half


def tost_p(mean: float, se: float, n: int, margin: float) -> float:
    """p-value of TOST (module docstring): max of the two one-sided t-test p-values."""
    if se == 0:
        return 0.0 if abs(mean) < margin else 1.0
    lower = scipy.stats.t.sf((mean + margin) / se, n - 1)
    upper = scipy.stats.t.cdf((mean - margin) / se, n - 1)
    return float(max(lower, upper))


def paired_delta(d, margin: float = MARGIN, confidence: float = CONFIDENCE) -> PairedDelta:
    """Statistics and verdict of the paired differences ``d`` (NaNs dropped); see the module docstring."""
    margin = check_margin(margin)
    d = np.asarray(d, dtype=float).ravel()
    d = d[~np.isnan(d)]
    n = len(d)
    if n == 0:
        return PairedDelta(0, math.nan, math.nan, math.nan, math.nan, NO_PAIR, margin=margin)
    mean = float(d.mean())
    if n == 1:
        return PairedDelta(1, mean, math.nan, math.nan, math.nan, ONE_SEED, margin=margin)
    std = 0.0 if np.ptp(d) == 0 else float(d.std(ddof=1))  # exact 0, not rounding noise, for equal d
    se = std / math.sqrt(n)
    low, high = _interval(mean, se, n, confidence)
    low90, high90 = _interval(mean, se, n, 1 - 2 * EQUIVALENCE_ALPHA)
    if -margin < low90 and high90 < margin:
        verdict = EQUIVALENT
    else:
        verdict = BETTER if high < 0 else WORSE if low > 0 else INCONCLUSIVE
    return PairedDelta(n, mean, std, low, high, verdict, low90, high90, tost_p(mean, se, n, margin), margin)


def tost_power(n: int, sd: float, margin: float, true_delta: float = 0.0, alpha: float = EQUIVALENCE_ALPHA) -> float:
    """P(TOST reads "equivalent") with ``n`` paired seeds of SD ``sd`` and true mean
    difference ``true_delta`` (module docstring); 0 for fewer than 2 seeds."""
    margin = check_margin(margin)
    if n < 2:
        return 0.0
    if sd == 0:
        return 1.0 if abs(true_delta) < margin else 0.0
    nu, root = n - 1, math.sqrt(n)
    q = float(scipy.stats.t.ppf(1 - alpha, nu))
    x_max = nu * (margin * root / (q * sd)) ** 2  # s above this leaves no room: h(s) ≤ 0

    log_norm = (nu / 2) * math.log(2) + scipy.special.gammaln(nu / 2)

    def inside(x: float) -> float:  # P(d̄ inside ±h(s) | s) times the χ²_ν density at x = ν s²/σ²
        if x <= 0:
            return 0.0
        h = margin - q * sd * math.sqrt(x / nu) / root
        density = math.exp((nu / 2 - 1) * math.log(x) - x / 2 - log_norm)
        return (scipy.special.ndtr((h - true_delta) * root / sd) - scipy.special.ndtr((-h - true_delta) * root / sd)) * density

    # the χ² mass lies within its 1e-12 and 1 − 1e-12 quantiles: a narrow peak near ν once n is large
    low, high = (float(scipy.stats.chi2.ppf(q, nu)) for q in (1e-12, 1 - 1e-12))
    if x_max <= low:
        return 0.0
    top = min(x_max, high)
    value, _ = scipy.integrate.quad(inside, low, top, limit=200, points=[nu] if low < nu < top else None)
    return float(min(1.0, max(0.0, value)))


def seeds_needed(sd: float, margin: float, power: float = POWER, true_delta: float = 0.0,
                 alpha: float = EQUIVALENCE_ALPHA) -> int | None:
    """The least n ≥ 2 with ``tost_power(n, sd, margin, true_delta) >= power``; None when
    more than ``MAX_SEEDS`` (or never, |true_delta| ≥ margin). Power rises with n, so a
    doubling search then bisection finds it."""
    margin = check_margin(margin)
    if not math.isfinite(sd) or sd < 0:
        return None
    if abs(true_delta) >= margin:
        return None
    if tost_power(2, sd, margin, true_delta, alpha) >= power:
        return 2
    low, high = 2, 4
    while tost_power(high, sd, margin, true_delta, alpha) < power:
        low, high = high, high * 2
        if low > MAX_SEEDS:
            return None
    while high - low > 1:
        mid = (low + high) // 2
        if tost_power(mid, sd, margin, true_delta, alpha) >= power:
            high = mid
        else:
            low = mid
    return high if high <= MAX_SEEDS else None


def plan_text(seeds: int, sd: float, margin: float, source: str) -> str | None:
    """What ``seeds`` seeds can decide about equivalence within ±``margin`` at a Δ SD of
    ``sd`` (``source`` says where it came from): None when they reach ``POWER``, else one
    sentence with their power and the seeds that would."""
    power = tost_power(seeds, sd, margin)
    if power >= POWER:
        return None
    need = seeds_needed(sd, margin)
    want = f"{need} seeds reach {POWER:.0%}" if need else f"no seed count up to {MAX_SEEDS:,} reaches {POWER:.0%}"
    return (f"{seeds} seed{'s' if seeds != 1 else ''} cannot decide whether a method matches exact backprop within "
            f"±{margin:g} nats: at a Δ val SD of {sd:.3g} ({source}) a method that truly matches reads "
            f"\"equivalent\" with probability {power:.0%}; {want}")


class Slope(NamedTuple):
    """y = a + b·x by least squares: b with its 95 % and 90 % t-intervals, the residual SD, n."""

    slope: float
    low: float
    high: float
    low90: float
    high90: float
    intercept: float
    residual_sd: float
    n: int


def slope(x, y, confidence: float = CONFIDENCE) -> Slope:
    """The least-squares slope b = Σ (x − x̄)(y − ȳ) / Σ (x − x̄)² of ``y`` on ``x`` and its
    t-intervals b ± t_{n−2} · σ̂ / √Σ (x − x̄)², σ̂² = Σ residual² / (n − 2) (``scipy.stats.linregress``'s
    standard error; zero when the points lie on a line, the interval then the point). NaN
    intervals with fewer than 3 points; NaN everything with a single x."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    n = len(x)
    if n < 2 or np.ptp(x) == 0:
        return Slope(math.nan, math.nan, math.nan, math.nan, math.nan, math.nan, math.nan, n)
    dx = x - x.mean()
    sxx = float(np.sum(dx**2))
    b = float(np.sum(dx * (y - y.mean())) / sxx)
    a = float(y.mean() - b * x.mean())
    if n < 3:
        return Slope(b, math.nan, math.nan, math.nan, math.nan, a, math.nan, n)
    sd = float(math.sqrt(np.sum((y - a - b * x) ** 2) / (n - 2)))
    se = sd / math.sqrt(sxx)
    low, high = _interval(b, se, n - 1, confidence)  # _interval takes n and uses n − 1: here n − 2 degrees of freedom
    low90, high90 = _interval(b, se, n - 1, 1 - 2 * EQUIVALENCE_ALPHA)
    return Slope(b, low, high, low90, high90, a, sd, n)


def slope_power(xs, runs: int, residual_sd: float, true_slope: float, confidence: float = CONFIDENCE) -> float:
    """P(the slope's two-sided level-``confidence`` t-test rejects b = 0) with ``runs`` replicates
    at each distinct x of ``xs``, residual SD ``residual_sd`` and true slope ``true_slope``: with
    n = runs·k points, b̂/SE(b̂) is noncentral t with n − 2 degrees of freedom and noncentrality
    true_slope·√(runs Σ (x − x̄)²)/σ (Σ over the k distinct x)."""
    xs = np.unique(np.asarray(xs, float))
    df = runs * len(xs) - 2
    sxx = float(np.sum((xs - xs.mean()) ** 2))
    if df < 1 or sxx == 0:
        return 0.0
    if residual_sd == 0:
        return 1.0 if true_slope != 0 else 0.0
    ncp = true_slope * math.sqrt(runs * sxx) / residual_sd
    crit = float(scipy.stats.t.ppf(0.5 + confidence / 2, df))
    return float(scipy.stats.nct.sf(crit, df, ncp) + scipy.stats.nct.cdf(-crit, df, ncp))


def slope_runs_needed(xs, residual_sd: float, detect: float, power: float = POWER,
                      confidence: float = CONFIDENCE, most: int = 1000) -> int | None:
    """The least replicates per distinct x of ``xs`` whose ``slope_power`` for a true slope
    ``detect`` reaches ``power``; None when more than ``most`` (or no slope to find)."""
    if detect == 0 or not math.isfinite(residual_sd) or len(np.unique(np.asarray(xs, float))) < 2:
        return None
    for runs in range(1, most + 1):
        if slope_power(xs, runs, residual_sd, detect, confidence) >= power:
            return runs
    return None
