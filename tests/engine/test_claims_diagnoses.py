"""Claims (a) and (b) on diagnoses with per-key values (``engine.analysis.claims`` with
``engine.analysis.keystats``): the rules, and the coverage of their intervals against a
closed form on real estimators.

The closed form: for hash sketches without scalars, e = Xᵀ(SᵀS − I)dY has
E‖e‖² = P(h(b) = h(b')) · Σ_{b≠b'} (‖x_b‖²‖dy_b'‖² + ⟨x_b, x_b'⟩⟨dy_b, dy_b'⟩) (the signs
kill every other pair), with P = 1/R for uniform hashing and (B/R − 1)/(B − 1) for balanced
hashing when R divides B. The balanced/countsketch variance ratio is therefore exactly
(B − R)/(B − 1), whatever X and dY: 0.8 at B = 16, R = 4.
"""

import jax
import numpy as np
import pandas as pd
import pytest

from engine.analysis import claims, keystats
from engine.analysis.claims import NOT_MEASURED, NOT_SUPPORTED, SUPPORTED
from engine.analysis.diagnostics import key_values

REPS = 400


def _values(rng, keys, scale, bias=0.0, d=40, z=None):
    """A ``keystats.pack`` array of one batch: errors e_k ~ N(bias, scale² I_d); ``z`` shares draws."""
    z = rng.standard_normal((keys, d)) if z is None else z
    e = bias + scale * z
    return keystats.pack([1.0], ((e**2).sum(1))[None], (((e - e.mean(0)) ** 2).sum(1))[None])


def _rows(values_by_setting, diagnosis_id=1):
    """Pooled rows carrying per-key values: {(estimator, rank): pack array}."""
    rows = []
    for (estimator, rank), values in values_by_setting.items():
        s = keystats.summary(values)
        rows.append({"diagnosis_id": diagnosis_id, "run_id": 1, "layer": "all", "estimator": estimator,
                     "rank": rank, "lam": 0.0, **{k: s[k] for k in ("bias2", "variance", "mse")},
                     "keys": (values.shape[1] - 1) // 2, claims.KEY_VALUES: values})
    return pd.DataFrame(rows)


def _verdict(key, diag):
    return {v.key: v for v in claims.judge(pd.DataFrame(columns=["estimator", "rank"]), diag)}[key]


def test_a_leaves_out_r_1_where_the_hashings_are_one_distribution():
    rng = np.random.default_rng(0)
    z = rng.standard_normal((64, 40))
    same = {("balanced", 1): _values(rng, 64, 1.0, z=z), ("countsketch", 1): _values(rng, 64, 1.0, z=z)}
    assert _verdict("a", _rows(same)).verdict == NOT_MEASURED
    lower = {**same, ("balanced", 8): _values(rng, 64, 0.7), ("countsketch", 8): _values(rng, 64, 1.0)}
    v = _verdict("a", _rows(lower))
    assert v.verdict == SUPPORTED and "R=1" not in v.evidence and "R=8" in v.evidence
    assert "intervals: per-key delta method, t with 63 df" in v.evidence


def test_per_key_intervals_are_narrower_than_the_bound_and_old_rows_keep_the_bound():
    """Errors in 40 equal directions: the per-key interval of the variance ratio is about
    √(40) narrower on the log scale than the worst-case bound of the same moments."""
    rng = np.random.default_rng(1)
    new = _rows({("balanced", 8): _values(rng, 64, 0.9), ("countsketch", 8): _values(rng, 64, 1.0)})
    old = new.drop(columns=[claims.KEY_VALUES])
    g_new, = claims.compared(new, "balanced", "countsketch")
    g_old, = claims.compared(old, "balanced", "countsketch")
    width = lambda r: np.log(r.high / r.low)
    assert g_new.variance_ratio.method == keystats.DELTA and g_old.variance_ratio.method == keystats.BOUND
    assert width(g_new.variance_ratio) < width(g_old.variance_ratio) / 4
    assert g_new.variance_ratio.reading == "lower" and g_old.variance_ratio.reading == "within noise"
    assert claims.BOUND_TEXT in _verdict("a", old).evidence


def test_b_reads_no_effect_when_the_variance_ratio_lies_inside_the_margin():
    """Scalars on and off on shared keys with nearly equal errors: a tight interval around
    1 is 'no effect', which contradicts 'lower variance'."""
    rng = np.random.default_rng(2)
    z = rng.standard_normal((256, 40))
    values = {("scalars", 8): _values(rng, 256, 1.0, z=z + 0.01 * rng.standard_normal(z.shape)),
              ("countsketch", 8): _values(rng, 256, 1.0, z=z)}
    v = _verdict("b", _rows(values))
    assert v.verdict == NOT_SUPPORTED and "no effect" in v.evidence


@pytest.mark.parametrize("bias, verdict", [(0.05, SUPPORTED), (0.4, NOT_SUPPORTED)], ids=["a-little", "not-a-little"])
def test_b_tests_the_bias_half(bias, verdict):
    """Variance 0.8× on shared keys; the scalars add bias² 40·bias² against an MSE of 40:
    0.0025 of it is a little, 0.16 is not (BIAS_MARGIN 0.1)."""
    rng = np.random.default_rng(3)
    z = rng.standard_normal((256, 40))
    values = {("scalars", 8): _values(rng, 256, np.sqrt(0.8), bias=bias, z=z),
              ("countsketch", 8): _values(rng, 256, 1.0, z=z)}
    v = _verdict("b", _rows(values))
    assert v.verdict == verdict
    assert ("not a little" in v.evidence) == (verdict == NOT_SUPPORTED)


def _balanced_vs_countsketch(x, dy, rank, keys, key):
    pk = [keystats.per_key(keystats.pack([kv.dw_norm2], kv.sq[None], kv.dev[None]))
          for kv in (key_values(x, dy, (x.shape[1], dy.shape[1]), e, rank, 0.0, keys, key)
                     for e in ("balanced", "countsketch"))]
    return claims.key_ratio(pk[0].variance, pk[1].variance)


def test_the_variance_ratio_of_real_estimators_covers_the_closed_form():
    """Synthetic X (B 16 × N 24) and dY (16 × 40), R = 4, the default K = 81 shared keys per
    replicate, through the estimators' own VJPs: the delta interval covers
    (B − R)/(B − 1) = 0.8 in at least 93 % of 400 replicates. (At K = 32 it covered 92.5 %
    here: with B = 16 the errors spread over few directions, and the ratio's skew shows.)"""
    b, rank = 16, 4
    kx, kd = jax.random.split(jax.random.key(0))
    x = jax.random.normal(kx, (b, 24)) * jax.numpy.linspace(0.5, 2.0, b)[:, None]
    dy = jax.random.normal(kd, (b, 40))
    truth = (b - rank) / (b - 1)
    covered = 0
    for i in range(REPS):
        r = _balanced_vs_countsketch(x, dy, rank, keystats.DEFAULT_KEYS, jax.random.key(100 + i))
        covered += r.low <= truth <= r.high
    assert covered / REPS >= 0.93, covered


def test_the_default_keys_detect_a_ratio_of_0_8_on_real_estimators():
    """The same closed-form ratio 0.8, K = DEFAULT_KEYS (81): the interval reads "lower" in at
    least 80 % of 100 replicates (the errors here spread over more directions than the
    planning CV assumes, so the power is higher)."""
    b, rank = 16, 4
    kx, kd = jax.random.split(jax.random.key(1))
    x, dy = jax.random.normal(kx, (b, 24)), jax.random.normal(kd, (b, 40))
    lower = sum(_balanced_vs_countsketch(x, dy, rank, keystats.DEFAULT_KEYS, jax.random.key(500 + i)).reading
                == "lower" for i in range(100))
    assert lower >= 80, lower


def test_a_and_b_say_how_many_keys_decide_them_and_what_the_stored_k_gives():
    """The plan of (a) and (b) is the power rule's K and the power of the K actually stored."""
    import pandas as pd

    from engine.analysis import claims, keystats

    diag = pd.DataFrame([{"diagnosis_id": 1, "run_id": 1, "layer": claims.POOLED_LAYER, "estimator": "balanced",
                          "rank": 8, "lam": 0.0, "bias2": 0.0, "variance": 1.0, "mse": 1.0, "keys": 32}])
    verdicts = {v.key: v for v in claims.judge(pd.DataFrame(), diag)}
    for key in "ab":
        plan = verdicts[key].power
        assert f"{keystats.DEFAULT_KEYS} keys per diagnosis" in plan
        assert f"K = 32 gives {keystats.power(keystats.PLAN_RATIO, 32):.0%}" in plan
    assert keystats.power(keystats.PLAN_RATIO, keystats.DEFAULT_KEYS) >= keystats.PLAN_POWER
    assert keystats.power(keystats.PLAN_RATIO, keystats.DEFAULT_KEYS - 1) < keystats.PLAN_POWER
