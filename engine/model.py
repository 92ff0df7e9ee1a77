"""A pre-LayerNorm GPT (nanoGPT layout) whose dense layers may be sketched.

Blocks: ``x + Attn(LN(x))`` then ``x + MLP(LN(x))`` with causal multi-head
attention, a 4× GELU MLP, learned positions and an untied LM head without
bias. Which dense layers use the sketched dW is ``GPTConfig.sketched_layers``:

- ``mlp+head``: both MLP layers of every block and the LM head (the paper's code)
- ``mlp``: both MLP layers of every block
- ``all``: ``mlp+head`` plus the attention q/k/v and output projections
- ``none``: nothing sketched (exact backprop whatever the estimator)

Memory options (none changes a parameter name or shape, so every method of a
seed starts from the same parameters whatever its estimator, rank, layers or options):

- ``head_chunk``: 0 = logits then cross-entropy; C > 0 = the head fused with the
  loss in chunks of C rows (``engine.head``): the B·T×V logits are never kept.
- ``attention``: ``xla`` (``jax.nn.dot_product_attention``) or ``recompute``
  (``engine.attention``: keeps Q, K, V and the row log-sum-exp, not the probabilities).
- ``recompute_activations``: LayerNorm and GELU keep only their inputs and recompute
  the rest in the backward pass; an output is then kept only by an exact dense layer
  that needs it, never for a sketched one.
- ``remat``: ``jax.checkpoint`` around every block: ``none``, ``dots_saveable``
  (keep matmul outputs, recompute the rest) or ``full`` (keep the block input).

``head_chunk``, ``attention`` and ``recompute_activations`` change no number beyond
float rounding; ``remat`` changes none at all. Defaults: ``recompute`` attention and
recomputed activations are on (no slower on this project's 2-core CPU at the
presets, faster at long T); the fused head is off (0): it is faster there too (an
exact step of the paper preset takes 22 instead of 32 ms with head_chunk=256) but it
changes what a run's memory figures count (dX and dW instead of the logits), and
``engine.train`` defines those on the unfused head; ``remat`` is off (it costs a
forward pass per block).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from jax.ad_checkpoint import checkpoint_name

from engine import checks
from engine.attention import ATTENTION_CHOICES, causal_attention
from engine.basis import validate
from engine.layers import ATTENTION, NONLINEARITY, FusedHead, LayerNorm, SketchedDense, gelu
from engine.residuals import LOSS_LOGITS, keep_tagged

SKETCHED_LAYER_CHOICES = ("mlp+head", "mlp", "all", "none")
_GROUPS = {
    "mlp+head": {"mlp", "head"},
    "mlp": {"mlp"},
    "all": {"mlp", "head", "attn"},
    "none": set(),
}
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
REMAT_POLICIES = {
    "none": None,
    "dots_saveable": jax.checkpoint_policies.dots_saveable,
    "full": jax.checkpoint_policies.nothing_saveable,
}


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 50257
    seq_len: int = 64
    d_model: int = 64
    n_heads: int = 2
    n_layers: int = 2
    sketched_layers: str = "mlp+head"
    estimator: str = "exact"
    rank: int = 32
    lam: float = 0.0
    dtype: str = "float32"
    head_chunk: int = 0
    attention: str = "recompute"
    recompute_activations: bool = True
    remat: str = "none"

    def __post_init__(self):
        for name in ("vocab_size", "seq_len", "d_model", "n_heads", "n_layers"):
            value = getattr(self, name)
            checks.whole(name, value, 1)
        checks.whole("head_chunk", self.head_chunk, 0, fix="0 = unfused head, C > 0 = fused head in chunks of C rows")
        if self.attention not in ATTENTION_CHOICES:
            raise ValueError(
                f"attention must be one of {', '.join(ATTENTION_CHOICES)} (got {self.attention!r})"
            )
        if not isinstance(self.recompute_activations, bool):
            raise ValueError(
                f"recompute_activations must be True or False (got {self.recompute_activations!r})"
            )
        if self.remat not in REMAT_POLICIES:
            raise ValueError(
                f"remat must be one of {', '.join(REMAT_POLICIES)} (got {self.remat!r})"
            )
        if self.d_model % self.n_heads:
            raise ValueError(
                f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})"
            )
        if self.sketched_layers not in SKETCHED_LAYER_CHOICES:
            raise ValueError(
                f"sketched_layers must be one of {', '.join(SKETCHED_LAYER_CHOICES)} "
                f"(got {self.sketched_layers!r})"
            )
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)} (got {self.dtype!r})")
        validate(self.estimator, self.rank, self.lam)

    def replace(self, **changes) -> "GPTConfig":
        return dataclasses.replace(self, **changes)

    def estimator_for(self, group: str) -> str:
        """The estimator of a dense layer in ``group`` (``mlp``, ``head`` or ``attn``)."""
        return self.estimator if group in _GROUPS[self.sketched_layers] else "exact"

    def sketched_kernel_paths(self) -> list[tuple[str, ...]]:
        """Param-tree paths of the kernels in the ``sketched_layers`` groups: the
        layers whose dW this config sketches (for ``exact``, the layers a sketched
        run of the same config would sketch, so its dW probe is the reference 1.0)."""
        groups = _GROUPS[self.sketched_layers]
        paths = []
        for i in range(self.n_layers):
            if "attn" in groups:
                paths += [(f"block_{i}", "attn", "qkv"), (f"block_{i}", "attn", "out")]
            if "mlp" in groups:
                paths += [(f"block_{i}", "mlp", "fc"), (f"block_{i}", "mlp", "proj")]
        if "head" in groups:
            paths.append(("head",))
        return paths


@dataclass(frozen=True)
class Preset:
    """A named model shape plus the batch size it was run with."""

    model: GPTConfig
    batch_size: int
    description: str


PRESETS: dict[str, Preset] = {
    "paper": Preset(
        GPTConfig(vocab_size=50257, seq_len=64, d_model=64, n_heads=2, n_layers=2),
        batch_size=1,
        description="the paper's run: T 64, d 64, 2 heads, 2 layers, batch 1",
    ),
    "small": Preset(
        GPTConfig(vocab_size=50257, seq_len=256, d_model=256, n_heads=4, n_layers=4),
        batch_size=4,
        description="T 256, d 256, 4 heads, 4 layers, batch 4",
    ),
    "tiny": Preset(
        GPTConfig(vocab_size=50257, seq_len=32, d_model=32, n_heads=2, n_layers=1),
        batch_size=2,
        description="a smoke-test model: T 32, d 32, 2 heads, 1 layer, batch 2",
    ),
}


def _dense(cfg: GPTConfig, group: str, features: int, name: str, use_bias: bool = True):
    return SketchedDense(
        features,
        use_bias=use_bias,
        estimator=cfg.estimator_for(group),
        rank=cfg.rank,
        lam=cfg.lam,
        dtype=DTYPES[cfg.dtype],
        name=name,
    )


class CausalSelfAttention(nn.Module):
    cfg: GPTConfig

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        cfg = self.cfg
        b, t, d = x.shape
        head_dim = d // cfg.n_heads
        qkv = _dense(cfg, "attn", 3 * d, "qkv")(x)
        q, k, v = jnp.split(qkv.reshape(b, t, 3 * cfg.n_heads, head_dim), 3, axis=2)
        q, k, v = (checkpoint_name(a, ATTENTION) for a in (q, k, v))
        y = causal_attention(q, k, v, cfg.attention)
        return _dense(cfg, "attn", d, "out")(y.reshape(b, t, d))


class MLP(nn.Module):
    cfg: GPTConfig

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        d = self.cfg.d_model
        h = _dense(self.cfg, "mlp", 4 * d, "fc")(x)
        return _dense(self.cfg, "mlp", d, "proj")(gelu(h, recompute=self.cfg.recompute_activations))


def _layer_norm(cfg: GPTConfig, name: str, x: jax.Array) -> jax.Array:
    """``nn.LayerNorm``; with ``recompute_activations`` it keeps only its input."""
    norm = nn.remat(nn.LayerNorm) if cfg.recompute_activations else LayerNorm
    return norm(name=name)(checkpoint_name(x, NONLINEARITY))


class Block(nn.Module):
    cfg: GPTConfig

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = x + CausalSelfAttention(self.cfg, name="attn")(_layer_norm(self.cfg, "ln_1", x))
        return x + MLP(self.cfg, name="mlp")(_layer_norm(self.cfg, "ln_2", x))


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
        block = Block if cfg.remat == "none" else nn.remat(Block, policy=REMAT_POLICIES[cfg.remat])
        for i in range(cfg.n_layers):
            x = block(cfg, name=f"block_{i}")(x)
        x = _layer_norm(cfg, "ln_f", x)
        if targets is not None and cfg.head_chunk:
            return FusedHead(
                cfg.vocab_size,
                cfg.head_chunk,
                estimator=cfg.estimator_for("head"),
                rank=cfg.rank,
                lam=cfg.lam,
                dtype=DTYPES[cfg.dtype],
                name="head",
            )(x, targets)
        logits = _dense(cfg, "head", cfg.vocab_size, "head", use_bias=False)(x)
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
    """Parameters for ``cfg``; the same for every estimator, rank and λ given ``key``."""
    idx = jnp.zeros((batch_size, cfg.seq_len), jnp.int32)
    return GPT(cfg.replace(estimator="exact")).init({"params": key}, idx)["params"]


def loss_fn(cfg: GPTConfig, params, batch: jax.Array, sketch_key: jax.Array | None) -> jax.Array:
    """Mean next-token cross-entropy of ``batch`` (B, T+1) under ``cfg``'s estimator."""
    rngs = None if cfg.estimator == "exact" else {"sketch": sketch_key}
    return GPT(cfg).apply({"params": params}, batch[:, :-1], batch[:, 1:], rngs=rngs)
