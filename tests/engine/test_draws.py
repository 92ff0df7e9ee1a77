"""The sketch draws: Threefry-2x32 written out round by round gives jax.random's numbers,
and the layers of a step draw their sketches together from one key."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend import core as jcore
from jax.extend.random import threefry_2x32

from engine.core.presets import GPTConfig
from engine.model.gpt import drawn_together, init_params, loss_fn
from engine.sketch.basis import sketched_matmul
from engine.sketch.draws import _argsort, draw_sketch, threefry2x32, threefry_bits


def test_threefry_matches_the_published_known_answers():
    """Random123's known-answer vectors for Threefry-2x32 with 20 rounds."""
    for key, counter, want in [
        ((0, 0), (0, 0), (0x6B200159, 0x99BA4EFE)),
        ((0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF), (0x1CB996FC, 0xBB002BE7)),
    ]:
        k0, k1 = (jnp.uint32(k) for k in key)
        x0, x1 = (jnp.full(1, c, jnp.uint32) for c in counter)
        got = threefry2x32(k0, k1, x0, x1)
        assert (int(got[0][0]), int(got[1][0])) == want


@pytest.mark.parametrize("n", [2, 7, 64, 1000])
def test_threefry_equals_jax_threefry_bit_for_bit(n):
    key = jax.random.bits(jax.random.key(n), (2,), jnp.uint32)
    counts = jax.random.bits(jax.random.key(n + 1), (2 * n,), jnp.uint32)
    x0, x1 = threefry2x32(key[0], key[1], counts[:n], counts[n:])
    np.testing.assert_array_equal(jnp.concatenate([x0, x1]), threefry_2x32(key, counts))


def test_threefry_bits_are_jax_random_bits_and_split():
    key = jax.random.fold_in(jax.random.key(3), 11)
    w0, w1 = threefry_bits(key, 300)
    np.testing.assert_array_equal(w0 ^ w1, jax.random.bits(key, (300,), jnp.uint32))
    s0, s1 = threefry_bits(key, 2)
    split = jax.random.key_data(jax.random.split(key))
    np.testing.assert_array_equal(np.stack([s0, s1], axis=1), split)


def _reference(key, kind, rows, rank):
    """The sketch drawn with jax.random alone (as before the rounds were written out)."""
    k_hash, k_sign = jax.random.split(key)
    signs = jax.random.rademacher(k_sign, (rows,), jnp.float32)
    if kind == "uniform":
        return jax.random.randint(k_hash, (rows,), 0, rank, dtype=jnp.int32), signs, None
    order = jnp.argsort(jax.random.bits(k_hash, (rows,), jnp.uint32), stable=True).astype(jnp.int32)
    members = jnp.full(-(-rows // rank) * rank, rows, jnp.int32).at[order].set(jnp.arange(rows, dtype=jnp.int32))
    return order % rank, signs, members


@pytest.mark.parametrize("kind", ["balanced", "uniform"])
@pytest.mark.parametrize("rows,rank", [(64, 32), (64, 1), (50, 8), (1024, 32), (7, 3)])
def test_draws_are_those_of_jax_random(kind, rows, rank):
    """Same bins, signs and members as jax.random's split, bits, rademacher and randint,
    eagerly and under jit: a run's sketches do not change with the written-out rounds."""
    for seed in range(3):
        key = jax.random.fold_in(jax.random.key(seed), rows)
        want = _reference(key, kind, rows, rank)
        arrays = lambda key: draw_sketch(key, kind, rows, rank)[2:]  # bins, signs, dense, members
        for bins, signs, _, members in (arrays(key), jax.jit(arrays)(key)):
            np.testing.assert_array_equal(bins, want[0])
            np.testing.assert_array_equal(signs, want[1])
            if kind == "balanced":
                np.testing.assert_array_equal(members, want[2])


def _primitives(jaxpr) -> set[str]:
    """Names of the primitives of ``jaxpr`` and of every jaxpr nested in it."""
    names = set()
    for eqn in jaxpr.eqns:
        names.add(eqn.primitive.name)
        for param in eqn.params.values():
            for sub in param if isinstance(param, (list, tuple)) else [param]:
                if isinstance(sub, jcore.ClosedJaxpr):
                    names |= _primitives(sub.jaxpr)
                elif isinstance(sub, jcore.Jaxpr):
                    names |= _primitives(sub)
    return names


def test_a_balanced_draw_runs_no_rolled_threefry_loop():
    """JAX lowers Threefry on a CPU as a five-iteration loop (``random_bits``,
    ``random_split``); the balanced draw calls none of it."""
    names = _primitives(jax.make_jaxpr(lambda k: draw_sketch(k, "balanced", 64, 8)[2:])(jax.random.key(0)).jaxpr)
    assert "sort" in names  # the walk reaches nested jaxprs
    assert not names & {"threefry2x32", "random_bits", "random_split", "while"}


def test_other_key_kinds_draw_through_jax_random():
    key = jax.random.key(4, impl="rbg")
    sketch = draw_sketch(key, "balanced", 40, 8)
    k_hash, k_sign = jax.random.split(key)
    np.testing.assert_array_equal(sketch.signs, jax.random.rademacher(k_sign, (40,), jnp.float32))
    np.testing.assert_array_equal(sketch.bins, _argsort(jax.random.bits(k_hash, (40,), jnp.uint32)) % 8)


def _balanced_s(sketch, rows):
    s = np.zeros((sketch.rank, rows), np.float32)
    s[np.asarray(sketch.bins), np.arange(rows)] = np.asarray(sketch.signs)
    return s


def test_layers_drawn_together_each_get_a_balanced_sketch_of_their_own():
    """Layer ℓ of L drawn from one key: its bits are row ℓ of one (L, B) draw, its bins
    are balanced and its members list them; no two layers share a hash or signs."""
    key, rows, rank, layers = jax.random.key(8), 64, 8, 5
    sketches = [draw_sketch(key, "balanced", rows, rank, layer, layers) for layer in range(layers)]
    k_hash, k_sign = jax.random.split(key)
    bits = jax.random.bits(k_hash, (layers, rows), jnp.uint32)
    signs = jax.random.rademacher(k_sign, (layers, rows), jnp.float32)
    for layer, sketch in enumerate(sketches):
        np.testing.assert_array_equal(sketch.bins, _argsort(bits[layer]) % rank)
        np.testing.assert_array_equal(sketch.signs, signs[layer])
        np.testing.assert_array_equal(np.bincount(np.asarray(sketch.bins), minlength=rank), rows // rank)
        members = np.asarray(sketch.members).reshape(-1, rank)  # slot k·R + r: k-th row of bin r
        np.testing.assert_array_equal(np.asarray(sketch.bins)[members], np.broadcast_to(np.arange(rank), members.shape))
    for a in range(layers):
        for b in range(a + 1, layers):
            assert not np.array_equal(sketches[a].bins, sketches[b].bins)
            assert not np.array_equal(sketches[a].signs, sketches[b].signs)
    with pytest.raises(ValueError, match="not one of the 5 layers"):
        draw_sketch(key, "balanced", rows, rank, 5, layers)


@pytest.mark.parametrize("layer", [0, 3])
def test_a_layer_drawn_with_others_is_unbiased(layer):
    """Monte Carlo over K keys of layer ℓ of 5 drawn together (balanced hashing, no
    scalars, λ = 0.2): every entry of mean(dW) − (1−λ)² dW lies within z·σ/√K, σ the
    sample std of that entry, z = 5.5 (36 entries: a false failure below 36 · 4e-8)."""
    kx, kw, kg = jax.random.split(jax.random.key(3), 3)
    x, w, g = jax.random.normal(kx, (24, 4)), jax.random.normal(kw, (4, 3)), jax.random.normal(kg, (24, 3))
    lam, k = 0.2, 20000

    def dw(key):
        loss = lambda w: jnp.sum(g * sketched_matmul(x, w, key, rank=4, lam=lam, estimator="balanced",
                                                     layer=layer, layers=5))
        return jax.grad(loss)(w)

    dws = np.asarray(jax.jit(jax.vmap(dw))(jax.random.split(jax.random.key(11), k)), np.float64)
    target = np.asarray(x.T @ g, np.float64) * (1 - lam) ** 2
    mean, std = dws.mean(axis=0), dws.std(axis=0, ddof=1)
    assert np.all(std > 0)
    assert np.all(np.abs(mean - target) <= 5.5 * std / np.sqrt(k))


def test_the_gpt_draws_every_sketched_layers_sketch_once_per_step():
    """mlp+head, 2 blocks: 5 sketched layers share one key and one draw, so the compiled
    gradient sorts once (plus the tie fallback's argsort), not once per layer; peer
    estimators keep a key per layer."""
    cfg = GPTConfig(vocab_size=128, seq_len=16, d_model=32, n_heads=2, n_layers=2, estimator="basis", rank=4,
                    head_chunk=8)
    assert list(drawn_together(cfg).values()) == [0, 1, 2, 3, 4]
    assert drawn_together(cfg.replace(estimator="crs")) == {} and drawn_together(cfg.replace(estimator="exact")) == {}
    params = init_params(cfg, jax.random.key(0))
    batch = jax.random.randint(jax.random.key(1), (2, cfg.seq_len + 1), 0, cfg.vocab_size)
    grad = jax.jit(jax.grad(lambda p, key: loss_fn(cfg, p, batch, key)))
    hlo = grad.lower(params, jax.random.key(2)).compile().as_text()
    assert hlo.count(" sort(") == 2
    with pytest.raises(ValueError, match="need a hash sketch"):
        sketched_matmul(jnp.ones((4, 2)), jnp.ones((2, 2)), jax.random.key(0), rank=2, estimator="crs", layers=2)
