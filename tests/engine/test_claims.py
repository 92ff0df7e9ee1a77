"""The claims rules (``engine.analysis.claims``) on fixed tables: one case per verdict per claim."""


import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from engine.analysis import claims
from engine.analysis.claims import INCONCLUSIVE, NOT_MEASURED, NOT_SUPPORTED, SUPPORTED
from engine.analysis.method_frames import RUN_TIME_COLUMNS, run_time_frame, shared_runs
from engine.analysis.summary import TABLE3_COLUMNS
from engine.core.stats import (
    PRIOR_DELTA_SD,
    paired_delta,
    seeds_needed,
    slope,
    slope_power,
    slope_runs_needed,
    tost_power,
)

MIB = 2**20


def table3(rows):
    """A Table 3 frame with the given rows (other columns NaN / defaults)."""
    full = []
    for r in rows:
        row = {c: np.nan for c in TABLE3_COLUMNS}
        row.update(setup="", lam=0.01, paired_seeds=3, step=1000, mem_saved_bytes_exact_mean=2 * MIB)
        row.update(r)
        full.append(row)
    frame = pd.DataFrame(full, columns=TABLE3_COLUMNS)
    return frame.astype({"rank": "Int64"})


def delta_row(rank, mean, low, high, seeds=3):
    return {"estimator": "basis", "rank": rank, "delta_val_mean": mean, "delta_val_ci95_low": low,
            "delta_val_ci95_high": high, "paired_seeds": seeds}


def memory_rows(mib_by_rank, exact_mib=2.0):
    return [{"estimator": "basis", "rank": r, "mem_saved_bytes_mean": m * MIB, "mem_saved_bytes_exact_mean": exact_mib * MIB}
            for r, m in mib_by_rank.items()]


def diagnoses(values, keys=4096, diagnosis_id=1):
    """Pooled diagnosis rows of one diagnosis over ``keys`` keys: {(estimator, rank): (bias2, variance)};
    MSE = bias² + variance."""
    rows = [{"diagnosis_id": diagnosis_id, "run_id": 1, "layer": "all", "estimator": e, "rank": r, "lam": 0.0,
             "bias2": b, "variance": v, "mse": b + v, "keys": keys} for (e, r), (b, v) in values.items()]
    rows.append({"diagnosis_id": diagnosis_id, "run_id": 1, "layer": "head", "estimator": "countsketch", "rank": 1,
                 "lam": 0.0, "bias2": 0.0, "variance": 1e-9, "mse": 1e-9, "keys": keys})  # per layer: not read
    return pd.DataFrame(rows, columns=claims.DIAGNOSIS_COLUMNS)


def step_times(ms_by_rank, exact=None):
    rows = [{"estimator": "basis", "rank": r, "lam": 0.01, "setup": "", "seeds": 3, "mean": m, "std": 0.1}
            for r, m in ms_by_rank.items()]
    if exact is not None:
        rows.append({"estimator": "exact", "rank": pd.NA, "lam": np.nan, "setup": "", "seeds": 3, "mean": exact, "std": 0.1})
    return pd.DataFrame(rows, columns=claims.STEP_TIME_COLUMNS)


def verdict(key, t3=None, diag=None, times=None, timings=None, margin=claims.MATCH_DELTA):
    t3 = table3([]) if t3 is None else t3
    out = {v.key: v for v in claims.judge(t3, diag, times, timings=timings, margin=margin)}
    return out[key]


def seeds_row(rank, deltas, lam=0.01, margin=claims.MATCH_DELTA):
    """A Table 3 row of basis at ``rank`` from per-seed Δ (``paired_delta`` fills its statistics)."""
    d = paired_delta(deltas, margin)
    return {"estimator": "basis", "rank": rank, "lam": lam, "delta_val_mean": d.mean, "delta_val_std": d.std,
            "delta_val_ci95_low": d.ci_low, "delta_val_ci95_high": d.ci_high, "delta_val_ci90_low": d.ci90_low,
            "delta_val_ci90_high": d.ci90_high, "tost_p": d.tost_p, "margin": margin, "verdict": d.verdict,
            "diff_p": d.diff_p, "noneq_p": d.noneq_p, "diverged": "",
            "paired_seeds": d.n, "delta_val_by_seed": ", ".join(f"s{i} {v:+.4f}" for i, v in enumerate(deltas))}


def run_times(ms_by_rank, shared=(), lam=0.01):
    """A ``method_frames.run_time_frame``: {rank: [median ms of each run]}; run ids in ``shared`` overlapped another."""
    rows, run_id = [], 0
    for rank, values in ms_by_rank.items():
        for seed, ms in enumerate(values):
            run_id += 1
            rows.append({"run_id": run_id, "estimator": "basis", "rank": rank, "lam": lam, "setup": "", "seed": seed,
                         "windows": 4, "ms": ms, "ms_low": ms - 1, "ms_high": ms + 1, "shared": run_id in shared})
    return pd.DataFrame(rows, columns=RUN_TIME_COLUMNS).astype({"rank": "Int64"})


# --------------------------------------------------------------------------- (a)

def test_a_supported_when_balanced_hashing_has_a_significantly_lower_variance_at_every_rank():
    v = verdict("a", diag=diagnoses({("balanced", 2): (0, 0.9), ("countsketch", 2): (0, 1.1),
                                     ("balanced", 8): (0, 0.5), ("countsketch", 8): (0, 0.6)}))
    assert v.verdict == SUPPORTED
    # no per-key values: the old bound 0.9/1.1 · exp(±1.96 √(4/4095)), the log ratio ±0.0613 wide
    low, high = (0.9 / 1.1 * np.exp(s * 1.959964 * np.sqrt(4 / 4095)) for s in (-1, 1))
    assert (f"variance balanced vs countsketch (1 diagnosis, 4096 keys; intervals: {claims.BOUND_TEXT}): R=2 0.9 "
            f"vs 1.1, ratio 0.818 "
            f"[{low:.3g}, {high:.3g}] lower; R=8 0.5 vs 0.6, ratio 0.833") in v.evidence


def test_a_inconclusive_when_a_small_difference_rests_on_few_keys():
    values = {("balanced", 2): (0, 0.9), ("countsketch", 2): (0, 1.1)}
    v = verdict("a", diag=diagnoses(values, keys=64))  # ratio 0.818, interval ×/÷ exp(1.96 √(4/63)) = 1.64
    assert v.verdict == claims.INCONCLUSIVE and "within noise" in v.evidence
    assert verdict("a", diag=diagnoses(values, keys=4096)).verdict == SUPPORTED  # the same ratio on 4096 keys


def test_a_not_supported_when_one_rank_is_significantly_higher():
    v = verdict("a", diag=diagnoses({("balanced", 1): (0, 0.5), ("countsketch", 1): (0, 1.1),
                                     ("balanced", 8): (0, 0.7), ("countsketch", 8): (0, 0.6),
                                     ("basis", 1): (0.1, 0.5), ("scalars", 1): (0.1, 0.7)}))
    assert v.verdict == NOT_SUPPORTED  # balanced > countsketch at R=8, although basis beats scalars
    assert "R=8 0.7 vs 0.6, ratio 1.17" in v.evidence and "higher" in v.evidence


def test_a_within_noise_and_lower_groups_are_inconclusive_a_higher_one_is_not():
    lower, within, higher = (0, 0.5), (0, 0.99), (0, 2.0)
    base = {("countsketch", 2): (0, 1.0), ("countsketch", 8): (0, 1.0)}
    assert verdict("a", diag=diagnoses({**base, ("balanced", 2): lower, ("balanced", 8): within})).verdict == \
        claims.INCONCLUSIVE
    assert verdict("a", diag=diagnoses({**base, ("balanced", 2): higher, ("balanced", 8): within})).verdict == \
        NOT_SUPPORTED


def test_a_not_measured_without_a_pair():
    assert verdict("a").verdict == NOT_MEASURED
    assert verdict("a", diag=diagnoses({("balanced", 1): (0, 0.9), ("countsketch", 8): (0, 1.1)})).verdict == NOT_MEASURED
    assert verdict("a", diag=diagnoses({("balanced", 1): (0, 0.9), ("countsketch", 1): (0, 1.1)}, keys=1)).verdict == \
        NOT_MEASURED  # one key has no variance


def test_a_pools_the_diagnoses_that_hold_both_estimators_and_combines_their_keys():
    values = {("balanced", 2): (0, 0.9), ("countsketch", 2): (0, 1.0)}
    one = diagnoses(values, keys=1024)
    assert verdict("a", diag=one).verdict == claims.INCONCLUSIVE  # 0.9 [0.8, 1.01] on 1023 degrees of freedom
    four = pd.concat([diagnoses(values, keys=1024, diagnosis_id=i) for i in range(4)])
    v = verdict("a", diag=four)  # the same variances on 4 · 1023: 0.9 [0.85, 0.96]
    assert v.verdict == SUPPORTED and "(4 diagnoses, 1024 keys; " in v.evidence
    alone = diagnoses({("balanced", 2): (0, 5.0)}, keys=1024, diagnosis_id=9)  # no countsketch in diagnosis 9
    assert verdict("a", diag=pd.concat([four, alone])).evidence == v.evidence


def test_pooled_variance_weights_by_degrees_of_freedom():
    p = claims.pooled_variance([1.0, 3.0], [11, 31])  # weights 10, 30
    assert p.value == pytest.approx((10 * 1 + 30 * 3) / 40)
    assert p.log_var == pytest.approx(2 * (10 * 1 + 30 * 9) / (10 * 1 + 30 * 3) ** 2)  # 2/ν
    assert claims.pooled_variance([2.0, 2.0], [11, 31]).log_var == pytest.approx(2 / 40)  # equal: ν = Σ (K_j − 1)
    assert claims.pooled_variance([2.0], [64]).log_var == pytest.approx(2 / 63)


def test_pooled_mse_weights_by_keys_with_the_bias_term():
    p = claims.pooled_mse([2.0, 5.0], [1.0, -0.5], [1.0, 4.0], [10, 30])  # a negative b² estimate counts as 0
    value = (10 * 2.0 + 30 * 5.0) / 40
    var = (10 * (2 * 1.0 + 4 * 1.0 * 1.0) + 30 * (2 * 16.0)) / 40**2
    assert p.value == pytest.approx(value) and p.log_var == pytest.approx(var / value**2)


def test_the_mse_variance_is_exact_when_the_bias_lies_along_a_rank_one_covariance():
    """e ~ N(β u, σ² u uᵀ): ‖e‖² = (β + σ z)², so Var ‖e‖² = 2σ⁴ + 4β²σ² = 2V² + 4b²V exactly
    and Var M = (2V² + 4b²V)/K: the empirical variance of M over 4,000 draws of K = 64 keys
    matches it within 12 % (the sample variance's own SE is about 2.2 %, kurtosis included
    under 5 %); dropping the bias term would miss by a factor 9, doubling the SE by 4."""
    rng = np.random.default_rng(7)
    reps, keys, sigma, beta = 4000, 64, 0.5, 1.0
    u = np.array([0.6, 0.8, 0.0])
    e = (beta + sigma * rng.standard_normal((reps, keys)))[..., None] * u
    m = (e**2).sum(-1).mean(1)
    v, b2 = sigma**2, beta**2
    p = claims.pooled_mse([m.mean()], [b2], [v], [keys])
    assert np.var(m, ddof=1) == pytest.approx(p.log_var * p.value**2, rel=0.12)


def test_ratio_reads_its_interval_and_zeros():
    r = claims.ratio(claims.Pooled(1.0, 0.01), claims.Pooled(2.0, 0.03))
    half = claims.Z * np.sqrt(0.04)
    assert (r.value, r.low, r.high) == pytest.approx((0.5, 0.5 * np.exp(-half), 0.5 * np.exp(half)))
    assert r.reading == "lower" and claims.Z == pytest.approx(1.959964, abs=1e-6)
    assert claims.ratio(claims.Pooled(2.0, 0.03), claims.Pooled(1.0, 0.01)).reading == "higher"
    assert claims.ratio(claims.Pooled(1.0, 0.5), claims.Pooled(1.2, 0.5)).reading == "within noise"
    assert claims.ratio(claims.Pooled(0.0, 0.0), claims.Pooled(1.0, 0.01)).reading == "lower"
    assert claims.ratio(claims.Pooled(1.0, 0.01), claims.Pooled(0.0, 0.0)).reading == "higher"


# --------------------------------------------------------------------------- the standard errors against simulation

def _draws(rng, reps, keys, scales, bias):
    """``reps`` × ``keys`` errors e ~ N(bias, Σ) in len(scales) dimensions, Σ = diag(scales²) rotated at random."""
    q, _ = np.linalg.qr(rng.standard_normal((len(scales), len(scales))))
    return bias + (rng.standard_normal((reps, keys, len(scales))) * scales) @ q.T


def _moments(e):
    """V, b², M of ``engine.analysis.diagnostics`` from errors (reps, K, d)."""
    k = e.shape[1]
    mean = e.mean(axis=1)
    v = ((e - mean[:, None]) ** 2).sum(axis=(1, 2)) / (k - 1)
    return v, (mean**2).sum(axis=1) - v / k, (e**2).sum(axis=2).mean(axis=1)


@pytest.mark.parametrize("scales, exact", [([1.0, 0, 0, 0], True), ([1.0, 1.0, 0.5, 0.5], False)],
                         ids=["rank-one-the-bound-is-attained", "rank-four-the-bound-is-conservative"])
def test_the_95_percent_intervals_cover_the_true_ratios(scales, exact):
    """Two estimators, two diagnoses each (64 and 32 keys), Gaussian errors of known Σ and bias: the
    intervals of the pooled variance ratio and MSE ratio cover the true ratios 95 % of the time where
    the bound is attained (rank-one Σ), at least that where it is not."""
    rng, reps = np.random.default_rng(21), 2000
    scales, keys = np.asarray(scales), (64, 32)
    truth = {}  # estimator: per diagnosis (V, b², M) drawn, true tr Σ and ‖b‖²
    for name, scale, bias in (("first", 1.0, 0.3), ("second", 1.6, 0.0)):
        trace = [(scale * s * scales**2).sum() for s in (1.0, 2.0)]  # the diagnoses differ in Σ
        drawn = [_moments(_draws(rng, reps, k, np.sqrt(scale * s) * scales, bias)) for k, s in zip(keys, (1.0, 2.0))]
        truth[name] = (drawn, trace, len(scales) * bias**2)
    covered = {"variance": 0, "mse": 0}
    true_v, true_m = {}, {}
    for name, (_, trace, b2) in truth.items():
        w = np.asarray(keys) - 1
        true_v[name] = float(np.sum(w * trace) / w.sum())
        true_m[name] = float(np.sum(np.asarray(keys) * (np.asarray(trace) + b2)) / np.sum(keys))
    for i in range(reps):
        pooled = {}
        for name, (drawn, _, _) in truth.items():
            v, b2, m = (np.array([d[j][i] for d in drawn]) for j in range(3))
            pooled[name] = (claims.pooled_variance(v, keys), claims.pooled_mse(m, b2, v, keys))
        rv = claims.ratio(pooled["first"][0], pooled["second"][0])
        rm = claims.ratio(pooled["first"][1], pooled["second"][1])
        covered["variance"] += rv.low <= true_v["first"] / true_v["second"] <= rv.high
        covered["mse"] += rm.low <= true_m["first"] / true_m["second"] <= rm.high
    slack = 3 * np.sqrt(0.95 * 0.05 / reps)  # three binomial standard errors of a 95 % coverage
    for what, n in covered.items():
        assert n / reps >= 0.95 - slack, what
        if exact and what == "variance":
            assert n / reps <= 0.95 + slack, what


# --------------------------------------------------------------------------- (b)

def test_b_supported_when_scalars_lower_the_variance_and_the_mse_is_not_higher():
    v = verdict("b", diag=diagnoses({("scalars", 8): (0.02, 0.5), ("countsketch", 8): (0.0, 0.6),
                                     ("basis", 64): (0.0, 0.0), ("balanced", 64): (0.0, 0.0)}))  # exact at R=B·T: left out
    assert v.verdict == SUPPORTED
    assert v.evidence.startswith(f"scalars vs countsketch (1 diagnosis, 4096 keys; intervals: {claims.BOUND_TEXT}): "
                                 "R=8 bias² 0.02 vs 0 (added +0.0333 [")
    assert "of the MSE without, a little), variance 0.5 vs 0.6 ratio 0.833 [" in v.evidence
    assert "MSE 0.52 vs 0.6 ratio 0.867 [" in v.evidence and "basis vs balanced" not in v.evidence


@pytest.mark.parametrize("scalars", [(0.3, 0.5), (0.0, 0.7)], ids=["mse-significantly-higher", "higher-variance"])
def test_b_not_supported_when_the_trade_does_not_pay(scalars):
    v = verdict("b", diag=diagnoses({("scalars", 8): scalars, ("countsketch", 8): (0.0, 0.6)}))
    assert v.verdict == NOT_SUPPORTED


def test_b_a_slightly_higher_mse_within_noise_does_not_contradict():
    # on 16384 keys: variance 0.57 vs 0.6 is lower (0.95 [0.92, 0.98]); MSE 0.61 vs 0.6 within noise; the bias
    # added, 0.04 / 0.6 = 0.067 [0.059, 0.074] of the MSE without, is a little (below 0.1)
    values = {("scalars", 8): (0.04, 0.57), ("countsketch", 8): (0.0, 0.6)}
    assert verdict("b", diag=diagnoses(values, keys=16384)).verdict == SUPPORTED
    # the same MSE made of more bias and less variance: 0.11 / 0.6 = 0.18 of it is not a little
    v = verdict("b", diag=diagnoses({("scalars", 8): (0.11, 0.5), ("countsketch", 8): (0.0, 0.6)}))
    assert v.verdict == NOT_SUPPORTED and "not a little" in v.evidence


def test_b_inconclusive_when_the_variance_falls_within_noise():
    v = verdict("b", diag=diagnoses({("scalars", 8): (0.0, 0.55), ("countsketch", 8): (0.0, 0.6)}, keys=64))
    assert v.verdict == claims.INCONCLUSIVE


def test_b_not_measured_without_a_pair():
    assert verdict("b", diag=diagnoses({("basis", 8): (0, 1), ("countsketch", 8): (0, 1)})).verdict == NOT_MEASURED


# --------------------------------------------------------------------------- (c)

def test_c_supported_when_the_90_percent_interval_lies_inside_the_margin():
    v = verdict("c", table3([seeds_row(32, [0.002, -0.003, 0.001, 0.0]), seeds_row(8, [0.5, 0.4, 0.6])]))
    assert v.verdict == SUPPORTED
    d = paired_delta([0.002, -0.003, 0.001, 0.0])
    assert v.evidence.startswith(f"basis R=32 λ=0.01: Table 3 reads equivalent; Δ +0.0000, 90 % [{d.ci90_low:+.4f}, {d.ci90_high:+.4f}] vs ±0.02")
    assert "per seed s0 +0.0020, s1 -0.0030, s2 +0.0010, s3 +0.0000; 4 seeds at step 1000" in v.evidence


@pytest.mark.parametrize("deltas", [[0.10, 0.12, 0.14], [-0.10, -0.12, -0.14]], ids=["worse", "better"])
def test_c_not_supported_when_the_difference_is_significantly_beyond_the_margin(deltas):
    assert verdict("c", table3([seeds_row(32, deltas)])).verdict == NOT_SUPPORTED


@pytest.mark.parametrize("deltas", [[0.01, -0.03], [0.01, -0.03, 0.04], [0.015, 0.025, 0.02, 0.018]],
                         ids=["two-noisy-seeds", "three-noisy-seeds", "near-the-margin"])
def test_c_inconclusive_when_the_interval_straddles_the_margin(deltas):
    """The old rule said "supported" for noise: fewer noisy seeds must never make a match likelier."""
    assert verdict("c", table3([seeds_row(32, deltas)])).verdict == INCONCLUSIVE


def test_c_reads_the_margin_it_is_given():
    deltas = [0.030, 0.031, 0.029]
    assert verdict("c", table3([seeds_row(32, deltas)])).verdict == NOT_SUPPORTED
    v = verdict("c", table3([seeds_row(32, deltas, margin=0.05)]), margin=0.05)
    assert v.verdict == SUPPORTED and "vs ±0.05" in v.evidence and "δ = 0.05 nats" in v.rule


def test_c_not_measured_with_one_seed_or_no_row():
    assert verdict("c", table3([seeds_row(32, [0.0])])).verdict == NOT_MEASURED
    assert verdict("c", table3([seeds_row(16, [0.0, 0.01, -0.01])])).verdict == NOT_MEASURED


def test_c_every_lambda_must_match():
    rows = [seeds_row(32, [0.001, -0.001, 0.0]), seeds_row(32, [0.1, 0.12, 0.11], lam=0.0)]
    assert verdict("c", table3(rows)).verdict == NOT_SUPPORTED


def test_c_plans_seeds_only_under_an_inconclusive_row_at_its_own_spread():
    """A decided row (equivalent, worse) gets no seeds-needed line; an inconclusive one gets the seeds
    for 80 % power at its own observed Δ SD both if it truly matches and if the true Δ is the mean seen
    (none when that mean lies at or beyond δ); with no row to read, the prior's."""
    equivalent = verdict("c", table3([seeds_row(32, [0.002, -0.003, 0.001, 0.0])]))
    assert equivalent.power == "basis R=32 λ=0.01: decided (equivalent), no more seeds needed"
    worse = verdict("c", table3([seeds_row(32, [0.10, 0.12, 0.14])]))
    assert worse.power == "basis R=32 λ=0.01: decided (worse), no more seeds needed"
    deltas = [0.01, -0.03, 0.04]
    row = seeds_row(32, deltas)
    assert row["verdict"] == "inconclusive"
    v = verdict("c", table3([row, seeds_row(32, [0.002, -0.003, 0.001, 0.0], lam=0.0)]))
    sd, mean = float(np.std(deltas, ddof=1)), float(np.mean(deltas))
    zero, seen = seeds_needed(sd, 0.02), seeds_needed(sd, 0.02, true_delta=mean)
    assert tost_power(zero, sd, 0.02) >= 0.8 > tost_power(zero - 1, sd, 0.02) and seen > zero
    assert f"basis R=32 λ=0.01: inconclusive; at the observed Δ SD {sd:.3g}, 3 seeds give " \
           f"{tost_power(3, sd, 0.02):.0%} power" in v.power
    assert f"80% takes {zero} seeds if it truly matches (true Δ 0), if the true Δ is the {mean:+.4f} seen, " \
           f"{seen} seeds" in v.power
    assert "basis R=32: decided (equivalent), no more seeds needed" in v.power  # the λ = 0 row: decided
    beyond = verdict("c", table3([seeds_row(32, [0.0, 0.05])]))  # inconclusive, mean +0.025 beyond δ
    assert "2 seeds give" in beyond.power
    assert "if the true Δ is the +0.0250 seen, no number of seeds shows equivalence" in beyond.power
    prior = verdict("c").power
    assert f"prior Δ SD {PRIOR_DELTA_SD:.3g}" in prior and f"{seeds_needed(PRIOR_DELTA_SD, 0.02)} seeds give 80%" in prior


# --------------------------------------------------------------------------- (d)

def test_d_supported_when_bytes_rise_with_r_and_the_small_sketch_saves():
    v = verdict("d", table3(memory_rows({1: 1.50, 8: 1.55, 32: 1.70, 64: 1.80})))
    assert v.verdict == SUPPORTED
    assert "R=1 1.500, R=8 1.550, R=32 1.700, R=64 1.800; exact 2.000" in v.evidence and "15.0 %" in v.evidence


@pytest.mark.parametrize("mib", [{1: 1.5, 8: 1.9, 32: 1.7}, {1: 1.990, 64: 1.995}],
                         ids=["not-monotone", "fall-below-1-percent"])
def test_d_not_supported(mib):
    assert verdict("d", table3(memory_rows(mib))).verdict == NOT_SUPPORTED


def test_d_not_measured_with_one_rank():
    assert verdict("d", table3(memory_rows({32: 1.0}))).verdict == NOT_MEASURED
    assert verdict("d").verdict == NOT_MEASURED


# --------------------------------------------------------------------------- (e)

RANKS = (1, 8, 32, 64)


def test_e_supported_when_the_slope_interval_lies_above_zero():
    noise = [-0.2, 0.0, 0.2]
    times = run_times({r: [20 + 0.1 * r + e for e in noise] for r in RANKS})
    v = verdict("e", timings=times)
    assert v.verdict == SUPPORTED
    x = np.repeat(RANKS, 3).astype(float)
    y = times["ms"].to_numpy()
    fit = stats.linregress(x, y)
    half = stats.t.ppf(0.975, len(x) - 2) * fit.stderr
    assert f"slope {fit.slope:+.3g} ms per unit R [{fit.slope - half:+.3g}, {fit.slope + half:+.3g}]" in v.evidence
    assert f"adds {fit.slope * 63:+.2f} ms" in v.evidence and "R=1 20.10 (3 runs, windows 18.9–21.3)" in v.evidence
    assert "run(s) per rank timed alone find a 5 % change" in v.power


@pytest.mark.parametrize("ms", [{r: [25.0 + 0.001 * r + e for e in (-0.05, 0.0, 0.05)] for r in RANKS},
                                {r: [30.0 - 0.1 * r + e for e in (-0.2, 0.0, 0.2)] for r in RANKS}],
                         ids=["flat-within-5-percent", "slower-at-small-r"])
def test_e_not_supported(ms):
    assert verdict("e", timings=run_times(ms)).verdict == NOT_SUPPORTED


def test_e_inconclusive_when_the_timings_are_too_noisy():
    ms = {1: [20.0, 35.0], 64: [22.0, 40.0]}
    assert verdict("e", timings=run_times(ms)).verdict == INCONCLUSIVE


def test_e_not_measured_when_runs_shared_a_machine_or_too_few_are_timed():
    ms = {r: [20 + 0.1 * r, 20.2 + 0.1 * r] for r in RANKS}
    shared = run_times(ms, shared=set(range(1, 9)))
    v = verdict("e", timings=shared)
    assert v.verdict == NOT_MEASURED and "8 of 8 runs left out: they trained while another run" in v.evidence
    partly = verdict("e", timings=run_times(ms, shared={1, 2}))  # R=1's runs overlapped: the rest still decide
    assert partly.verdict == SUPPORTED and "2 of 8 runs left out" in partly.evidence
    assert verdict("e", timings=run_times({1: [20.0], 64: [30.0]})).verdict == NOT_MEASURED
    assert verdict("e", timings=run_times({32: [20.0, 21.0, 22.0]})).verdict == NOT_MEASURED
    assert verdict("e").verdict == NOT_MEASURED


# --------------------------------------------------------------------------- the table

def test_every_claim_has_a_sentence_a_rule_naming_its_thresholds_and_a_verdict():
    verdicts = claims.judge(table3([]))
    assert [v.key for v in verdicts] == ["a", "b", "c", "d", "e"]
    assert all(v.verdict in claims.VERDICTS and v.sentence and v.rule.startswith(f"({v.key})") for v in verdicts)
    rules = {v.key: v.rule for v in verdicts}
    assert "±δ, δ = 0.02 nats" in rules["c"] and "R = 32" in rules["c"] and "1 %" in rules["d"] and "5 %" in rules["e"]
    assert "deterministic" in verdicts[3].power and verdicts[2].power and verdicts[4].power
    frame = claims.verdict_frame(verdicts)
    assert list(frame.columns) == ["claim", "verdict", "numbers"] and len(frame) == 5


# --------------------------------------------------------------------------- (e) by simulation

def test_e_slope_interval_covers_the_true_slope_and_its_power_is_the_simulated_rate():
    """Per-run step times 20 + 0.05·R + N(0, 1) ms at R 1, 8, 32, 64, 2 runs each: the slope's
    95 % interval covers 0.05 in ≥ 93 % of 1000 replicates, and the share of replicates whose
    interval excludes 0 is ``slope_power`` within 3 binomial SE."""
    rng = np.random.default_rng(26)
    x = np.repeat(RANKS, 2).astype(float)
    fits = [slope(x, 20 + 0.05 * x + rng.normal(0, 1.0, len(x))) for _ in range(1000)]
    assert np.mean([f.low <= 0.05 <= f.high for f in fits]) >= 0.93
    found = np.mean([f.low > 0 for f in fits])  # a one-sided share of the two-sided test: the other side is ~0
    power = slope_power(RANKS, 2, 1.0, 0.05)
    assert abs(found - power) <= 3 * math.sqrt(power * (1 - power) / 1000), (found, power)
    need = slope_runs_needed(RANKS, 1.0, 0.05)
    assert slope_power(RANKS, need, 1.0, 0.05) >= 0.8 > slope_power(RANKS, need - 1, 1.0, 0.05)


def test_shared_runs_are_those_that_overlapped_another_on_one_machine():
    from datetime import datetime, timedelta, timezone
    from types import SimpleNamespace

    t0 = datetime.now(timezone.utc) - timedelta(days=1)

    def run(i, start, end, owner="lab-a:11"):
        return SimpleNamespace(id=i, owner=owner, worker_id=None, started_at=t0 + timedelta(minutes=start),
                               finished_at=None if end is None else t0 + timedelta(minutes=end))

    records = [run(1, 0, 10), run(2, 5, 15, owner="lab-a:12"),  # one host, overlapping: both shared
               run(3, 20, 30), run(4, 30, 40),                   # back to back: alone
               run(5, 50, 60, owner="lab-b:1"), run(6, 50, 60, owner="lab-c:1"),  # two machines: alone
               run(7, 70, None), SimpleNamespace(id=8, owner=None, worker_id=None, started_at=None, finished_at=None)]
    assert shared_runs(records) == {1, 2}
    assert shared_runs([*records, run(9, 75, 76)]) == {1, 2, 7, 9}  # a run still going overlaps what starts after it


def test_run_time_frame_reads_each_runs_windows(tmp_path):
    from storage import RunStore
    from tests.support.runs import TINY, fake_run

    store = RunStore(f"sqlite:///{tmp_path / 't.db'}")
    ids = [fake_run(store, TINY.__class__(**{**TINY.to_dict(), "rank": r, "seed": 0})) for r in (4, 16)]
    ids.append(fake_run(store, TINY.__class__(**{**TINY.to_dict(), "estimator": "exact", "seed": 0})))
    records = store.runs.list_runs()
    frame = run_time_frame(records, store.metrics(ids))
    assert list(frame.columns) == RUN_TIME_COLUMNS and sorted(frame["run_id"]) == sorted(ids)
    rows = TINY.effective_batch_size * TINY.effective_seq_len
    assert np.allclose(frame["ms"], 1000.0 * rows / 1000.0) and (frame["windows"] == 4).all()  # 1000 tokens/s
    assert not frame["shared"].any()  # written one after another


def test_shared_runs_reads_the_runs_of_every_selection():
    """A run of another selection (``others``) that trained on the same machine at the same time
    shares it too; one on another machine, or at another time, does not; only ``records`` are marked."""
    from datetime import datetime, timedelta, timezone
    from types import SimpleNamespace

    t0 = datetime.now(timezone.utc) - timedelta(days=1)

    def run(i, start, end, owner="lab-a:11"):
        return SimpleNamespace(id=i, owner=owner, worker_id=None, started_at=t0 + timedelta(minutes=start),
                               finished_at=t0 + timedelta(minutes=end))

    mine = [run(1, 0, 10), run(2, 20, 30), run(3, 40, 50)]
    others = [run(11, 5, 8), run(12, 20, 30, owner="lab-b:1"), run(13, 60, 70), *mine]
    assert shared_runs(mine) == set() and shared_runs(mine, others) == {1}


def _loaded_runs(tmp_path, load):
    """Exact and basis at R = 4 and 16 over two seeds, written by ``fake_run`` one after another
    (none overlaps another), each recording the host load ``load`` at every window."""
    from storage import RunStore
    from tests.support.runs import TINY, fake_run

    store = RunStore(f"sqlite:///{tmp_path / 'load.db'}")
    ids = [fake_run(store, TINY.__class__(**{**TINY.to_dict(), "estimator": "exact", "seed": s})) for s in (0, 1)]
    ids += [fake_run(store, TINY.__class__(**{**TINY.to_dict(), "rank": r, "seed": s})) for r in (4, 16) for s in (0, 1)]
    for run_id in ids:
        store.metrics.add_metrics(run_id, [(step, 0.5, "sys/load1", load) for step in (10, 20, 30, 40)])
    return store, ids


def test_e_reads_the_host_load_each_run_recorded(tmp_path):
    """Step times measured while the host load exceeded its cores are not the method's: with every
    run at load 12.3 on 2 cores, (e) reads "not measured (machine shared)" and shows the load; the
    same runs read on 16 cores, or at load 1.5, are timed alone and decide it."""
    from engine.analysis.method_frames import LOAD_METRIC
    from engine.training.system import SYSTEM_METRICS

    assert LOAD_METRIC in SYSTEM_METRICS  # the name the training loop stores
    store, ids = _loaded_runs(tmp_path, 12.3)
    records, metrics = store.runs.list_runs(), store.metrics(ids)
    frame = run_time_frame(records, metrics, cores=2)
    assert (frame["load"] == 12.3).all() and (frame["cores"] == 2).all() and not frame["shared"].any()
    v = verdict("e", timings=frame)
    assert v.verdict == NOT_MEASURED
    assert "basis: not measured (machine shared): 4 of 4 runs left out: they trained while the host load exceeded " \
           "its cores (load 12.3 on 2 cores)" in v.evidence
    assert verdict("e", timings=run_time_frame(records, metrics, cores=16)).verdict == NOT_SUPPORTED  # 1000 tokens/s
    for run_id in ids:  # runs of version 5 record their host's cores: that count, not the reader's, is read
        store.metrics.add_metrics(run_id, [(0, 0.0, "sys/cores", 16.0)])
    counted = run_time_frame(store.runs.list_runs(), store.metrics(ids), cores=2)
    assert (counted["cores"] == 16).all() and verdict("e", timings=counted).verdict == NOT_SUPPORTED
    (tmp_path / "calm").mkdir()
    calm, calm_ids = _loaded_runs(tmp_path / "calm", 1.5)
    assert verdict("e", timings=run_time_frame(calm.runs.list_runs(), calm.metrics(calm_ids), cores=2)).verdict == \
        NOT_SUPPORTED


def test_slope_matches_linregress_and_a_perfect_line_has_a_point_interval():
    rng = np.random.default_rng(5)
    x = np.repeat(RANKS, 3).astype(float)
    y = 3 + 0.2 * x + rng.normal(0, 0.5, len(x))
    fit, ref = slope(x, y), stats.linregress(x, y)
    half = stats.t.ppf(0.975, len(x) - 2) * ref.stderr
    assert (fit.slope, fit.intercept) == pytest.approx((ref.slope, ref.intercept), rel=1e-12)
    assert (fit.low, fit.high) == pytest.approx((ref.slope - half, ref.slope + half), rel=1e-12)
    flat = slope(x, np.full(len(x), 64.0))  # every run timed the same (linregress gives no error here)
    assert (flat.slope, flat.low, flat.high, flat.low90, flat.high90, flat.residual_sd) == (0, 0, 0, 0, 0, 0)
    assert np.isnan(slope([1.0, 64.0], [20.0, 30.0]).low) and np.isnan(slope([8.0] * 3, [1.0, 2.0, 3.0]).slope)
