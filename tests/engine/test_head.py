"""The fused head's softmax statistics: dZ and ‖dZ‖² checked against float64 math,
confident rows (p_t ≈ 1) included."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from engine.sketch import head
from engine.sketch.head import _logit_grad, _logit_grad_sq, _softmax, head_loss, norm_from

V, N = 97, 16


def _rows(margins, seed=0):
    """Rows x, weights w and targets t whose target logit beats the others by the given
    margins (NaN: no margin, random logits); logits z = x @ w with w = I-like columns."""
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(len(margins), V)).astype(np.float32)
    t = rng.integers(0, V, len(margins)).astype(np.int32)
    for b, margin in enumerate(margins):
        if not np.isnan(margin):
            z[b, t[b]] = z[b].max() + margin
    # x = z, w = I (N = V): the head's matmul reproduces z exactly
    return jnp.asarray(z), jnp.eye(V, dtype=jnp.float32), jnp.asarray(t)


def _reference(z, t, rows):
    """dZ = (softmax(z) − onehot(t)) / rows in float64, and ‖dZ‖²_F."""
    z = np.asarray(z, np.float64)
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    target = np.zeros(p.shape, bool)
    target[np.arange(len(t)), t] = True
    dz = np.where(target, -np.where(target, 0.0, p).sum(axis=1, keepdims=True), p)  # p_t − 1 = −Σ_{v≠t} p_v
    dz /= rows
    return dz, float((dz**2).sum())


@pytest.mark.parametrize("margins", [
    [np.nan] * 5,  # ordinary rows
    [np.nan, 25.0, np.nan, 12.0, 40.0],  # p_t ≈ 1 − 1e-9, 1 − 6e-4·…, 1 − 4e-16 among ordinary rows
    [25.0, 30.0, 20.0],  # every row confident: ‖dZ‖² is tiny and still exact to 1e-5
])
def test_logit_grad_and_its_norm_from_softmax_statistics(margins):
    z, w, t = _rows(margins)
    rows = 8  # the mean is over more rows than this chunk holds
    valid = jnp.ones(len(margins), bool)
    sm = jax.jit(_softmax, static_argnums=3)(z, w, t, True)
    dz = _logit_grad(sm, t, valid, rows)
    sq = _logit_grad_sq(sm, dz, valid, rows)
    want_dz, want_sq = _reference(z, t, rows)
    np.testing.assert_allclose(sq, want_sq, rtol=1e-5)
    np.testing.assert_allclose(dz, want_dz, rtol=1e-5, atol=1e-12)
    # the target entry −(1 − p_t)/B is exact where e_t / s − 1 would round to 0
    np.testing.assert_allclose(dz[jnp.arange(len(t)), t], want_dz[np.arange(len(t)), t], rtol=1e-5)


@pytest.mark.parametrize("margins", [[np.nan] * 6, [np.nan, 25.0, np.nan, 12.0, np.nan, 40.0]])
def test_statistics_form_equals_the_direct_one_and_skips_padding(margins):
    """The ``statistics`` form gives the plain form's loss and dZ, and its ‖dZ‖² is the
    direct Σ dZ² of the plain dZ (confident rows among ordinary ones included)."""
    z, w, t = _rows(margins, seed=1)
    valid = jnp.array([True] * 4 + [False] * 2)
    plain, stats = _softmax(z, w, t), _softmax(z, w, t, True)
    dz, dz_stats = _logit_grad(plain, t, valid, 4), _logit_grad(stats, t, valid, 4)
    assert not np.any(dz[4:]) and not np.any(dz_stats[4:])
    np.testing.assert_allclose(stats.nll, plain.nll, rtol=1e-6, atol=1e-7)
    # the plain target entry e/s − 1 is off by about an ulp of 1 (÷ B); the statistics' is exact
    np.testing.assert_allclose(dz_stats, dz, rtol=1e-5, atol=np.finfo(np.float32).eps / 2)
    direct = _logit_grad_sq(plain, dz, valid, 4)
    np.testing.assert_allclose(direct, jnp.sum(dz * dz), rtol=1e-7)
    np.testing.assert_allclose(_logit_grad_sq(stats, dz_stats, valid, 4), direct, rtol=1e-5)


def test_the_norm_form_follows_the_measurements(monkeypatch):
    """Direct Σ dZ² on a CPU (zeroing the target in the exp pass costs more there than the
    pass it saves), the statistics elsewhere; forcing either gives the same sketched head."""
    assert norm_from("cpu") == "direct" and norm_from("gpu") == norm_from("tpu") == "statistics"
    z, w, t = _rows([np.nan, 25.0, np.nan, 12.0, np.nan, np.nan, 3.0, np.nan], seed=3)
    grad = jax.value_and_grad(lambda z, w: head_loss(z, w, t, jax.random.key(1), chunk=3, estimator="basis",
                                                     rank=2, lam=0.1), argnums=(0, 1))
    direct = jax.jit(grad)(z, w)
    monkeypatch.setitem(head.NORM_FROM, "cpu", "statistics")
    stats = jax.jit(grad)(z, w)
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-8), direct, stats)


def test_confident_rows_give_the_loss_and_a_finite_sketched_gradient(monkeypatch):
    """A chunk whose every row predicts its target (p_t ≈ 1): the loss is ≈ 0 and the
    basis head's dW, whose γ_dZ = ‖dZ‖ / ‖S dZ‖ divides two tiny norms, is finite and
    not zero."""
    monkeypatch.setitem(head.NORM_FROM, "cpu", "statistics")
    z, w, t = _rows([30.0] * 8, seed=2)
    loss, dw = jax.value_and_grad(lambda w: head_loss(z, w, t, jax.random.key(0), chunk=4, estimator="basis",
                                                      rank=2))(w)
    assert 0 <= float(loss) < 1e-9
    assert np.all(np.isfinite(dw)) and float(jnp.abs(dw).max()) > 0
