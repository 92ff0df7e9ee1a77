"""The claims rules (``engine.analysis.claims``) on fixed tables: one case per verdict per claim."""


import numpy as np
import pandas as pd
import pytest

from engine.analysis import claims
from engine.analysis.claims import NOT_MEASURED, NOT_SUPPORTED, SUPPORTED
from engine.analysis.summary import TABLE3_COLUMNS

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


def verdict(key, t3=None, diag=None, times=None):
    t3 = table3([]) if t3 is None else t3
    out = {v.key: v for v in claims.judge(t3, diag, times)}
    return out[key]


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

def test_c_supported_when_the_interval_holds_zero_and_the_gap_is_small():
    v = verdict("c", table3([delta_row(32, 0.005, -0.01, 0.02), delta_row(8, 0.5, 0.4, 0.6)]))
    assert v.verdict == SUPPORTED
    assert v.evidence == "basis R=32 λ=0.01: Δ +0.0050 [-0.0100, +0.0200] over 3 seeds at step 1000"


@pytest.mark.parametrize("mean, low, high", [(0.122, 0.084, 0.159), (0.03, -0.05, 0.11), (-0.025, -0.04, -0.01)],
                         ids=["interval-above-zero", "gap-too-large", "better-but-not-a-match"])
def test_c_not_supported_when_the_interval_excludes_zero_or_the_gap_is_large(mean, low, high):
    assert verdict("c", table3([delta_row(32, mean, low, high)])).verdict == NOT_SUPPORTED


def test_c_not_measured_with_one_seed_or_no_row():
    assert verdict("c", table3([delta_row(32, 0.0, np.nan, np.nan, seeds=1)])).verdict == NOT_MEASURED
    assert verdict("c", table3([delta_row(16, 0.0, -0.1, 0.1)])).verdict == NOT_MEASURED


def test_c_every_lambda_must_match():
    rows = [delta_row(32, 0.0, -0.01, 0.01), {**delta_row(32, 0.1, 0.05, 0.15), "lam": 0.0}]
    assert verdict("c", table3(rows)).verdict == NOT_SUPPORTED


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

def test_e_supported_when_small_sketches_step_faster():
    v = verdict("e", times=step_times({1: 21.3, 8: 22.0, 32: 25.4, 64: 26.0}, exact=24.0))
    assert v.verdict == SUPPORTED
    assert "R=1 21.30" in v.evidence and "exact 24.00" in v.evidence and "18.1 % faster" in v.evidence
    assert "ρ(R, time) = +1.00" in v.evidence


@pytest.mark.parametrize("ms", [{1: 25.0, 64: 25.5}, {1: 30.0, 8: 20.0, 64: 25.0}, {1: 26.0, 64: 25.0}],
                         ids=["within-5-percent", "rank-order-wrong", "slower"])
def test_e_not_supported(ms):
    assert verdict("e", times=step_times(ms)).verdict == NOT_SUPPORTED


def test_e_not_measured_without_two_timed_ranks():
    assert verdict("e", times=step_times({32: 25.0}, exact=24.0)).verdict == NOT_MEASURED
    assert verdict("e").verdict == NOT_MEASURED


# --------------------------------------------------------------------------- the table

def test_every_claim_has_a_sentence_a_rule_naming_its_thresholds_and_a_verdict():
    verdicts = claims.judge(table3([]))
    assert [v.key for v in verdicts] == ["a", "b", "c", "d", "e"]
    assert all(v.verdict in claims.VERDICTS and v.sentence and v.rule.startswith(f"({v.key})") for v in verdicts)
    rules = {v.key: v.rule for v in verdicts}
    assert "|Δ| < 0.02" in rules["c"] and "R = 32" in rules["c"] and "1 %" in rules["d"] and "5 %" in rules["e"]
    frame = claims.verdict_frame(verdicts)
    assert list(frame.columns) == ["claim", "verdict", "numbers"] and len(frame) == 5
