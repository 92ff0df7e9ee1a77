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


def diagnoses(values):
    """Pooled diagnosis rows: {(estimator, rank): (bias2, variance)}; MSE = bias² + variance."""
    rows = [{"diagnosis_id": 1, "run_id": 1, "layer": "all", "estimator": e, "rank": r, "lam": 0.0, "bias2": b,
             "variance": v, "mse": b + v} for (e, r), (b, v) in values.items()]
    rows.append({"diagnosis_id": 1, "run_id": 1, "layer": "head", "estimator": "countsketch", "rank": 1, "lam": 0.0,
                 "bias2": 0.0, "variance": 1e-9, "mse": 1e-9})  # a per-layer row: not what the rules read
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

def test_a_supported_when_balanced_hashing_has_lower_variance_at_every_rank():
    v = verdict("a", diag=diagnoses({("balanced", 1): (0, 0.9), ("countsketch", 1): (0, 1.1),
                                     ("balanced", 8): (0, 0.5), ("countsketch", 8): (0, 0.6)}))
    assert v.verdict == SUPPORTED
    assert "variance balanced vs countsketch: R=1 0.9 vs 1.1, R=8 0.5 vs 0.6" in v.evidence


def test_a_not_supported_when_one_rank_is_not_lower():
    v = verdict("a", diag=diagnoses({("balanced", 1): (0, 0.9), ("countsketch", 1): (0, 1.1),
                                     ("balanced", 8): (0, 0.6), ("countsketch", 8): (0, 0.6),
                                     ("basis", 1): (0.1, 0.5), ("scalars", 1): (0.1, 0.7)}))
    assert v.verdict == NOT_SUPPORTED  # balanced = countsketch at R=8, although basis beats scalars


def test_a_not_measured_without_a_pair():
    assert verdict("a").verdict == NOT_MEASURED
    assert verdict("a", diag=diagnoses({("balanced", 1): (0, 0.9), ("countsketch", 8): (0, 1.1)})).verdict == NOT_MEASURED


def test_a_reads_the_mean_over_diagnoses():
    d = diagnoses({("balanced", 1): (0, 0.9), ("countsketch", 1): (0, 1.0)})
    second = d.assign(diagnosis_id=2)
    second.loc[second["estimator"] == "balanced", "variance"] = 1.3  # mean 1.1 > 1.0
    assert verdict("a", diag=pd.concat([d, second])).verdict == NOT_SUPPORTED


# --------------------------------------------------------------------------- (b)

def test_b_supported_when_scalars_add_less_bias_than_they_remove_variance():
    v = verdict("b", diag=diagnoses({("scalars", 8): (0.02, 0.5), ("countsketch", 8): (0.0, 0.6),
                                     ("basis", 64): (0.0, 0.0), ("balanced", 64): (0.0, 0.0)}))  # exact at R=B·T: left out
    assert v.verdict == SUPPORTED
    assert "scalars vs countsketch: R=8 bias² 0.02 vs 0, variance 0.5 vs 0.6, MSE 0.52 vs 0.6" in v.evidence


@pytest.mark.parametrize("scalars", [(0.2, 0.5), (0.0, 0.7)], ids=["more-bias-than-variance-removed", "higher-variance"])
def test_b_not_supported_when_the_trade_does_not_pay(scalars):
    v = verdict("b", diag=diagnoses({("scalars", 8): scalars, ("countsketch", 8): (0.0, 0.6)}))
    assert v.verdict == NOT_SUPPORTED


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
