"""Memory options (fused head, recompute attention, recomputed activations, remat) and
the saved-bytes accounting."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from engine.core.presets import GPTConfig
from engine.model.gpt import init_params, loss_fn
from engine.model.memory import CATEGORIES, memory_breakdown, residuals
from engine.sketch.attention import causal_attention
from engine.sketch.basis import draw_sketch, sketched_matmul
from engine.sketch.head import head_loss, head_method
from engine.training.compiled import compiled_stats
from engine.training.steps import init_state, make_optimizer, make_train_step

CFG = GPTConfig(vocab_size=96, seq_len=16, d_model=32, n_heads=2, n_layers=1)
B = 3  # B·T = 48 rows
ROWS = B * CFG.seq_len
PLAIN = dict(head_chunk=0, attention="xla", recompute_activations=False, remat="none")
OPTIONS = dict(head_chunk=7, attention="recompute", recompute_activations=True)


EXACT = CFG.replace(**PLAIN, rank=4, sketched_layers="all")
BASIS = EXACT.replace(estimator="basis", lam=0.1)
PARAMS = init_params(CFG, jax.random.key(0))
BATCH = jax.random.randint(jax.random.key(1), (B, CFG.seq_len + 1), 0, CFG.vocab_size)


@functools.lru_cache(maxsize=None)
def _grads(cfg):
    """(loss, gradients) of ``cfg`` at PARAMS and BATCH with sketch key 5; cached."""
    return jax.jit(jax.value_and_grad(lambda p: loss_fn(cfg, p, BATCH, jax.random.key(5))))(PARAMS)


def _assert_close(a, b, rtol=1e-5, atol=1e-6):
    (la, ga), (lb, gb) = a, b
    np.testing.assert_allclose(la, lb, rtol=rtol, atol=atol)
    assert jax.tree_util.tree_structure(ga) == jax.tree_util.tree_structure(gb)
    jax.tree_util.tree_map(lambda x, y: np.testing.assert_allclose(x, y, rtol=rtol, atol=atol), ga, gb)


def _head_inputs():
    kx, kw, kt = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(kx, (3, 16, 32))
    w = jax.random.normal(kw, (32, 96)) * 0.3
    return x, w, jax.random.randint(kt, (3, 16), 0, 96)


@pytest.mark.parametrize("chunk", [1, 5, 16, 100])  # 5 does not divide B·T = 48; 100 > B·T
def test_fused_head_equals_logits_then_cross_entropy(chunk):
    x, w, t = _head_inputs()

    def unfused(x, w):
        return optax.softmax_cross_entropy_with_integer_labels(x @ w, t).mean()

    def both(x, w):
        fused = jax.value_and_grad(lambda x, w: head_loss(x, w, t, None, chunk=chunk), argnums=(0, 1))
        primal = head_loss(x, w, t, None, chunk=chunk)
        return jax.value_and_grad(unfused, argnums=(0, 1))(x, w), fused(x, w), primal

    want, got, primal = jax.jit(both)(x, w)
    _assert_close(want, got)
    np.testing.assert_allclose(primal, want[0], rtol=1e-6)


@pytest.mark.parametrize(
    "estimator,rank",
    [("gaussian", 5), ("countsketch", 5), ("basis", 48),
     ("crs", 5), ("wta-crs", 5), ("proj", 5), ("wta-crs", 48), ("proj", 48)],
)
def test_sketched_fused_head_equals_sketched_matmul_then_cross_entropy(estimator, rank):
    """Same key, same S (or rows, or P): the fused head's dW is the sketched dense
    layer's; at R = B·T the basis sketch is a signed permutation, wta-crs keeps every
    row and proj keeps X, so dW is exact times (1 − λ)²."""
    x, w, t = _head_inputs()
    key, lam = jax.random.key(7), 0.1

    def unfused(x, w):
        z = sketched_matmul(x, w, key, rank=rank, lam=lam, estimator=estimator)
        return optax.softmax_cross_entropy_with_integer_labels(z, t).mean()

    def fused(x, w):
        return head_loss(x, w, t, key, chunk=5, estimator=estimator, rank=rank, lam=lam)

    def all_three(x, w):
        exact_dw = jax.grad(lambda w: head_loss(x, w, t, None, chunk=5))(w)
        grad = functools.partial(jax.value_and_grad, argnums=(0, 1))
        return grad(unfused)(x, w), grad(fused)(x, w), exact_dw

    want, got, exact_dw = jax.jit(all_three)(x, w)
    _assert_close(want, got)
    if rank == 48:
        np.testing.assert_allclose(want[1][1], (1 - lam) ** 2 * exact_dw, rtol=1e-4, atol=1e-7)
    else:
        assert not np.allclose(want[1][1], exact_dw, rtol=0.1)


@pytest.mark.parametrize("estimator", ["basis", "balanced"])
@pytest.mark.parametrize("rank,chunk", [(5, 7), (2, 7), (16, 5), (48, 5), (7, 100), (13, 13)])
def test_binned_head_equals_the_head_in_row_order_and_the_sketched_matmul(estimator, rank, chunk):
    """The binned head (rows in bin order: whole layers of bins per chunk when R ≤ C,
    whole bins when R > C) gives the loss, dX and dW of the head that visits rows in
    their own order and applies S per chunk (dense product and segment sum), and of
    the sketched dense layer then cross-entropy, for the same key."""
    x, w, t = _head_inputs()
    key, lam = jax.random.key(3), 0.1
    grad = functools.partial(jax.value_and_grad, argnums=(0, 1))

    def head(method):
        return grad(lambda x, w: head_loss(x, w, t, key, chunk=chunk, estimator=estimator, rank=rank, lam=lam,
                                           sketch_method=method))(x, w)

    def unfused(x, w):
        z = sketched_matmul(x, w, key, rank=rank, lam=lam, estimator=estimator)
        return optax.softmax_cross_entropy_with_integer_labels(z, t).mean()

    binned, dense, segment, want = jax.jit(lambda: (head("binned"), head("dense"), head("segment"),
                                                    grad(unfused)(x, w)))()
    for other in (dense, segment, want):
        _assert_close(binned, other)


def test_head_picks_its_sketch_form_by_backend_and_rank():
    """As measured (``head_method``): binned for balanced sketches, except the one-hot
    product at R ≤ 4 on a CPU; other sketches apply S per chunk by ``sketch_method``."""
    balanced = lambda r: draw_sketch(jax.random.key(0), "balanced", 64, r)
    assert head_method(balanced(32), "cpu") == head_method(balanced(8), "cpu") == "binned"
    assert head_method(balanced(4), "cpu") == head_method(balanced(1), "cpu") == "dense"
    assert head_method(balanced(1), "gpu") == head_method(balanced(32), "gpu") == "binned"
    assert head_method(draw_sketch(jax.random.key(0), "uniform", 64, 32), "cpu") is None


def test_binned_head_on_a_cpu_sums_bins_without_a_wide_reduction(monkeypatch):
    """The binned head's S dZ on a CPU: no reduce over the (layers, R, V) array, which
    XLA's CPU runs ~100× slower than adding halves (the issue-27 regression)."""
    monkeypatch.setattr(jax, "default_backend", lambda: "cpu")
    x, w, t = _head_inputs()
    jaxpr = jax.make_jaxpr(jax.grad(lambda w: head_loss(x, w, t, jax.random.key(0), chunk=7, estimator="basis",
                                                        rank=2, sketch_method="binned")))(w)
    wide = [e for e in _equations(jaxpr.jaxpr) if e.primitive.name == "reduce_sum" and e.invars[0].aval.ndim == 3]
    assert wide == []
    assert any(e.primitive.name == "add" and e.outvars[0].aval.shape == (2, 96) for e in _equations(jaxpr.jaxpr))


def _equations(jaxpr):
    """Every equation of ``jaxpr`` and of the jaxprs in its equations' parameters."""
    for e in jaxpr.eqns:
        yield e
        for p in e.params.values():
            for sub in p if isinstance(p, (tuple, list)) else (p,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    yield from _equations(inner)


def test_binned_head_needs_a_balanced_sketch_and_a_known_method():
    x, w, t = _head_inputs()
    with pytest.raises(ValueError, match="needs a balanced sketch"):
        head_loss(x, w, t, jax.random.key(0), chunk=5, estimator="countsketch", rank=4, sketch_method="binned")
    with pytest.raises(ValueError, match="unknown sketch method 'fast'"):
        head_loss(x, w, t, jax.random.key(0), chunk=5, estimator="basis", rank=4, sketch_method="fast")


def test_fused_head_in_the_gpt_gives_the_same_loss_and_gradients():
    _assert_close(_grads(EXACT), _grads(EXACT.replace(head_chunk=5)))


def test_sketched_fused_head_in_the_gpt_draws_the_sketched_dense_key():
    _assert_close(_grads(BASIS), _grads(BASIS.replace(head_chunk=5)))


def test_recompute_attention_equals_xla_attention():
    q, k, v, do = jax.random.normal(jax.random.key(0), (4, 2, 24, 3, 8))

    def run(impl):
        o, vjp = jax.vjp(lambda q, k, v: causal_attention(q, k, v, impl), q, k, v)
        return o, vjp(do)

    (o1, g1), (o2, g2) = jax.jit(lambda: (run("xla"), run("recompute")))()
    np.testing.assert_allclose(o1, o2, rtol=1e-5, atol=1e-6)
    for a, b in zip(g1, g2):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "base,changes",
    [
        (EXACT, dict(attention="recompute")),
        (EXACT, dict(recompute_activations=True)),
        (EXACT, dict(remat="dots_saveable")),
        (BASIS, dict(remat="full")),
        (BASIS, dict(OPTIONS, remat="full")),
    ],
)
def test_memory_options_leave_the_gradients_unchanged(base, changes):
    """To rounding, not bit for bit: remat replays the same operations, but XLA may fuse a
    replayed one differently (with the fused head, recomputed attention and remat="full",
    XLA's default CPU compiler differs from the plain step by 6e-8 in a gradient entry; the
    suite's fast-compile flags by other bits in other cases)."""
    _assert_close(_grads(base), _grads(base.replace(**changes)))


@pytest.mark.parametrize("changes", [PLAIN, dict(remat="full")])
def test_parameters_do_not_depend_on_memory_options(changes):
    a = init_params(CFG, jax.random.key(3))
    b = init_params(CFG.replace(**changes), jax.random.key(3))
    jax.tree_util.tree_map(np.testing.assert_array_equal, a, b)


@pytest.mark.parametrize(
    "changes",
    [
        PLAIN,
        dict(PLAIN, remat="dots_saveable"),
        dict(PLAIN, remat="full"),
        OPTIONS,
        dict(OPTIONS, estimator="basis", rank=4, sketched_layers="all"),
        dict(OPTIONS, estimator="gaussian", rank=4, sketched_layers="mlp", head_chunk=0),
    ],
)
def test_breakdown_adds_up_to_the_saved_residuals(changes):
    cfg = CFG.replace(**changes)
    key = jax.random.key(2)
    breakdown = memory_breakdown(cfg, PARAMS, BATCH, key)
    assert tuple(breakdown) == CATEGORIES
    assert sum(breakdown.values()) == sum(size for size, _ in residuals(cfg, PARAMS, BATCH, key))
    if cfg.remat == "none":
        for category in CATEGORIES[:4]:
            assert breakdown[category] > 0, category


def test_plain_exact_breakdown_holds_the_logits_and_probabilities():
    breakdown = memory_breakdown(CFG.replace(**PLAIN), PARAMS, BATCH, None)
    t, v, h = CFG.seq_len, CFG.vocab_size, CFG.n_heads
    assert breakdown["loss_logits"] >= ROWS * v * 4  # softmax of the B·T×V logits
    assert breakdown["attention"] >= CFG.n_layers * B * h * t * t * 4  # probabilities
    # the inputs of qkv, out, fc, proj per block and of the head, kept whole
    assert breakdown["sketched_inputs"] == 4 * ROWS * (CFG.n_layers * 7 * CFG.d_model + CFG.d_model)


def test_options_keep_only_what_the_math_needs():
    """Fused head: dX and dW (no B·T×V term); recompute attention: Q, K, V and the
    row log-sum-exp; LayerNorm and GELU: their inputs only."""
    d, t, h, v, n = CFG.d_model, CFG.seq_len, CFG.n_heads, CFG.vocab_size, CFG.n_layers
    breakdown = memory_breakdown(CFG.replace(**OPTIONS), PARAMS, BATCH, None)
    assert breakdown["loss_logits"] == 4 * (ROWS * d + d * v)
    assert breakdown["attention"] == 4 * n * (3 * ROWS * d + B * h * t)
    assert breakdown["nonlinearity"] == 4 * ROWS * ((2 * n + 1) * d + n * 4 * d)


def test_sketched_layers_keep_no_input_rows():
    """All layers sketched at rank R: no dense input and no GELU or LayerNorm output is
    kept whole; the head keeps dX (B·T×N) and R-row sketches (X̂ and dẐ)."""
    r, d, v, n = 4, CFG.d_model, CFG.vocab_size, CFG.n_layers
    cfg = CFG.replace(**OPTIONS, estimator="basis", rank=r, sketched_layers="all")
    breakdown = memory_breakdown(cfg, PARAMS, BATCH, jax.random.key(2))
    sketches = 4 * r * (n * 7 * d + d)
    assert sketches <= breakdown["sketched_inputs"] < sketches + 64 * (5 * n + 1)
    assert breakdown["loss_logits"] == 4 * (ROWS * d + r * v)
    plain = memory_breakdown(CFG.replace(**OPTIONS), PARAMS, BATCH, None)
    for category in ("nonlinearity", "attention"):
        assert breakdown[category] == plain[category]


def test_fused_head_without_gradients_and_in_bfloat16():
    want = _grads(EXACT)[0]
    evaluate = jax.jit(lambda p: loss_fn(EXACT.replace(head_chunk=5), p, BATCH, None))
    np.testing.assert_allclose(evaluate(PARAMS), want, rtol=1e-5)
    loss, grads = _grads(EXACT.replace(dtype="bfloat16", head_chunk=5))
    np.testing.assert_allclose(loss, want, rtol=2e-2)
    assert grads["head"]["kernel"].dtype == jnp.float32


def test_compiled_stats_report_temp_and_argument_bytes():
    optimizer = make_optimizer("sgd", 0.1)
    state = jax.eval_shape(lambda p: init_state(p, optimizer), PARAMS)
    stats = compiled_stats(make_train_step(CFG, optimizer).lower(state, BATCH, None).compile())
    assert stats["temp_bytes"] > 0 and stats["argument_bytes"] > 0


@pytest.mark.parametrize(
    "changes,match",
    [
        (dict(head_chunk=-1), "head_chunk must be an integer >= 0"),
        (dict(head_chunk=2.5), "head_chunk must be an integer >= 0"),
        (dict(attention="flash"), "attention must be one of xla, recompute"),
        (dict(remat="all"), "remat must be one of none, dots_saveable, full"),
        (dict(recompute_activations=1), "recompute_activations must be True or False"),
    ],
)
def test_bad_memory_options(changes, match):
    with pytest.raises(ValueError, match=match):
        CFG.replace(**changes)


def test_head_loss_rejects_bad_arguments():
    x, w, t = jnp.ones((4, 3)), jnp.ones((3, 5)), jnp.zeros((4,), jnp.int32)
    with pytest.raises(ValueError, match="chunk must be"):
        head_loss(x, w, t, None, chunk=0)
    with pytest.raises(ValueError, match="shape mismatch"):
        head_loss(x, w, t[:3], None, chunk=2)


def _untagged_configs():
    """Every estimator with fused and unfused head (all layers sketched), every
    sketched_layers choice, and both settings of attention and recomputation."""
    from engine.core.choices import ESTIMATORS

    for i, estimator in enumerate(ESTIMATORS):
        for chunk in (0, 7):
            yield CFG.replace(
                estimator=estimator, rank=4, lam=0.1, sketched_layers="all", head_chunk=chunk,
                attention=("xla", "recompute")[i % 2], recompute_activations=bool(chunk),
            )
    for layers in ("mlp+head", "mlp", "none"):
        for plain in (True, False):
            yield CFG.replace(**(PLAIN if plain else OPTIONS), estimator="crs", rank=4, sketched_layers=layers)


@pytest.mark.parametrize("cfg", list(_untagged_configs()), ids=lambda c: f"{c.estimator}-{c.sketched_layers}-{c.head_chunk}-{c.attention}-{c.recompute_activations}")
def test_no_residual_of_the_project_lands_in_other(cfg):
    """Categories come from tags given where residuals are made: without remat, only the
    token indices Flax's embedding lookup keeps (B×T integers) are left in ``other``."""
    from engine.model.memory import _listing, residual_category

    listing = _listing(cfg, PARAMS, BATCH, jax.random.key(2))
    other = [(aval, why) for aval, why in listing if residual_category(aval, why) == "other"]
    assert len(other) == 1, other
    aval, why = other[0]
    assert jnp.issubdtype(aval.dtype, jnp.integer) and aval.size == ROWS and "Embed" in why
    assert all("named '" in why for aval, why in listing if aval not in (other[0][0],) and not jax.dtypes.issubdtype(aval.dtype, jax.dtypes.prng_key))
