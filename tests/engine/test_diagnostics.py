"""Estimator diagnostics: moments over keys checked against NumPy and against the math."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from engine.analysis import keystats
from engine.analysis.diagnostics import COLUMNS, KEY_VALUES, capture, diagnose, dw_moments, key_values, reduce
from engine.core.estimators import REGISTRY, lookup
from engine.core.presets import GPTConfig
from engine.model.gpt import init_params, loss_fn
from engine.sketch.basis import sketched_matmul

UNBIASED = [e.name for e in REGISTRY.values() if e.bias == "unbiased"]


def _xdy(b=24, n=5, m=3, seed=0):
    kx, kd = jax.random.split(jax.random.key(seed))
    x = jax.random.normal(kx, (b, n)).at[jnp.array([1, 7])].multiply(8.0)  # two heavy rows
    return x, jax.random.normal(kd, (b, m))


def _numpy_moments(x, dy, estimator, rank, lam, keys, key):
    """The same K sketched dWs, one key at a time without vmap, moments in float64."""
    w = jnp.zeros((x.shape[1], dy.shape[1]))
    grad = jax.jit(jax.grad(lambda w, k: jnp.sum(dy * sketched_matmul(x, w, k, rank=rank, lam=lam, estimator=estimator))))
    dws = np.stack([np.asarray(grad(w, k), np.float64) for k in jax.random.split(key, keys)])
    dw = np.asarray(x, np.float64).T @ np.asarray(dy, np.float64)
    err = dws - dw
    variance = np.sum((err - err.mean(0)) ** 2) / (keys - 1)
    cos = np.tensordot(dws, dw, 2) / (np.linalg.norm(dws, axis=(1, 2)) * np.linalg.norm(dw))
    return dict(
        dw_norm2=np.sum(dw**2), bias2=np.sum(err.mean(0) ** 2) - variance / keys,
        variance=variance, mse=np.mean(np.sum(err**2, axis=(1, 2))), cos_mean=cos.mean(),
    )


@pytest.mark.parametrize("estimator,rank,lam", [("basis", 4, 0.1), ("crs", 3, 0.0), ("wta-crs", 6, 0.2), ("proj", 4, 0.0)])
def test_moments_match_a_direct_numpy_computation(estimator, rank, lam):
    """40 keys in chunks of 16 (16 + 16 + 8: the host merge of chunks is exercised)."""
    x, dy = _xdy()
    key = jax.random.key(3)
    got = dw_moments(x, dy, (5, 3), estimator, rank, lam, 40, key, chunk=16)
    want = _numpy_moments(x, dy, estimator, rank, lam, 40, key)
    assert got.keys == 40
    for name, value in want.items():
        # float32 dW on the device against float64 moments of the same float32 dWs
        np.testing.assert_allclose(getattr(got, name), value, rtol=2e-4, atol=2e-6 * want["dw_norm2"], err_msg=name)
    np.testing.assert_allclose(got.mse, got.bias2 + got.variance, rtol=1e-5)  # float32 sums


@pytest.mark.parametrize("estimator", UNBIASED)
def test_unbiased_estimators_have_zero_bias_within_their_standard_error(estimator):
    """|b²| ≤ 4·se with the conservative se of the module docstring (an upper bound
    on the standard deviation of b², so a false failure is rarer than a 4σ event)."""
    x, dy = _xdy(seed=1)
    m = dw_moments(x, dy, (5, 3), estimator, 4, 0.0, 512, jax.random.key(0), chunk=128)
    assert m.variance > 0
    assert abs(m.bias2) <= 4 * m.bias2_se


def test_biased_estimator_is_detected():
    """basis at R = 1 on X = [a; a], dY = [c; d], c ⊥ d (test_basis's example):
    E[d̂W] = dW/√2, so b²/‖dW‖² = (1 − 1/√2)² ≈ 0.086, far outside 4·se."""
    a = jnp.array([[1.0, 2.0, -1.0]])
    x, dy = jnp.concatenate([a, a]), jnp.eye(2)
    m = dw_moments(x, dy, (3, 2), "basis", 1, 0.0, 2048, jax.random.key(0), chunk=256)
    assert m.bias2 > 4 * m.bias2_se
    np.testing.assert_allclose(m.bias2 / m.dw_norm2, (1 - 2**-0.5) ** 2, atol=6 * m.bias2_se / m.dw_norm2)


@pytest.mark.parametrize("estimator", UNBIASED)
def test_variance_falls_with_rank(estimator):
    x, dy = _xdy(b=32, seed=2)
    low, high = (dw_moments(x, dy, (5, 3), estimator, r, 0.0, 256, jax.random.key(r), chunk=128) for r in (2, 8))
    assert high.variance < low.variance


@pytest.mark.parametrize("estimator", ["basis", "balanced"])
@pytest.mark.parametrize("lam", [0.0, 0.1, 0.3])
def test_full_rank_basis_and_balanced_have_zero_variance_and_shrink_bias(estimator, lam):
    """R = B: d̂W = (1 − λ)² dW for every key, so V = 0 and b²/‖dW‖² = (1 − (1 − λ)²)²
    (up to float32 rounding of the sketched dW, relative 1e-6 per entry)."""
    x, dy = _xdy()
    m = dw_moments(x, dy, (5, 3), estimator, 24, lam, 64, jax.random.key(0), chunk=32)
    assert m.variance <= 1e-10 * m.dw_norm2
    np.testing.assert_allclose(m.bias2 / m.dw_norm2, (1 - (1 - lam) ** 2) ** 2, rtol=1e-5, atol=1e-10)
    np.testing.assert_allclose(m.cos_mean, 1.0, rtol=1e-6)


TINY = GPTConfig(vocab_size=64, seq_len=8, d_model=16, n_heads=2, n_layers=1)


def test_capture_gives_each_sketched_layer_its_exact_gradient():
    cfg = TINY.replace(sketched_layers="all")
    params = init_params(cfg, jax.random.key(0))
    batch = jax.random.randint(jax.random.key(1), (2, 9), 0, 64)
    grads = jax.grad(lambda p: loss_fn(cfg, p, batch, None))(params)
    captured = capture(cfg, params, batch)
    assert set(captured) == {"/".join(p) for p in cfg.sketched_kernel_paths()}
    for path in cfg.sketched_kernel_paths():
        x, dy = captured["/".join(path)]
        assert x.shape[0] == dy.shape[0] == 2 * 8
        kernel = grads
        for part in path:
            kernel = kernel[part]
        np.testing.assert_allclose(x.T @ dy, kernel["kernel"], rtol=1e-5, atol=1e-7)


def test_diagnose_table_and_pooling():
    params = init_params(TINY, jax.random.key(0))
    batches = [jax.random.randint(jax.random.key(i), (2, 9), 0, 64) for i in (1, 2)]
    calls = []
    df = diagnose(
        TINY, params, batches, estimators=["balanced", "crs"], ranks=[16], lams=[0.0, 0.2],
        keys=8, key=jax.random.key(5), chunk=4, on_progress=lambda d, t: calls.append((d, t)),
    )
    assert tuple(df.columns) == (*COLUMNS, KEY_VALUES)
    for row in df.itertuples():  # each row's moments are its per-key values' (keystats.summary)
        values = getattr(row, KEY_VALUES)
        assert values.shape == (2, 1 + 2 * 8)
        for name, value in keystats.summary(values).items():
            assert getattr(row, name) == pytest.approx(value, rel=1e-12, abs=1e-300)
    by_layer = df[(df.estimator == "crs") & (df.lam == 0.0)].set_index("layer")[KEY_VALUES]
    np.testing.assert_allclose(by_layer["all"], sum(by_layer.drop("all")))  # the pooled row sums the layers
    layers = {"block_0/mlp/fc", "block_0/mlp/proj", "head", "all"}
    assert set(df.layer) == layers and len(df) == 4 * 2 * 2
    assert calls[-1] == (8, 8) and len(calls) == 8
    np.testing.assert_allclose(df.mse, df.bias2 + df.variance, rtol=1e-5, atol=1e-12)
    full = df[df.estimator == "balanced"]  # R = B·T = 16: exact times (1 − λ)²
    for lam in (0.0, 0.2):
        rows = full[full.lam == lam]
        np.testing.assert_allclose(rows.bias2, (1 - (1 - lam) ** 2) ** 2, rtol=1e-5, atol=1e-10)
        assert np.all(rows.variance <= 1e-10)
    crs = df[(df.estimator == "crs") & (df.lam == 0.0)].set_index("layer")
    parts = crs.drop(index="all")
    # pooled = Σ numerators / Σ ‖dW‖², so it lies between the layers' ratios
    assert parts.mse.min() <= crs.loc["all", "mse"] <= parts.mse.max()
    assert (df["keys"] == 8).all() and (df.batches == 2).all()


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(keys=1), "keys must be an integer >= 2"),
        (dict(chunk=0), "chunk must be an integer >= 1"),
        (dict(estimator="sketchy"), "unknown estimator"),
        (dict(w_shape=(4, 3)), "shape mismatch"),
    ],
)
def test_dw_moments_rejects_bad_arguments(kwargs, match):
    x, dy = _xdy()
    args = dict(w_shape=(5, 3), estimator="crs", rank=2, lam=0.0, keys=8, key=jax.random.key(0), chunk=4)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        dw_moments(x, dy, **args)


def test_diagnose_rejects_empty_batches():
    with pytest.raises(ValueError, match="batches is empty"):
        diagnose(TINY, init_params(TINY, jax.random.key(0)), [], estimators=["crs"], ranks=[2], lams=[0.0], keys=4, key=jax.random.key(0))


ALL = [e.name for e in REGISTRY.values() if not e.exact]


@pytest.mark.parametrize("estimator", ALL)
def test_the_row_space_reduction_keeps_every_key_s_values(estimator):
    """N, M > B: the per-key ‖e‖², ‖e − ē‖² and cosines of (X', dY') from ``reduce`` are those
    of (X, dY) themselves, key by key (the module docstring's lemma), through the estimator's
    own VJP on both; two heavy rows and a repeated row make the row norms and γ matter."""
    b, n, m = 12, 20, 30
    kx, kd = jax.random.split(jax.random.key(4))
    x = jax.random.normal(kx, (b, n)).at[1].multiply(6.0)
    x = x.at[5].set(x[3])
    dy = jax.random.normal(kd, (b, m)).at[7].multiply(4.0)
    from engine.analysis import diagnostics
    row_space = lookup(estimator).row_space  # False: X keeps its feature axis whole (proj, velora)
    xr, dyr = reduce(x, dy)[row_space]
    assert dyr.shape == (b, b) and xr.shape == ((b, b) if row_space else (b, n))
    keys = jax.random.split(jax.random.key(9), 16)
    direct = diagnostics._values(x, dy, estimator, 3, 0.1, keys, 16)
    reduced = diagnostics._values(xr, dyr, estimator, 3, 0.1, keys, 16)
    assert reduced.dw_norm2 == pytest.approx(direct.dw_norm2, rel=1e-5)
    for name in ("sq", "dev"):
        np.testing.assert_allclose(getattr(reduced, name), getattr(direct, name), rtol=2e-4,
                                   atol=1e-5 * direct.dw_norm2, err_msg=name)
    np.testing.assert_allclose(reduced.cos, direct.cos, atol=2e-5)


@pytest.mark.parametrize("with_scalars, without", [("basis", "balanced"), ("scalars", "countsketch")])
def test_scalars_on_and_off_share_their_sketch_key_by_key(with_scalars, without):
    """The same key gives both the same S, so the scalars' d̂W is γ_X·γ_dY times the other's:
    their cosines to dW agree key by key (and the keys differ from one another)."""
    x, dy = _xdy(b=32, n=6, m=4, seed=5)
    a, b = (key_values(x, dy, (6, 4), e, 4, 0.0, 24, jax.random.key(11)) for e in (with_scalars, without))
    np.testing.assert_allclose(a.cos, b.cos, atol=1e-5)
    assert np.ptp(a.cos) > 0.05
    assert not np.allclose(a.sq, b.sq)  # γ scales the error: the two estimators differ


def test_every_setting_of_a_diagnosis_draws_the_same_keys():
    """basis and balanced rows of one diagnosis agree on each key's cosine (shared S); the
    per-key ‖e‖² of a setting does not depend on which other settings were asked for."""
    params = init_params(TINY, jax.random.key(0))
    batches = [jax.random.randint(jax.random.key(1), (2, 9), 0, 64)]
    kw = dict(ranks=[4], lams=[0.0], keys=6, key=jax.random.key(5))
    both = diagnose(TINY, params, batches, estimators=["basis", "balanced", "crs"], **kw)
    alone = diagnose(TINY, params, batches, estimators=["crs"], **kw)
    crs = lambda df: df[(df.estimator == "crs") & (df.layer == "head")][KEY_VALUES].iloc[0]
    np.testing.assert_allclose(crs(both), crs(alone), rtol=1e-6)
