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

The verdict of a row, in this order (``verdict``; Table 3, claim (c), Compare and the report all
read this one word):

* ``no spread``: every difference is the same number (a zero spread, as at step 0 where every
  method of a seed holds the same parameters): no evidence either way, no verdict;
* ``equivalent``: the 90 % interval lies inside (−δ, δ) (TOST rejects both): any difference is
  smaller than the margin, even a significant one (a +0.0019 [+0.0008, +0.0031] at δ 0.02);
* ``better`` / ``worse``: not equivalent, and the 95 % interval lies below / above 0 (the
  two-sided t-test of μ = 0 rejects at 5 %);
* ``not equivalent``: the 90 % interval lies wholly outside ±δ (above +δ or below −δ: the
  one-sided test of |μ| ≤ δ rejects at 5 %) while the 95 % interval crosses 0: more seeds can
  move the sign, never make it equivalent;
* ``inconclusive``: none of these (the interval reaches a margin and holds 0: more seeds decide).

Each word is a test's rejection at 5 %, so the words follow from three p-values, p_TOST,
p_diff = P(|T| > |d̄|/se) and p_ne = P(T > (|d̄| − δ)/se) (``verdict_from``). Several rows of one
table are several tests: ``holm`` adjusts all of them (statsmodels' Holm step-down) so the
chance of any false word in the table stays at 5 %; the verdicts are then read from the
adjusted p-values with the same rule.

Two sources of noise (``paired_delta``'s ``batches``). Every run is validated on the same B
batches, so a validation batch's own difficulty is shared by every seed and does not average
out over seeds. With D[s, b] the paired difference of the mean losses of batch b at seed s,
the crossed random-effects model D[s, b] = μ + a_s + β_b + e_sb (no replication) has the mean
squares MS_seed = B Σ_s (D̄_s· − D̄)²/(S−1), MS_batch = S Σ_b (D̄_·b − D̄)²/(B−1) and MS_res (the
residual's, (S−1)(B−1) degrees of freedom), and Var D̄ = σ_a²/S + σ_β²/B + σ_e²/(SB) is estimated
without bias by

    se² = MS_seed/(SB) + max(0, MS_batch − MS_res)/(SB) = se_seed² + se_batch²,

where se_seed² = s_d²/S is the seeds-only variance above (MS_seed/B is the variance of the
per-seed Δ d_s = D̄_s·) and se_batch² the validation set's sampling variance of Δ. Its
degrees of freedom are Satterthwaite's, ν = se⁴ / Σ_i (c_i MS_i)²/ν_i over the terms
(ν = S − 1 when the batch term is 0), and every interval and p-value above uses t_ν in place
of t_{n−1}. Without per-batch losses (runs stored before they were recorded) the interval
has the seed term alone, and the row says so. One seed has no interval (NaN) and the verdict
"one seed"; no pair at all gives NaN everywhere.

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
for a method that truly matches; at a true Δ of μ ≠ 0 it needs more, and none reaches it
once |μ| ≥ δ. ``PRIOR_DELTA_SD`` is the spread assumed before any run of a config exists.
Under an undecided row the plan also carries what more seeds cannot shrink: the validation
batches' variance se_batch² (``floor``), so se(s)² = s²/n + floor, d̄ ~ N(μ, σ²/n + floor) and
h(s) = δ − q·se(s) in the integral above (t on n − 1 degrees of freedom, which Satterthwaite's
only exceed: the plan errs towards more seeds), and the level its table reads it at (Holm's
first step, α/m for a table of m tests: the plan errs towards more seeds again). A floor of
(δ/q)² or more leaves no seed count that decides: validate on more tokens.
``plan_text`` plans a grid method by method, each at its own spread (``SeedPlan``).

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
NOT_EQUIVALENT, NO_SPREAD = "not equivalent", "no spread"
WITHIN_NOISE = "within noise"  # a ratio's interval that holds 1 (engine.analysis.claims)
ONE_SEED, NO_PAIR = "one seed", "no exact pair"
DECIDED = (EQUIVALENT, BETTER, WORSE, NOT_EQUIVALENT)  # the words a test's rejection gives
VERDICT_RULE = (  # the verdict words in one sentence, for every surface that prints them
    "equivalent when the 90 % interval lies inside ±δ; else worse / better when the 95 % interval excludes 0; else "
    "not equivalent when the 90 % interval lies wholly outside ±δ (more seeds cannot make it equivalent); else "
    "inconclusive (more seeds decide); no spread when every seed's Δ is the same number (no evidence); one seed has "
    "no interval; not trained yet at step 0; diverged when the method diverged in a seed where exact did not.")
TESTS = ("tost_p", "diff_p", "noneq_p")  # the p-values behind the decided words, as ``PairedDelta`` names them


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
    """Mean, sample std of the per-seed Δ, 95 % and 90 % t-intervals, the three p-values
    (TOST against ±``margin``, the difference test, the non-equivalence test), the verdict
    (module docstring), and the two standard-error components with their degrees of freedom
    (``se_batch`` NaN and ``batches`` 0 without per-batch losses)."""

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
    diff_p: float = math.nan
    noneq_p: float = math.nan
    se_seed: float = math.nan
    se_batch: float = math.nan
    df: float = math.nan
    batches: int = 0


def _interval(mean: float, se: float, df: float, level: float) -> tuple[float, float]:
    half = float(scipy.stats.t.ppf(0.5 + level / 2, df)) * se
    return mean - half, mean + half


def tost_p(mean: float, se: float, n: int, margin: float, df: float | None = None) -> float:
    """p-value of TOST (module docstring): max of the two one-sided t-test p-values, on
    ``df`` degrees of freedom (default n − 1)."""
    if se == 0:
        return 0.0 if abs(mean) < margin else 1.0
    df = n - 1 if df is None else df
    lower = scipy.stats.t.sf((mean + margin) / se, df)
    upper = scipy.stats.t.cdf((mean - margin) / se, df)
    return float(max(lower, upper))


def verdict_from(mean: float, tost: float, diff: float, noneq: float, alpha: float = EQUIVALENCE_ALPHA) -> str:
    """The verdict word of the three p-values (module docstring), each test at ``alpha``."""
    if tost < alpha:
        return EQUIVALENT
    if diff < alpha:
        return BETTER if mean < 0 else WORSE
    return NOT_EQUIVALENT if noneq < alpha else INCONCLUSIVE


def batch_variance(batches) -> tuple[float, float, int]:
    """(se_batch², its Satterthwaite share, B) of the S × B matrix of per-batch paired
    differences (module docstring): max(0, MS_batch − MS_res)/(SB), and the denominator terms
    Σ (c_i MS_i)²/ν_i of the batch and residual mean squares (0 when the term is 0)."""
    D = np.asarray(batches, dtype=float)
    S, B = D.shape
    if S < 2 or B < 2:
        return 0.0, 0.0, B
    grand = D.mean()
    ms_batch = S * float(np.sum((D.mean(axis=0) - grand) ** 2)) / (B - 1)
    resid = D - D.mean(axis=1, keepdims=True) - D.mean(axis=0, keepdims=True) + grand
    ms_res = float(np.sum(resid**2)) / ((S - 1) * (B - 1))
    if ms_batch <= ms_res:
        return 0.0, 0.0, B
    c = 1.0 / (S * B)
    share = (c * ms_batch) ** 2 / (B - 1) + (c * ms_res) ** 2 / ((S - 1) * (B - 1))
    return c * (ms_batch - ms_res), share, B


def paired_delta(d, margin: float = MARGIN, confidence: float = CONFIDENCE, batches=None) -> PairedDelta:
    """Statistics and verdict of the paired differences ``d`` (NaNs dropped); with ``batches``
    (the S × B per-batch differences of the same S seeds, in ``d``'s order, no NaN), the
    interval holds the validation batches' sampling error too. See the module docstring."""
    margin = check_margin(margin)
    d = np.asarray(d, dtype=float).ravel()
    keep = ~np.isnan(d)
    d = d[keep]
    n = len(d)
    if n == 0:
        return PairedDelta(0, math.nan, math.nan, math.nan, math.nan, NO_PAIR, margin=margin)
    mean = float(d.mean())
    if n == 1:
        return PairedDelta(1, mean, math.nan, math.nan, math.nan, ONE_SEED, margin=margin)
    std = 0.0 if np.ptp(d) == 0 else float(d.std(ddof=1))  # exact 0, not rounding noise, for equal d
    var_seed = std**2 / n
    var_batch, share, count = batch_variance(np.asarray(batches, dtype=float)[keep]) if batches is not None \
        else (math.nan, 0.0, 0)
    se = math.sqrt(var_seed + (0.0 if math.isnan(var_batch) else var_batch))
    se_seed, se_batch = math.sqrt(var_seed), math.sqrt(var_batch)
    if se == 0:
        return PairedDelta(n, mean, std, math.nan, math.nan, NO_SPREAD, margin=margin, se_seed=se_seed,
                           se_batch=se_batch, df=n - 1, batches=count)
    df = se**4 / ((var_seed**2) / (n - 1) + share)
    low, high = _interval(mean, se, df, confidence)
    low90, high90 = _interval(mean, se, df, 1 - 2 * EQUIVALENCE_ALPHA)
    tost = tost_p(mean, se, n, margin, df)
    diff = float(2 * scipy.stats.t.sf(abs(mean) / se, df))
    noneq = float(scipy.stats.t.sf((abs(mean) - margin) / se, df))
    verdict = verdict_from(mean, tost, diff, noneq, 1 - confidence)
    return PairedDelta(n, mean, std, low, high, verdict, low90, high90, tost, margin, diff, noneq, se_seed, se_batch,
                       df, count)


def holm(pvalues) -> np.ndarray:
    """Holm's step-down adjustment of ``pvalues`` (NaNs kept, left out of the family): with the
    m p-values sorted, p₍ᵢ₎ ↦ max_{j ≤ i} min(1, (m − j + 1)·p₍ⱼ₎); rejecting where the adjusted
    p < α keeps the family-wise error ≤ α. These are the values of statsmodels'
    ``multipletests(method="holm")`` (a test compares them), computed here because that function
    runs a full ``gc.collect()`` on every call: in a dashboard or a test worker with a large
    heap it cost seconds per table."""
    p = np.asarray(pvalues, dtype=float)
    out = p.copy()
    ok = np.flatnonzero(~np.isnan(p))
    if ok.size:
        order = ok[np.argsort(p[ok], kind="stable")]
        scaled = p[order] * np.arange(ok.size, 0, -1)
        out[order] = np.minimum(1.0, np.maximum.accumulate(scaled))
    return out


def tost_power(n: int, sd: float, margin: float, true_delta: float = 0.0, alpha: float = EQUIVALENCE_ALPHA,
               floor: float = 0.0) -> float:
    """P(TOST reads "equivalent") with ``n`` paired seeds of SD ``sd`` and true mean
    difference ``true_delta``, each one-sided test at ``alpha``, with a variance ``floor`` that
    seeds do not shrink (module docstring); 0 for fewer than 2 seeds."""
    margin = check_margin(margin)
    if n < 2:
        return 0.0
    nu = n - 1
    q = float(scipy.stats.t.ppf(1 - alpha, nu))
    room = (margin / q) ** 2 - floor  # se(s)² must stay below (δ/q)²
    if room <= 0:
        return 0.0
    if sd == 0:
        return 1.0 if abs(true_delta) < margin - q * math.sqrt(floor) else 0.0
    x_max = nu * n * room / sd**2  # s above this leaves no room: h(s) ≤ 0
    tau = math.sqrt(sd**2 / n + floor)

    log_norm = (nu / 2) * math.log(2) + scipy.special.gammaln(nu / 2)

    def inside(x: float) -> float:  # P(d̄ inside ±h(s) | s) times the χ²_ν density at x = ν s²/σ²
        if x <= 0:
            return 0.0
        h = margin - q * math.sqrt(sd**2 * x / nu / n + floor)
        density = math.exp((nu / 2 - 1) * math.log(x) - x / 2 - log_norm)
        return (scipy.special.ndtr((h - true_delta) / tau) - scipy.special.ndtr((-h - true_delta) / tau)) * density

    # the χ² mass lies within its 1e-12 and 1 − 1e-12 quantiles: a narrow peak near ν once n is large
    low, high = (float(scipy.stats.chi2.ppf(q, nu)) for q in (1e-12, 1 - 1e-12))
    if x_max <= low:
        return 0.0
    top = min(x_max, high)
    value, _ = scipy.integrate.quad(inside, low, top, limit=200, points=[nu] if low < nu < top else None)
    return float(min(1.0, max(0.0, value)))


def seeds_needed(sd: float, margin: float, power: float = POWER, true_delta: float = 0.0,
                 alpha: float = EQUIVALENCE_ALPHA, floor: float = 0.0) -> int | None:
    """The least n ≥ 2 with ``tost_power(n, sd, margin, true_delta, alpha, floor) >= power``;
    None when more than ``MAX_SEEDS`` (or never: |true_delta| ≥ margin, or a floor that leaves
    no room). Power rises with n, so a doubling search then bisection finds it."""
    margin = check_margin(margin)
    if not math.isfinite(sd) or sd < 0 or not math.isfinite(floor):
        return None
    if abs(true_delta) >= margin:
        return None

    def enough(n: int) -> bool:
        return tost_power(n, sd, margin, true_delta, alpha, floor) >= power

    if enough(2):
        return 2
    low, high = 2, 4
    while not enough(high):
        low, high = high, high * 2
        if low > MAX_SEEDS:
            return None
    while high - low > 1:
        mid = (low + high) // 2
        if enough(mid):
            high = mid
        else:
            low = mid
    return high if high <= MAX_SEEDS else None


class SeedPlan(NamedTuple):
    """One sketched method of a grid about to be launched: its name, the seeds it shares with
    exact backprop, the SD of its Δ val to plan for and where that SD came from, in words."""

    name: str
    seeds: int
    sd: float
    source: str


def _seeds(n: int) -> str:
    return f"{n} seed{'s' if n != 1 else ''}"


def plan_text(plans: list[SeedPlan], margin: float) -> str | None:
    """What each method of ``plans`` can decide about equivalence within ±``margin`` with its
    own seeds at its own Δ SD: None when every method's seeds reach ``POWER`` for a method that
    truly matches (``tost_power`` at a true Δ of 0), else one sentence that names the methods
    whose seeds do not, their power and the seeds each would need (``seeds_needed``); methods
    with the same seeds, SD and source share a clause."""
    short: dict[tuple[int, float, str], list[str]] = {}
    for p in plans:
        if tost_power(p.seeds, p.sd, margin) < POWER:
            short.setdefault((p.seeds, p.sd, p.source), []).append(p.name)
    if not short:
        return None
    counts = {seeds for seeds, _, _ in short}
    clauses = []
    for (seeds, sd, source), names in short.items():
        need = seeds_needed(sd, margin)
        want = f"{need} seeds reach {POWER:.0%}" if need else f"no seed count up to {MAX_SEEDS:,} reaches {POWER:.0%}"
        own = f" ({_seeds(seeds)})" if len(counts) > 1 else ""
        clauses.append(f"{', '.join(names)}{own} at a Δ val SD of {sd:.3g} ({source}): a method that truly matches "
                       f"reads \"equivalent\" with probability {tost_power(seeds, sd, margin):.0%}, and {want}")
    lead = _seeds(next(iter(counts))) if len(counts) == 1 else "the seeds launched"
    return f"{lead} cannot decide whether a method matches exact backprop within ±{margin:g} nats: " + "; ".join(clauses)


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
    low, high = _interval(b, se, n - 2, confidence)
    low90, high90 = _interval(b, se, n - 2, 1 - 2 * EQUIVALENCE_ALPHA)
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
