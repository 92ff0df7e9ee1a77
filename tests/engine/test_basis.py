"""The sketched matmul checked against the math of Algorithm 1."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.ad_checkpoint import saved_residuals

from engine.core.choices import ESTIMATORS
from engine.core.estimators import REGISTRY, lookup
from engine.sketch.basis import (
    SKETCH_METHODS,
    apply_sketch,
    axis_sum,
    bfloat16_terms,
    draw_sketch,
    projection_width,
    sample_rows,
    sketch_method,
    sketch_rows,
    sketched_matmul,
)
from engine.sketch.draws import _argsort

SKETCHED = [e for e in ESTIMATORS if e != "exact"]
SAMPLING = [e.name for e in REGISTRY.values() if e.samples_rows]
UNBIASED = [e.name for e in REGISTRY.values() if e.bias == "unbiased"]  # c²-unbiased and random
PEERS = [e.name for e in REGISTRY.values() if not e.exact and e.draws is None]  # no S: sampling, projection, compression
HASH_KIND = {"balanced": "balanced", "uniform": "uniform"}


def _data(shape_x=(4, 16, 12), m=7, seed=0):
    kx, kw, kg = jax.random.split(jax.random.key(seed), 3)
    x = jax.random.normal(kx, shape_x)
    w = jax.random.normal(kw, (shape_x[-1], m))
    g = jax.random.normal(kg, (*shape_x[:-1], m))
    return x, w, g


def _grads(x, w, g, key, **kw):
    """(dX, dW) of the loss Σ g ⊙ (x @ w): a loss linear in y, so dY = g."""
    loss = lambda x, w: jnp.sum(g * sketched_matmul(x, w, key, **kw))
    return jax.grad(loss, argnums=(0, 1))(x, w)


@pytest.mark.parametrize("estimator", ESTIMATORS)
@pytest.mark.parametrize("rank", [1, 5, 64])
def test_dx_is_exact_for_every_estimator(estimator, rank):
    x, w, g = _data()
    dx, _ = _grads(x, w, g, jax.random.key(1), rank=rank, lam=0.3, estimator=estimator)
    np.testing.assert_allclose(dx, g @ w.T, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_forward_is_the_exact_product(estimator):
    x, w, _ = _data()
    y = sketched_matmul(x, w, jax.random.key(2), rank=3, lam=0.5, estimator=estimator)
    np.testing.assert_allclose(y, x @ w, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("estimator", ["basis", "balanced"])
@pytest.mark.parametrize("lam", [0.0, 0.01, 0.25])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_full_rank_balanced_sketch_gives_exact_dw_times_shrink(estimator, lam, seed):
    x, w, g = _data()
    b = 4 * 16
    exact_dw = x.reshape(b, -1).T @ g.reshape(b, -1)
    for rank in (b, 10 * b):  # R > B is clipped to B
        _, dw = _grads(x, w, g, jax.random.key(seed), rank=rank, lam=lam, estimator=estimator)
        np.testing.assert_allclose(dw, exact_dw * (1 - lam) ** 2, rtol=1e-5, atol=1e-5)


def _dense_s(kind, rows, rank, key):
    """S itself, read off by sketching the identity: S I_B = S."""
    return np.asarray(apply_sketch(draw_sketch(key, kind, rows, rank), jnp.eye(rows)))


@pytest.mark.parametrize("rows,rank", [(64, 8), (50, 8), (7, 3), (13, 13), (9, 1), (300, 7), (520, 520)])
def test_balanced_hash_fills_every_bin_evenly(rows, rank):
    for seed in range(5):
        s = _dense_s("balanced", rows, rank, jax.random.key(seed))
        assert s.shape == (rank, rows)
        assert np.all(np.abs(s[s != 0]) == 1.0)
        np.testing.assert_array_equal((s != 0).sum(axis=0), 1)  # every row in one bin
        per_bin = (s != 0).sum(axis=1)
        assert set(per_bin) <= {rows // rank, -(-rows // rank)}
        assert per_bin.sum() == rows


def test_uniform_hash_is_a_signed_assignment_with_uneven_bins():
    s = _dense_s("uniform", 64, 8, jax.random.key(0))
    np.testing.assert_array_equal((s != 0).sum(axis=0), 1)
    assert np.all(np.abs(s[s != 0]) == 1.0)
    assert len(set((s != 0).sum(axis=1))) > 1  # independent hashing: bins differ in size


@pytest.mark.parametrize("n,modulus", [(1, 0), (7, 0), (4096, 0), (300, 50), (64, 2)])
def test_fast_argsort_is_the_stable_argsort(n, modulus):
    """Distinct keys take the rank-inversion path; tied keys (taken mod a small
    modulus) fall back to jnp.argsort."""
    keys = jax.random.bits(jax.random.key(n), (n,), jnp.uint32)
    if modulus:
        keys = keys % modulus
    expect = np.argsort(np.asarray(keys), kind="stable")
    np.testing.assert_array_equal(_argsort(keys), expect)
    np.testing.assert_array_equal(jax.jit(_argsort)(keys), expect)
    batch = jnp.stack([keys, keys[::-1]])
    np.testing.assert_array_equal(jax.vmap(_argsort)(batch)[1], np.argsort(np.asarray(keys)[::-1], kind="stable"))


def _s_from_hash(sketch, rows):
    """S[h(b), b] = s(b), built entrywise from the hash and the signs."""
    s = np.zeros((sketch.rank, rows), np.float32)
    s[np.asarray(sketch.bins), np.arange(rows)] = np.asarray(sketch.signs)
    return s


# both ways apply_sketch computes S a: the one-hot product (few rows or small R) and the
# sign-split segment sum (many rows and larger R)
@pytest.mark.parametrize("rows,rank", [(64, 8), (200, 200), (1000, 1), (1000, 4), (300, 5), (1000, 40), (700, 700)])
@pytest.mark.parametrize("kind", ["balanced", "uniform"])
def test_apply_sketch_is_the_product_with_s(kind, rows, rank):
    sk = draw_sketch(jax.random.key(rows + rank), kind, rows, rank)
    a = jax.random.normal(jax.random.key(1), (rows, 5))
    np.testing.assert_allclose(apply_sketch(sk, a), _s_from_hash(sk, rows) @ np.asarray(a), rtol=1e-5, atol=1e-5)


# every way of applying S, forced on this CPU, against S built entrywise (NumPy) and
# against each other; bfloat16 inputs accumulate in float32
@pytest.mark.parametrize("rows,rank", [(64, 8), (50, 8), (200, 200), (1000, 1), (1000, 40), (301, 7), (9, 4)])
@pytest.mark.parametrize("kind", ["balanced", "uniform"])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_every_sketch_method_is_the_product_with_s(kind, rows, rank, dtype):
    sk = draw_sketch(jax.random.key(rows * rank), kind, rows, rank)
    a = jax.random.normal(jax.random.key(1), (rows, 6)).astype(dtype)
    oracle = _s_from_hash(sk, rows).astype(np.float64) @ np.asarray(a, np.float64)
    methods = SKETCH_METHODS if kind == "balanced" else ("dense", "segment", "dense-bf16")
    for method in methods:
        got = jax.jit(lambda a: apply_sketch(sk, a, method))(a)
        assert got.dtype == jnp.float32 and got.shape == (rank, 6)
        np.testing.assert_allclose(got, oracle, rtol=1e-5, atol=1e-5, err_msg=method)
    if kind == "uniform":
        with pytest.raises(ValueError, match="balanced sketch"):
            apply_sketch(sk, a, "gather")


def test_bfloat16_terms_sum_to_the_float32_input():
    """Three bfloat16 terms hold a float32 array to its own rounding: their float32 sum
    is a exactly (|a − Σ| ≤ 2⁻²⁷|a|), and S·a by bfloat16 products equals the float32 one."""
    a = jax.random.normal(jax.random.key(0), (300, 7)) * jnp.logspace(-20, 20, 7)
    terms = bfloat16_terms(a)
    assert len(terms) == 3 and all(t.dtype == jnp.bfloat16 for t in terms)
    total = terms[0].astype(jnp.float32) + terms[1].astype(jnp.float32) + terms[2].astype(jnp.float32)
    np.testing.assert_array_equal(total, a)
    b = a.astype(jnp.bfloat16)
    assert bfloat16_terms(b) == (b,)
    sk = draw_sketch(jax.random.key(1), "balanced", 300, 8)
    np.testing.assert_allclose(apply_sketch(sk, a, "dense-bf16"), apply_sketch(sk, a, "dense"), rtol=2e-6, atol=0)


def test_unknown_sketch_method_is_a_clear_error():
    sk = draw_sketch(jax.random.key(0), "balanced", 8, 2)
    with pytest.raises(ValueError, match="unknown sketch method 'scatter'; choose one of dense"):
        apply_sketch(sk, jnp.ones((8, 3)), "scatter")


@pytest.mark.parametrize("rows,rank", [(64, 8), (50, 8), (13, 13), (9, 1), (301, 7)])
def test_balanced_members_list_each_bin_in_slots_of_ceil_b_over_r(rows, rank):
    """Slot k·R + r holds the k-th row of bin r (B where bin r has fewer rows): every row
    once, each in its own bin, only the last layer padded."""
    sk = draw_sketch(jax.random.key(rows), "balanced", rows, rank)
    members = np.asarray(sk.members).reshape(-1, rank)
    assert members.shape == (-(-rows // rank), rank)
    real = members < rows
    assert np.all(real[:-1])
    np.testing.assert_array_equal(np.sort(members[real]), np.arange(rows))
    bins = np.asarray(sk.bins)
    for r in range(rank):
        np.testing.assert_array_equal(bins[members[real[:, r], r]], r)


def test_default_method_never_scatters_on_a_gpu_and_follows_measurements_on_cpu():
    balanced = draw_sketch(jax.random.key(0), "balanced", 4096, 32)
    uniform = draw_sketch(jax.random.key(0), "uniform", 4096, 32)
    assert sketch_method(balanced, 4096, "gpu") == "gather"
    assert sketch_method(uniform, 4096, "gpu") == "dense"
    assert sketch_method(draw_sketch(jax.random.key(0), "balanced", 4096, 4), 4096, "gpu") == "dense"
    assert sketch_method(balanced, 4096, "cpu") == "segment"
    assert sketch_method(balanced, 64, "cpu") == "dense"
    assert sketch_method(draw_sketch(jax.random.key(0), "balanced", 4096, 2), 4096, "cpu") == "dense"


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 13])
@pytest.mark.parametrize("axis", [0, 1, 2])
@pytest.mark.parametrize("backend", ["cpu", "gpu"])
def test_axis_sum_is_the_sum_over_that_axis(n, axis, backend):
    """Halving (the CPU's) or a direct reduce: Σ over ``axis`` to float rounding, at
    even and odd lengths."""
    shape = [3, 4, 5]
    shape[axis] = n
    a = jax.random.normal(jax.random.key(n), shape)
    got = jax.jit(lambda a: axis_sum(a, axis, backend))(a)
    np.testing.assert_allclose(got, np.asarray(a, np.float64).sum(axis), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows,rank", [(64, 8), (50, 8), (9, 4), (13, 13)])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_gather_takes_the_norm_from_the_same_pass_as_the_bins(rows, rank, dtype):
    """X̂ = c·γ·S a by ``gather`` (‖a‖ from the gathered rows, empty slots included)
    equals X̂ with ‖a‖ read separately (``dense``), and γ keeps ‖X̂‖ = c·‖a‖."""
    sk = draw_sketch(jax.random.key(rows + rank), "balanced", rows, rank)
    a = jax.random.normal(jax.random.key(2), (rows, 6)).astype(dtype)
    rows_by = {m: jax.jit(lambda a, m=m: sketch_rows(a, sk, scalars=True, shrink=0.9, method=m))(a)
               for m in ("gather", "dense")}
    np.testing.assert_allclose(rows_by["gather"], rows_by["dense"], rtol=1e-5, atol=1e-6)
    norm_a = np.linalg.norm(np.asarray(a, np.float64))
    np.testing.assert_allclose(np.linalg.norm(rows_by["gather"]), 0.9 * norm_a, rtol=1e-5)


def test_axis_sum_on_a_cpu_never_reduces_a_leading_axis():
    """XLA's CPU reduce over a leading axis of a wide array is the slow path (the binned
    head's 175 ms): on a CPU the sum is adds of halves, with no reduction at all."""
    a = jnp.ones((6, 32, 100))
    cpu = str(jax.make_jaxpr(lambda a: axis_sum(a, 0, "cpu"))(a))
    assert "reduce_sum" not in cpu and "add" in cpu
    assert "reduce_sum" in str(jax.make_jaxpr(lambda a: axis_sum(a, 0, "gpu"))(a))


@pytest.mark.parametrize("rows,rank", [(40, 4), (1000, 1), (1000, 40)])
def test_apply_sketch_leaves_out_rows_with_zero_sign(rows, rank):
    sk = draw_sketch(jax.random.key(3), "balanced", rows, rank)
    kept = jnp.arange(rows) % 3 != 0
    sk = sk._replace(signs=jnp.where(kept, sk.signs, 0.0))
    a = jax.random.normal(jax.random.key(1), (rows, 5))
    expect = apply_sketch(sk._replace(signs=sk.signs[kept], bins=sk.bins[kept]), a[kept])
    np.testing.assert_allclose(apply_sketch(sk, a), expect, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(apply_sketch(sk, a), _s_from_hash(sk, rows) @ np.asarray(a), rtol=1e-5, atol=1e-5)


def test_balanced_hash_permutes_rows_between_steps():
    a = _dense_s("balanced", 32, 4, jax.random.key(0))
    b = _dense_s("balanced", 32, 4, jax.random.key(1))
    assert not np.array_equal(a != 0, b != 0)


def _heavy_rows(x):
    """x with three rows scaled ×20: most of ‖x_b‖'s mass in a few rows, so wta-crs
    keeps some rows deterministically."""
    return x.at[jnp.array([2, 11, 17])].multiply(20.0)


@pytest.mark.parametrize(
    "estimator,heavy",
    [(e, False) for e in UNBIASED] + [("wta-crs", True), ("crs", True)],
)
@pytest.mark.parametrize("lam", [0.0, 0.2])
def test_unbiased_estimators_mean_converges_to_exact_dw(estimator, lam, heavy):
    """Monte Carlo over K keys: every entry of mean(dW) − (1−λ)² dW lies within
    z·σ/√K, with σ the sample std of that entry and z = 5.5: with 36 entries the
    chance of a false failure is below 36 · 4e-8 (Gaussian tails of the mean)."""
    x, w, g = _data(shape_x=(24, 4), m=3, seed=3)
    if heavy:
        x = _heavy_rows(x)
    k = 20000
    keys = jax.random.split(jax.random.key(11), k)
    dws = jax.jit(jax.vmap(lambda key: _grads(x, w, g, key, rank=4, lam=lam, estimator=estimator)[1]))(keys)
    dws = np.asarray(dws, np.float64)
    target = np.asarray(x.T @ g, np.float64) * (1 - lam) ** 2
    mean, std = dws.mean(axis=0), dws.std(axis=0, ddof=1)
    assert np.all(std > 0)  # a genuinely random estimator
    assert np.all(np.abs(mean - target) <= 5.5 * std / np.sqrt(k))


@pytest.mark.parametrize("estimator", ["basis", "scalars"])
def test_invariant_scalars_are_biased_with_the_predicted_factor(estimator):
    """X = [a; a], dY = [c; d] with c ⊥ d and |c| = |d|, R = 1. Signs agree with
    probability 1/2: X̂ = ±√2·a, dŶ = ±(c + d), so d̂W = √2·aᵀ(c + d); otherwise
    S X = 0 and d̂W = 0. Hence E[d̂W] = dW/√2 exactly: the scalars' bias."""
    a = jnp.array([[1.0, 2.0, -1.0]])
    x = jnp.concatenate([a, a])
    g = jnp.array([[1.0, 0.0], [0.0, 1.0]])
    w = jnp.zeros((3, 2))
    keys = jax.random.split(jax.random.key(0), 4000)
    dws = np.asarray(jax.vmap(lambda k: _grads(x, w, g, k, rank=1, estimator=estimator)[1])(keys))
    exact = np.asarray(x.T @ g)
    ratio = dws.mean(axis=0) / exact
    # the fraction of agreeing signs is Binomial(4000, 1/2): 5σ = 0.04 on the ratio
    np.testing.assert_allclose(ratio, 1 / np.sqrt(2), atol=0.04 * np.sqrt(2))
    assert np.all(np.isin(np.round(dws / (np.sqrt(2) * exact), 5), [0.0, 1.0]))


@pytest.mark.parametrize("estimator", ["basis", "scalars"])
@pytest.mark.parametrize("rank", [1, 3, 8, 40])
def test_invariant_scalars_keep_the_frobenius_norm(estimator, rank):
    x, _, _ = _data(shape_x=(40, 12))
    kind = "balanced" if estimator == "basis" else "uniform"
    for seed in range(4):
        sk = draw_sketch(jax.random.key(seed), kind, 40, rank)
        x_hat = sketch_rows(x, sk, scalars=True, shrink=1.0)
        assert x_hat.shape == (rank, 12)
        np.testing.assert_allclose(jnp.linalg.norm(x_hat), jnp.linalg.norm(x), rtol=1e-6)
        shrunk = sketch_rows(x, sk, scalars=True, shrink=0.9)
        np.testing.assert_allclose(jnp.linalg.norm(shrunk), 0.9 * jnp.linalg.norm(x), rtol=1e-6)


def _mean_cosine(estimator, x, w, g, n_keys=400):
    exact = np.asarray(x.T @ g).ravel()
    keys = jax.random.split(jax.random.key(5), n_keys)
    dws = jax.jit(jax.vmap(lambda k: _grads(x, w, g, k, rank=8, estimator=estimator)[1]))(keys)
    dws = np.asarray(dws).reshape(n_keys, -1)
    cos = dws @ exact / (np.linalg.norm(dws, axis=1) * np.linalg.norm(exact))
    return cos.mean(), cos.std(ddof=1) / np.sqrt(n_keys)


def test_balanced_hashing_reduces_variance_against_countsketch():
    x, w, g = _data(shape_x=(64, 16), m=16, seed=7)
    balanced, se_b = _mean_cosine("balanced", x, w, g)
    count, se_c = _mean_cosine("countsketch", x, w, g)
    assert balanced >= count
    assert 0.0 < count < 1.0 and 0.0 < balanced < 1.0


@pytest.mark.parametrize("estimator", SKETCHED)
def test_layer_saves_only_the_sketch_never_x(estimator):
    b, n, m, r = 64, 24, 40, 4
    x, w, _ = _data(shape_x=(4, 16, n), m=m)
    # Σ y keeps nothing of its own, so every residual below is the layer's
    loss = lambda x, w, key: jnp.sum(sketched_matmul(x, w, key, rank=r, estimator=estimator))
    saved = saved_residuals(loss, x, w, jax.random.key(0))
    shapes = [tuple(aval.shape) for aval, _ in saved]
    if lookup(estimator).gathers:  # R-row factors (proj keeps X P, B × ⌈R·N/B⌉; velora B × g)
        assert (r, n) in shapes
    for shape in shapes:
        assert shape not in {(b, n), (4, 16, n)}
        assert int(np.prod(shape)) < b * n
    assert not any("argument x" in why for _, why in saved)


def test_exact_estimator_saves_x():
    x, w, g = _data(shape_x=(64, 24), m=40)
    loss = lambda x, w: jnp.sum(g * sketched_matmul(x, w, None, rank=4, estimator="exact"))
    assert any("argument x" in why for _, why in saved_residuals(loss, x, w))


def test_bfloat16_input_keeps_dtypes_and_accumulates_in_float32():
    x, w, g = _data(shape_x=(256, 32), m=16)
    xb, wb = x.astype(jnp.bfloat16), w.astype(jnp.bfloat16)
    loss = lambda x, w: jnp.sum(g.astype(jnp.bfloat16) * sketched_matmul(x, w, jax.random.key(0), rank=256, estimator="basis")).astype(jnp.float32)
    dx, dw = jax.grad(loss, argnums=(0, 1))(xb, wb)
    assert dx.dtype == jnp.bfloat16 and dw.dtype == jnp.bfloat16
    exact = np.asarray(xb.astype(jnp.float32).T @ g.astype(jnp.bfloat16).astype(jnp.float32))
    np.testing.assert_allclose(np.asarray(dw, np.float32), exact, rtol=2e-2, atol=0.25)


@pytest.mark.parametrize("method", SKETCH_METHODS)
def test_balanced_dw_is_unbiased_on_bfloat16_inputs(method, monkeypatch):
    """Monte Carlo over K keys on bfloat16 x, w, dY (the ``balanced`` estimator: no
    scalars, E[d̂W] = c²·X̂ᵀdY exactly). The target is X̂ᵀ dY of the bfloat16 values,
    computed in float64: with sketches and their product accumulated in float32 the
    estimator's only error is float32 round-off (≤ 1e-6 relative here, far below the
    bound). Every entry of mean − target lies within 5.5·σ/√K (σ the sample std of
    that entry): with 36 entries a false failure has chance below 36 · 4e-8. The
    kernel is float32, so dW comes back unrounded (a bfloat16 kernel would round each
    sample, a bias of up to 2⁻⁹ relative that is not the estimator's)."""
    import engine.sketch.basis as basis

    monkeypatch.setattr(basis, "sketch_method", lambda sketch, rows, backend=None: method)
    x, w, g = _data(shape_x=(24, 4), m=3, seed=3)
    xb, gb = x.astype(jnp.bfloat16), g.astype(jnp.bfloat16)

    def dw(key):  # the layer's own forward and backward, x and dY in bfloat16
        _, residuals = basis._fwd(xb, w, key, 4, 0.2, "balanced", None, (0, 1))  # one device, its own draw
        return basis._bwd(4, 0.2, "balanced", None, (0, 1), residuals, gb)[1]

    k = 20000
    dws = np.asarray(jax.jit(jax.vmap(dw))(jax.random.split(jax.random.key(11), k)), np.float64)
    target = np.asarray(xb, np.float64).T @ np.asarray(gb, np.float64) * 0.8**2
    mean, std = dws.mean(axis=0), dws.std(axis=0, ddof=1)
    assert np.all(std > 0)
    assert np.all(np.abs(mean - target) <= 5.5 * std / np.sqrt(k))


def test_jit_matches_eager():
    x, w, g = _data()
    key = jax.random.key(4)
    eager = _grads(x, w, g, key, rank=6, estimator="basis")
    jitted = jax.jit(lambda x, w, k: _grads(x, w, g, k, rank=6, estimator="basis"))(x, w, key)
    for a, b in zip(eager, jitted):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_fresh_key_gives_a_fresh_sketch():
    x, w, g = _data()
    _, a = _grads(x, w, g, jax.random.key(0), rank=4, estimator="basis")
    _, b = _grads(x, w, g, jax.random.key(1), rank=4, estimator="basis")
    assert not np.allclose(a, b)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(rank=0), "rank must be an integer >= 1"),
        (dict(rank=2.5), "rank must be an integer >= 1"),
        (dict(rank=4, lam=1.0), r"\[0, 1\)"),
        (dict(rank=4, lam=-0.1), r"\[0, 1\)"),
        (dict(rank=4, estimator="sketchy"), "choose one of exact, basis, countsketch"),
    ],
)
def test_bad_arguments_raise_clear_errors(kwargs, match):
    x, w, _ = _data()
    with pytest.raises(ValueError, match=match):
        sketched_matmul(x, w, jax.random.key(0), **kwargs)


def test_shape_mismatch_raises():
    with pytest.raises(ValueError, match="shape mismatch"):
        sketched_matmul(jnp.ones((4, 3)), jnp.ones((5, 2)), jax.random.key(0), rank=2)


def _kept_rows(x, rank):
    """c = |C| of wta-crs: the number of leading slots with weight exactly 1 on the top rows."""
    sample = sample_rows(jax.random.key(0), x, "wta-crs", rank)
    top = np.argsort(-np.linalg.norm(np.asarray(x), axis=1), kind="stable")
    weight, index = np.asarray(sample.weight), np.asarray(sample.index)
    c = 0
    while c < rank and weight[c] == 1.0 and index[c] == top[c]:
        c += 1
    return c


@pytest.mark.parametrize("heavy", [False, True])
@pytest.mark.parametrize("rank", [1, 2, 4, 8])
def test_wta_crs_keeps_the_rows_its_variance_rule_picks(heavy, rank):
    """|C| = argmin_c (1 − P_c)/(R − c) over c = 0..R−1 (first minimum), P_c the mass of
    the c largest ‖x_b‖, computed here in NumPy float64."""
    x, _, _ = _data(shape_x=(24, 4), seed=3)
    if heavy:
        x = _heavy_rows(x)
    norms = np.sort(np.linalg.norm(np.asarray(x, np.float64), axis=1))[::-1]
    p = norms / norms.sum()
    score = [(1 - p[:c].sum()) / (rank - c) for c in range(rank)]
    assert _kept_rows(x, rank) == int(np.argmin(score))
    if heavy and rank >= 4:
        assert _kept_rows(x, rank) > 0  # the heavy rows are kept, not sampled


@pytest.mark.parametrize("estimator", ["wta-crs", "proj"])
@pytest.mark.parametrize("lam", [0.0, 0.25])
def test_wta_crs_and_proj_are_exact_at_full_rank(estimator, lam):
    """R = B: wta-crs keeps every row with weight 1; proj has k = N and keeps X."""
    x, w, g = _data()
    b = 4 * 16
    exact_dw = x.reshape(b, -1).T @ g.reshape(b, -1)
    for seed, rank in [(0, b), (1, 10 * b)]:
        _, dw = _grads(x, w, g, jax.random.key(seed), rank=rank, lam=lam, estimator=estimator)
        np.testing.assert_allclose(dw, exact_dw * (1 - lam) ** 2, rtol=1e-5, atol=1e-5)


def test_crs_stays_random_at_full_rank():
    """crs draws B rows with replacement at R = B: two keys give two different dW."""
    x, w, g = _data()
    _, a = _grads(x, w, g, jax.random.key(0), rank=64, estimator="crs")
    _, b = _grads(x, w, g, jax.random.key(1), rank=64, estimator="crs")
    assert not np.allclose(a, b)


def test_sampling_never_draws_a_zero_row():
    x, _, _ = _data(shape_x=(40, 6))
    x = x.at[::2].set(0.0)
    for estimator in SAMPLING:
        for seed in range(5):
            sample = sample_rows(jax.random.key(seed), x, estimator, 8)
            drawn = np.asarray(sample.index)[np.asarray(sample.weight) > 0]
            assert np.all(drawn % 2 == 1)


def test_all_zero_input_gives_zero_dw():
    x, w, g = _data(shape_x=(20, 5), m=3)
    for estimator in PEERS:
        _, dw = _grads(jnp.zeros_like(x), w, g, jax.random.key(0), rank=4, estimator=estimator)
        np.testing.assert_array_equal(dw, 0.0)


@pytest.mark.parametrize("estimator", SKETCHED)
@pytest.mark.parametrize("r", [1, 4, 16, 63])
def test_saved_bytes_agree_with_the_entry(estimator, r):
    """What the backward pass holds for dW besides W is the entry's ``kept_bytes``."""
    b, n, m = 64, 24, 40
    x, w, _ = _data(shape_x=(b, n), m=m)
    loss = lambda x, w, key: jnp.sum(sketched_matmul(x, w, key, rank=r, estimator=estimator))
    saved = saved_residuals(loss, x, w, jax.random.key(0))
    kept = [a for a, why in saved if not why.startswith("from the argument w")]
    nbytes = sum(int(np.prod(a.shape)) * a.dtype.itemsize for a in kept)
    assert nbytes == lookup(estimator).kept_bytes(b, n, r)
    if estimator == "proj" and projection_width(b, n, r) < n:  # R rows' worth, up to ⌈·⌉
        assert 4 * r * n <= nbytes - 8 < 4 * (r * n + b)
