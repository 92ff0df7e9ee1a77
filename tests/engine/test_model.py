"""The GPT around the sketched layers, and the dW probe."""

import jax
import numpy as np
import optax
import pytest

from engine.core.estimators import REGISTRY
from engine.core.presets import PRESETS, GPTConfig
from engine.model.gpt import init_params, loss_fn
from engine.model.memory import make_dw_probe, memory_breakdown, residuals

TINY = GPTConfig(vocab_size=128, seq_len=16, d_model=32, n_heads=2, n_layers=2)


def _batch(b=4, seed=0, cfg=TINY):
    return jax.random.randint(jax.random.key(seed), (b, cfg.seq_len + 1), 0, cfg.vocab_size)


def _probe(cfg, params, batch, key) -> dict[str, dict[str, float]]:
    """Per sketched layer ``{"cos": ..., "rel_err": ...}`` of the dW probe."""
    names, probe = make_dw_probe(cfg)
    cos, rel = probe(params, batch, key)
    return {n: {"cos": float(c), "rel_err": float(r)} for n, c, r in zip(names, np.asarray(cos), np.asarray(rel))}


def test_presets_match_the_paper():
    paper = PRESETS["paper"]
    m = paper.model
    assert (m.vocab_size, m.seq_len, m.d_model, m.n_heads, m.n_layers) == (50257, 64, 64, 2, 2)
    assert paper.batch_size == 1
    assert PRESETS["small"].model.d_model == 256 and PRESETS["small"].model.n_layers == 4


def test_parameters_do_not_depend_on_the_estimator():
    key = jax.random.key(3)
    a = init_params(TINY, key)
    for cfg in (TINY.replace(estimator="basis", rank=2), TINY.replace(estimator="gaussian", sketched_layers="all")):
        b = init_params(cfg, key)
        jax.tree_util.tree_map(np.testing.assert_array_equal, a, b)


@pytest.mark.parametrize(
    "layers,expected",
    [
        ("mlp+head", {"block_0/mlp/fc", "block_0/mlp/proj", "block_1/mlp/fc", "block_1/mlp/proj", "head"}),
        ("mlp", {"block_0/mlp/fc", "block_0/mlp/proj", "block_1/mlp/fc", "block_1/mlp/proj"}),
        ("none", set()),
    ],
)
def test_sketched_layer_choice(layers, expected):
    cfg = TINY.replace(estimator="basis", rank=4, sketched_layers=layers)
    assert set(_probe(cfg, init_params(cfg, jax.random.key(0)), _batch(), jax.random.key(1))) == expected


def test_all_layers_adds_attention_projections():
    cfg = TINY.replace(estimator="basis", rank=4, sketched_layers="all")
    names = {"/".join(p) for p in cfg.sketched_kernel_paths()}
    assert {"block_0/attn/qkv", "block_0/attn/out", "head"} <= names and len(names) == 9


def test_unsketched_layers_get_exact_gradients():
    params = init_params(TINY, jax.random.key(0))
    batch = _batch()
    exact = jax.grad(lambda p: loss_fn(TINY, p, batch, None))(params)
    cfg = TINY.replace(estimator="countsketch", rank=2, sketched_layers="mlp")
    sk = jax.grad(lambda p: loss_fn(cfg, p, batch, jax.random.key(9)))(params)
    for part in ("attn", "ln_1", "ln_2"):
        jax.tree_util.tree_map(
            lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
            exact["block_0"][part], sk["block_0"][part],
        )
    np.testing.assert_allclose(exact["head"]["kernel"], sk["head"]["kernel"], rtol=1e-5, atol=1e-6)
    # the bias gradient of a sketched layer stays exact
    np.testing.assert_allclose(exact["block_1"]["mlp"]["fc"]["bias"], sk["block_1"]["mlp"]["fc"]["bias"], rtol=1e-5, atol=1e-6)
    assert not np.allclose(exact["block_1"]["mlp"]["fc"]["kernel"], sk["block_1"]["mlp"]["fc"]["kernel"])


def test_probe_is_one_at_full_rank_and_below_one_at_small_rank():
    params = init_params(TINY, jax.random.key(0))
    batch = _batch()  # B·T = 64 rows
    full = _probe(TINY.replace(estimator="basis", rank=64), params, batch, jax.random.key(1))
    for v in full.values():
        assert v["cos"] == pytest.approx(1.0, abs=1e-5) and v["rel_err"] < 1e-4
    low = _probe(TINY.replace(estimator="basis", rank=2), params, batch, jax.random.key(1))
    for v in low.values():
        assert v["cos"] < 0.9 and v["rel_err"] > 0.1


def test_probe_of_exact_is_one_on_the_layers_a_sketched_run_would_sketch():
    probe = _probe(TINY, init_params(TINY, jax.random.key(0)), _batch(), jax.random.key(1))
    assert set(probe) == {"block_0/mlp/fc", "block_0/mlp/proj", "block_1/mlp/fc", "block_1/mlp/proj", "head"}
    for v in probe.values():
        assert v["cos"] == pytest.approx(1.0, abs=1e-6) and v["rel_err"] == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize("estimator,rank", [("exact", 1), ("basis", 8)])
def test_tiny_gpt_overfits_one_batch(estimator, rank):
    cfg = TINY.replace(estimator=estimator, rank=rank)
    params = init_params(cfg, jax.random.key(0))
    batch = _batch()
    opt = optax.adam(1e-2)
    state = opt.init(params)

    @jax.jit
    def step(params, state, key):
        loss, grads = jax.value_and_grad(lambda p: loss_fn(cfg, p, batch, key))(params)
        updates, state = opt.update(grads, state)
        return optax.apply_updates(params, updates), state, loss

    keys = jax.random.split(jax.random.key(1), 150)
    first = None
    for k in keys:
        params, state, loss = step(params, state, k)
        first = float(loss) if first is None else first
    final = float(loss_fn(cfg.replace(estimator="exact"), params, batch, None))
    assert first == pytest.approx(np.log(cfg.vocab_size), rel=0.05)
    assert final < 0.35 * first


def test_sketched_layers_shrink_saved_activations_by_input_minus_sketch():
    """mlp+head at rank R: the fc, proj and head inputs (B×d, B×4d, B×d floats each block /
    once) are replaced by their R-row sketches; everything else is identical."""
    params = init_params(TINY, jax.random.key(0))
    batch = _batch()
    rows, d, r = 4 * 16, TINY.d_model, 4
    exact = sum(memory_breakdown(TINY, params, batch, None).values())
    sketched = sum(memory_breakdown(TINY.replace(estimator="basis", rank=r), params, batch, jax.random.key(0)).values())
    per_block_inputs = rows * d + rows * 4 * d
    per_block_sketches = r * d + r * 4 * d
    removed = 4 * (TINY.n_layers * (per_block_inputs - per_block_sketches) + rows * d - r * d)
    key_bytes = sum(s for s, why in residuals(TINY.replace(estimator="basis", rank=r), params, batch, jax.random.key(0)) if "random" in why or "_fwd" in why)
    assert exact - sketched + key_bytes == removed


def test_sequence_longer_than_config_is_rejected():
    params = init_params(TINY, jax.random.key(0))
    with pytest.raises(ValueError, match="longer than seq_len"):
        loss_fn(TINY, params, _batch(cfg=TINY.replace(seq_len=32)), None)


@pytest.mark.parametrize(
    "changes,match",
    [
        (dict(d_model=30, n_heads=4), "divisible"),
        (dict(sketched_layers="attn"), "sketched_layers must be one of"),
        (dict(n_layers=0), "n_layers must be an integer >= 1"),
        (dict(dtype="float16"), "dtype must be one of"),
        (dict(estimator="basis", rank=0), "rank must be"),
        (dict(head_chunk=-1), "head_chunk must be an integer >= 0"),
        (dict(attention="flash"), "attention must be one of"),
        (dict(remat="blocks"), "remat must be one of"),
        (dict(recompute_activations="yes"), "recompute_activations must be True or False"),
    ],
)
def test_bad_model_config(changes, match):
    with pytest.raises(ValueError, match=match):
        TINY.replace(**changes)


@pytest.mark.parametrize("estimator", [e.name for e in REGISTRY.values() if not e.exact and e.draws is None])
def test_tiny_gpt_trains_with_each_peer_estimator(estimator):
    """40 Adam steps on one batch with rank 8 of B·T = 64 rows: the exact loss falls
    well below its start (log V at init)."""
    cfg = TINY.replace(estimator=estimator, rank=8)
    params = init_params(cfg, jax.random.key(0))
    batch = _batch()
    opt = optax.adam(1e-2)
    state = opt.init(params)

    @jax.jit
    def step(params, state, key):
        grads = jax.grad(lambda p: loss_fn(cfg, p, batch, key))(params)
        updates, state = opt.update(grads, state)
        return optax.apply_updates(params, updates), state

    exact = lambda p: float(loss_fn(cfg.replace(estimator="exact"), p, batch, None))
    first = exact(params)
    for k in jax.random.split(jax.random.key(1), 40):
        params, state = step(params, state, k)
    assert exact(params) < 0.7 * first
