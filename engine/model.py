"""A pre-LayerNorm GPT (nanoGPT layout) whose dense layers may be sketched.

Blocks: ``x + Attn(LN(x))`` then ``x + MLP(LN(x))`` with causal multi-head
attention, a 4× GELU MLP, learned positions and an untied LM head without
bias. Which dense layers use the sketched dW is ``GPTConfig.sketched_layers``:

- ``mlp+head``: both MLP layers of every block and the LM head (the paper's code)
- ``mlp``: both MLP layers of every block
- ``all``: ``mlp+head`` plus the attention q/k/v and output projections
- ``none``: nothing sketched (exact backprop whatever the estimator)

Parameter names and shapes never depend on the estimator, rank or sketched
layers, so every method of a seed starts from the same parameters.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from engine.basis import validate
from engine.layers import SketchedDense

SKETCHED_LAYER_CHOICES = ("mlp+head", "mlp", "all", "none")
_GROUPS = {
    "mlp+head": {"mlp", "head"},
    "mlp": {"mlp"},
    "all": {"mlp", "head", "attn"},
    "none": set(),
}
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


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

    def __post_init__(self):
        for name in ("vocab_size", "seq_len", "d_model", "n_heads", "n_layers"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1 (got {value!r})")
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
        """Param-tree paths of the kernels whose dW is sketched (empty when exact)."""
        if self.estimator == "exact":
            return []
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
        y = jax.nn.dot_product_attention(q, k, v, is_causal=True)
        return _dense(cfg, "attn", d, "out")(y.reshape(b, t, d))


class MLP(nn.Module):
    cfg: GPTConfig

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        d = self.cfg.d_model
        h = nn.gelu(_dense(self.cfg, "mlp", 4 * d, "fc")(x))
        return _dense(self.cfg, "mlp", d, "proj")(h)


class Block(nn.Module):
    cfg: GPTConfig

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = x + CausalSelfAttention(self.cfg, name="attn")(nn.LayerNorm(name="ln_1")(x))
        return x + MLP(self.cfg, name="mlp")(nn.LayerNorm(name="ln_2")(x))


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
        for i in range(cfg.n_layers):
            x = Block(cfg, name=f"block_{i}")(x)
        x = nn.LayerNorm(name="ln_f")(x)
        logits = _dense(cfg, "head", cfg.vocab_size, "head", use_bias=False)(x)
        if targets is None:
            return logits
        return cross_entropy(logits, targets)


def cross_entropy(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """Mean over all positions of −log softmax(logits)[target], in float32."""
    return optax.softmax_cross_entropy_with_integer_labels(
        logits.astype(jnp.float32), targets
    ).mean()


def init_params(cfg: GPTConfig, key: jax.Array, batch_size: int = 1):
    """Parameters for ``cfg``; the same for every estimator, rank and λ given ``key``."""
    idx = jnp.zeros((batch_size, cfg.seq_len), jnp.int32)
    return GPT(cfg.replace(estimator="exact")).init({"params": key}, idx)["params"]


def loss_fn(cfg: GPTConfig, params, batch: jax.Array, sketch_key: jax.Array | None) -> jax.Array:
    """Mean next-token cross-entropy of ``batch`` (B, T+1) under ``cfg``'s estimator."""
    rngs = None if cfg.estimator == "exact" else {"sketch": sketch_key}
    return GPT(cfg).apply({"params": params}, batch[:, :-1], batch[:, 1:], rngs=rngs)
