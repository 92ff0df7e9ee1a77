"""VeLoRA (``engine.core.estimators.velora``), checked against what its entry promises:
shapes and memory (B·g coefficients and v), d̂W = c² Π dW with Π the projector onto v in
every sub-token (so exact when every sub-token lies on span(v), and biased otherwise),
no key, and the same dW from the fused head as from a dense layer."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.ad_checkpoint import saved_residuals

from engine.core.choices import ESTIMATORS
from engine.core.estimators import lookup
from engine.core.estimators.velora import ESTIMATOR, groups
from engine.sketch.basis import sketched_matmul
from engine.sketch.head import head_loss

CODEC = ESTIMATOR.compression


def _data(b=24, n=12, m=5, seed=0):
    kx, kw, kg = jax.random.split(jax.random.key(seed), 3)
    return jax.random.normal(kx, (b, n)), jax.random.normal(kw, (n, m)), jax.random.normal(kg, (b, m))


def _dw(x, w, g, key=None, **kw):
    """dW of Σ g ⊙ (x @ w) (dY = g) through the estimator's VJP."""
    return jax.grad(lambda w: jnp.sum(g * sketched_matmul(x, w, key, estimator="velora", **kw)))(w)


def _projector(v, g):
    """Π = I_g ⊗ v vᵀ (N×N, float64)."""
    v = np.asarray(v, np.float64)
    return np.kron(np.eye(g), np.outer(v, v))


def test_the_entry_is_a_biased_key_free_member_of_the_registry():
    assert "velora" in ESTIMATORS and lookup("velora") is ESTIMATOR
    assert ESTIMATORS.index("velora") > ESTIMATORS.index("proj")  # after the built-in ones: stored order kept
    assert ESTIMATOR.bias == "biased" and not ESTIMATOR.unbiased
    assert not ESTIMATOR.needs_key and not ESTIMATOR.gathers and not ESTIMATOR.row_space


@pytest.mark.parametrize("b,n,r", [(64, 24, 1), (64, 24, 4), (64, 24, 16), (64, 24, 63), (6, 7, 2), (10, 12, 10)])
def test_groups_divide_the_features_within_the_memory_of_r_rows(b, n, r):
    g = groups(b, n, r)
    assert n % g == 0 and 1 <= g <= max(1, -(-r * n // b))
    assert all(n % d for d in range(g + 1, max(1, -(-r * n // b)) + 1))  # the largest such divisor
    assert groups(b, n, b) == n


@pytest.mark.parametrize("b,n,r", [(64, 24, 1), (64, 24, 4), (64, 24, 16), (64, 24, 63)])
def test_it_keeps_b_times_g_coefficients_and_v(b, n, r):
    x, w, _ = _data(b, n, 40)
    coefficients, v = CODEC.encode(np.asarray(x), r)
    g = groups(b, n, r)
    assert coefficients.shape == (b, g) and v.shape == (n // g,)
    np.testing.assert_allclose(np.linalg.norm(v), 1.0, rtol=1e-6)
    saved = saved_residuals(lambda x, w: jnp.sum(sketched_matmul(x, w, None, rank=r, estimator="velora")), x, w)
    kept = [a for a, why in saved if not why.startswith("from the argument w")]
    assert sorted(tuple(a.shape) for a in kept) == sorted([(b, g), (n // g,), (0,)])
    assert sum(a.size * a.dtype.itemsize for a in kept) == ESTIMATOR.kept_bytes(b, n, r) == 4 * (b * g + n // g)


@pytest.mark.parametrize("rank,lam", [(1, 0.0), (3, 0.2), (8, 0.0)])
def test_dw_is_the_exact_gradient_projected_onto_v(rank, lam):
    """d̂W = c² Π Xᵀ dY, with v the unit mean sub-token; so ‖d̂W‖ ≤ c² ‖dW‖, and the
    bias (I − Π) dW is not zero for generic X: the estimator is biased, as its entry says."""
    x, w, g = _data()
    b, n = x.shape
    groups_ = groups(b, n, rank)
    sub = np.asarray(x, np.float64).reshape(b * groups_, -1)
    v = sub.mean(0) / np.linalg.norm(sub.mean(0))
    dw = np.asarray(x, np.float64).T @ np.asarray(g, np.float64)
    want = (1 - lam) ** 2 * _projector(v, groups_) @ dw
    got = np.asarray(_dw(x, w, g, rank=rank, lam=lam), np.float64)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert np.linalg.norm(got) <= (1 - lam) ** 2 * np.linalg.norm(dw) * (1 + 1e-6)
    assert np.linalg.norm(got - (1 - lam) ** 2 * dw) > 0.1 * np.linalg.norm(dw)


def test_it_is_exact_when_every_sub_token_lies_on_span_v():
    """x_bj = c_bj u for one direction u: X̂ = X, so d̂W = c² dW; also with the mean 0."""
    b, n, g = 16, 12, 4
    u = np.array([1.0, -2.0, 0.5])
    c = np.random.default_rng(0).normal(size=(b, g)) + 1.0
    x = jnp.asarray((c[:, :, None] * u).reshape(b, n), jnp.float32)
    _, w, dy = _data(b, n, 5)
    rank = -(-g * b // n)  # g = 4 at this rank
    assert groups(b, n, rank) == g
    dw = np.asarray(x.T @ dy)
    np.testing.assert_allclose(_dw(x, w, dy, rank=rank, lam=0.1), 0.81 * dw, rtol=1e-4, atol=1e-4)
    whole = np.arange(-3.0, 3.0).reshape(3, 2)  # small integers: every sum below is exact
    centred = np.concatenate([whole, -whole])[:, :, None] * u  # mean sub-token exactly 0: v = e_1
    np.testing.assert_array_equal(CODEC.encode(centred.reshape(6, 6).astype(np.float32), 2)[1], [1.0, 0.0, 0.0])


def test_it_is_exact_at_full_rank_and_draws_no_key():
    x, w, g = _data()
    exact = np.asarray(x.T @ g)
    np.testing.assert_allclose(_dw(x, w, g, rank=x.shape[0], lam=0.3), 0.49 * exact, rtol=1e-5, atol=1e-5)
    a, b = (_dw(x, w, g, jax.random.key(s), rank=3) for s in (0, 1))
    np.testing.assert_array_equal(a, b)  # deterministic: zero variance, the key is unused
    np.testing.assert_array_equal(a, _dw(x, w, g, None, rank=3))


@pytest.mark.parametrize("chunk", [1, 5, 64])
def test_the_fused_head_forms_the_same_dw_as_a_dense_layer(chunk):
    """The head's dW = c² X̂ᵀ dZ, dZ = (softmax(XW) − onehot(t)) / B, chunk by chunk; dX exact."""
    x, _, _ = _data(b=20, n=8)
    w = jax.random.normal(jax.random.key(5), (8, 11))
    t = jax.random.randint(jax.random.key(6), (20,), 0, 11)
    kw = dict(estimator="velora", rank=3, lam=0.1)
    dx, dw = jax.grad(lambda x, w: head_loss(x, w, t, None, chunk=chunk, **kw), argnums=(0, 1))(x, w)
    dz = (jax.nn.softmax(x @ w) - jax.nn.one_hot(t, 11)) / 20
    want = jax.grad(lambda w: jnp.sum(dz * sketched_matmul(x, w, None, **kw)))(w)
    np.testing.assert_allclose(dw, want, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(dx, dz @ w.T, rtol=1e-4, atol=1e-6)


def test_the_launch_form_and_the_run_schema_offer_it():
    """Both read the registry: the Launch form's estimator multiselect and RunConfig."""
    from app.form import widgets
    from engine.config.run import RunConfig

    (estimators,) = [w for w in widgets() if w.label == "Estimators"]
    assert "velora" in estimators.options
    cfg = RunConfig(estimator="velora", rank=4, preset="tiny")
    assert not cfg.is_exact and cfg.model_config("cpu").estimator == "velora"


def test_a_diagnosis_reads_zero_variance_and_the_projection_s_bias():
    """Through ``dw_moments`` (X whole, dY reduced on the right since M > B: the entry is
    not ``row_space``): variance 0 and bias² = ‖Π dW − dW‖² of the full (X, dY)."""
    from engine.analysis.diagnostics import dw_moments

    b, n, m, rank = 10, 12, 30, 3
    x, _, dy = _data(b, n, m, seed=2)
    g = groups(b, n, rank)
    sub = np.asarray(x, np.float64).reshape(b * g, -1)
    v = sub.mean(0) / np.linalg.norm(sub.mean(0))
    dw = np.asarray(x, np.float64).T @ np.asarray(dy, np.float64)
    bias2 = np.sum((_projector(v, g) @ dw - dw) ** 2)
    got = dw_moments(x, dy, (n, m), "velora", rank, 0.0, 8, jax.random.key(0))
    assert got.variance == pytest.approx(0.0, abs=1e-6 * got.dw_norm2)
    assert got.bias2 == pytest.approx(bias2, rel=1e-3)
    assert got.mse == pytest.approx(bias2, rel=1e-3)
