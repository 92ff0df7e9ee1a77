"""A pre-LayerNorm GPT (nanoGPT layout) whose dense layers may be sketched.

Blocks: ``x + Attn(LN(x))`` then ``x + MLP(LN(x))`` with causal multi-head
attention, a 4× GELU MLP, learned positions and an untied LM head without
bias. Which dense layers use the sketched dW is ``GPTConfig.sketched_layers``:

- ``mlp+head``: both MLP layers of every block and the LM head (the paper's code)
- ``mlp``: both MLP layers of every block
- ``all``: ``mlp+head`` plus the attention q/k/v and output projections
- ``none``: nothing sketched (exact backprop whatever the estimator)

Hash sketches (basis, balanced, countsketch, scalars) of all sketched layers are drawn
together, once per step, from one key the GPT takes from the ``sketch`` stream
(``drawn_together``; ``engine.sketch.draws.draw_sketch``'s ``layers``); the other
estimators draw from a key of each layer's own.

Memory options (none changes a parameter name or shape, so every method of a
seed starts from the same parameters whatever its estimator, rank, layers or options):

- ``head_chunk``: 0 = logits then cross-entropy; C > 0 = the head fused with the
  loss in chunks of C rows (``engine.sketch.head``): the B·T×V logits are never kept.
- ``attention``: ``xla`` (``jax.nn.dot_product_attention``) or ``recompute``
  (``engine.sketch.attention``: keeps Q, K, V and the row log-sum-exp, not the probabilities).
- ``recompute_activations``: LayerNorm and GELU keep only their inputs and recompute
  the rest in the backward pass; an output is then kept only by an exact dense layer
  that needs it, never for a sketched one.
- ``remat``: ``jax.checkpoint`` around every block: ``none``, ``dots_saveable``
  (keep matmul outputs, recompute the rest) or ``full`` (keep the block input).

``head_chunk``, ``attention`` and ``recompute_activations`` change no number beyond
float rounding; ``remat`` changes none at all. ``GPTConfig``'s own defaults are the
plain model (unfused head); a run's defaults (``engine.config.run.RunConfig``) are the
options that are faster at lower memory on its backend: ``recompute`` attention and
recomputed activations (no slower on this project's 2-core CPU at the presets, faster
at long T; recompute attention is faster on an H200 too), and the fused head in
``FUSED_CHUNK`` rows (a CPU: an exact paper-preset step takes 22 instead of 32 ms; an
H200: basis R = 32's head 0.80× the unfused one at B·T 16384, exact's 1.10×, both at
less than half the memory). ``remat`` is off (it costs a forward pass per block).
"""

from __future__ import annotations

import functools
from typing import cast

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from jax.ad_checkpoint import checkpoint_name

from engine.core import choices
from engine.core.estimators import lookup
from engine.core.presets import GPTConfig
from engine.model.layers import ATTENTION, NONLINEARITY, SKETCH_RNG, FusedHead, LayerNorm, SketchedDense, gelu
from engine.sketch.attention import causal_attention
from engine.sketch.basis import draws_together
from engine.sketch.residuals import LOSS_LOGITS, keep_tagged

DTYPES = {name: getattr(jnp, name) for name in choices.DTYPES}
REMAT_POLICIES = {
    "none": None,
    "dots_saveable": jax.checkpoint_policies.dots_saveable,
    "full": jax.checkpoint_policies.nothing_saveable,
}
assert tuple(REMAT_POLICIES) == choices.REMAT_POLICIES


def drawn_together(cfg: GPTConfig) -> dict[tuple[str, ...], int]:
    """The sketched layers whose hash sketches are drawn together, one draw per step from
    one key (``engine.sketch.draws.draw_sketch``'s ``layers``), each by its param path
    → its index; empty when the estimator draws no hash sketch or one layer is sketched."""
    paths = cfg.sketched_kernel_paths()
    if not draws_together(cfg.estimator) or len(paths) < 2:
        return {}
    return {path: i for i, path in enumerate(paths)}


def _drawn(cfg: GPTConfig, path: tuple[str, ...]) -> tuple[int, int]:
    """(layer, layers) of the layer at ``path``: (0, 1), its own draw, when not drawn together."""
    together = drawn_together(cfg)
    return (together[path], len(together)) if path in together else (0, 1)


def _dense(cfg: GPTConfig, group: str, features: int, path: tuple[str, ...], use_bias: bool = True):
    layer, layers = _drawn(cfg, path)
    return SketchedDense(
        features,
        use_bias=use_bias,
        estimator=cfg.estimator_for(group),
        rank=cfg.rank,
        lam=cfg.lam,
        dtype=DTYPES[cfg.dtype],
        gather_axis=cfg.gather_axis,
        name=path[-1],
        layer=layer,
        layers=layers,
    )


class CausalSelfAttention(nn.Module):
    cfg: GPTConfig
    index: int = 0  # the block's

    @nn.compact
    def __call__(self, x: jax.Array, key: jax.Array | None = None) -> jax.Array:
        cfg = self.cfg
        b, t, d = x.shape
        head_dim = d // cfg.n_heads
        path = (f"block_{self.index}", "attn")
        qkv = _dense(cfg, "attn", 3 * d, (*path, "qkv"))(x, key)
        q, k, v = jnp.split(qkv.reshape(b, t, 3 * cfg.n_heads, head_dim), 3, axis=2)
        q, k, v = (checkpoint_name(a, ATTENTION) for a in (q, k, v))
        y = causal_attention(q, k, v, cfg.attention)
        return _dense(cfg, "attn", d, (*path, "out"))(y.reshape(b, t, d), key)


class MLP(nn.Module):
    cfg: GPTConfig
    index: int = 0  # the block's

    @nn.compact
    def __call__(self, x: jax.Array, key: jax.Array | None = None) -> jax.Array:
        d = self.cfg.d_model
        path = (f"block_{self.index}", "mlp")
        h = _dense(self.cfg, "mlp", 4 * d, (*path, "fc"))(x, key)
        return _dense(self.cfg, "mlp", d, (*path, "proj"))(gelu(h, recompute=self.cfg.recompute_activations), key)


def _layer_norm(cfg: GPTConfig, name: str, x: jax.Array) -> jax.Array:
    """``nn.LayerNorm``; with ``recompute_activations`` it keeps only its input."""
    norm = nn.remat(nn.LayerNorm) if cfg.recompute_activations else LayerNorm
    return norm(name=name)(checkpoint_name(x, NONLINEARITY))


class Block(nn.Module):
    """Block ``index``; ``key``: the one its sketched layers share with the others drawn together."""

    cfg: GPTConfig
    index: int = 0

    @nn.compact
    def __call__(self, x: jax.Array, key: jax.Array | None = None) -> jax.Array:
        x = x + CausalSelfAttention(self.cfg, self.index, name="attn")(_layer_norm(self.cfg, "ln_1", x), key)
        return x + MLP(self.cfg, self.index, name="mlp")(_layer_norm(self.cfg, "ln_2", x), key)


class GPT(nn.Module):
    """``GPT(cfg).apply(params, idx)`` → logits (B, T, V); with ``targets`` → mean cross-entropy."""

    cfg: GPTConfig

    @nn.compact
    def __call__(self, idx: jax.Array, targets: jax.Array | None = None) -> jax.Array:
        cfg = self.cfg
        t = idx.shape[1]
        if t > cfg.seq_len:
            raise ValueError(f"sequence of {t} tokens is longer than seq_len {cfg.seq_len}")
        init = nn.initializers.normal(0.02)
        tok = nn.Embed(cfg.vocab_size, cfg.d_model, embedding_init=init, name="wte")(idx)
        pos = self.param("wpe", init, (cfg.seq_len, cfg.d_model))[:t]
        x = (tok + pos).astype(DTYPES[cfg.dtype])
        # one key for the layers whose sketches are drawn together: one draw per step
        key = self.make_rng(SKETCH_RNG) if drawn_together(cfg) else None
        block = Block if cfg.remat == "none" else nn.remat(Block, policy=REMAT_POLICIES[cfg.remat])
        for i in range(cfg.n_layers):
            x = block(cfg, i, name=f"block_{i}")(x, key)
        x = _layer_norm(cfg, "ln_f", x)
        if targets is not None and cfg.head_chunk:
            layer, layers = _drawn(cfg, ("head",))
            return FusedHead(
                cfg.vocab_size,
                cfg.head_chunk,
                estimator=cfg.estimator_for("head"),
                rank=cfg.rank,
                lam=cfg.lam,
                dtype=DTYPES[cfg.dtype],
                gather_axis=cfg.gather_axis,
                name="head",
                layer=layer,
                layers=layers,
            )(x, targets, key)
        logits = _dense(cfg, "head", cfg.vocab_size, ("head",), use_bias=False)(x, key)
        if targets is None:
            return logits
        return cross_entropy(logits, targets)


def _mean_cross_entropy(logits: jax.Array, targets: jax.Array) -> jax.Array:
    return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()


_cross_entropy_kept = keep_tagged(_mean_cross_entropy, LOSS_LOGITS, static=1)


def cross_entropy(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """Mean over all positions of −log softmax(logits)[target], in float32; what it
    keeps for the backward pass (the softmax) is tagged ``LOSS_LOGITS``."""
    return _cross_entropy_kept(logits.astype(jnp.float32), targets)


def init_params(cfg: GPTConfig, key: jax.Array, batch_size: int = 1):
    """Parameters for ``cfg``; the same for every estimator, rank and λ given ``key``.

    Built by one compiled function: Flax's ``init`` run op by op dispatches and compiles
    each of its ~100 primitives on its own, the cost of starting a run on a CPU."""
    return _jitted_init(cfg.replace(estimator="exact"), batch_size)(key)


@functools.lru_cache(maxsize=16)
def _jitted_init(cfg: GPTConfig, batch_size: int):
    idx = jax.ShapeDtypeStruct((batch_size, cfg.seq_len), jnp.int32)
    return jax.jit(lambda key: GPT(cfg).init({"params": key}, jnp.zeros(idx.shape, idx.dtype))["params"])


def loss_fn(cfg: GPTConfig, params, batch: jax.Array, sketch_key: jax.Array | None) -> jax.Array:
    """Mean next-token cross-entropy of ``batch`` (B, T+1) under ``cfg``'s estimator."""
    rngs = None if not lookup(cfg.estimator).needs_key or sketch_key is None else {"sketch": sketch_key}
    # apply's annotation also covers mutable collections (output, state); without them: the output
    return cast(jax.Array, GPT(cfg).apply({"params": params}, batch[:, :-1], batch[:, 1:], rngs=rngs))
