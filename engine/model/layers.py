"""Flax modules around the sketched matmul and the fused LM head, LayerNorm and the GELU.

Values kept whole for the backward pass are tagged with
``jax.ad_checkpoint.checkpoint_name`` (``engine.sketch.residuals``), so that ``engine.model.memory``
can tell what each saved byte is for: the input of a dense layer (``DENSE_INPUT``) or
of a nonlinearity (``NONLINEARITY``); what LayerNorm and the GELU keep when they do not
recompute is tagged ``NONLINEARITY`` through ``keep_tagged``.
"""

from __future__ import annotations

from typing import cast

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from engine.core.estimators import lookup
from engine.sketch.basis import sketched_matmul
from engine.sketch.head import head_loss
from engine.sketch.residuals import ATTENTION, DENSE_INPUT, NONLINEARITY, keep_tagged

__all__ = ["ATTENTION", "DENSE_INPUT", "NONLINEARITY"]  # the residual tags, re-exported

SKETCH_RNG = "sketch"
# what a dense layer's dW is made of, for engine.analysis.diagnostics: its input X is sown
# into CAPTURED_INPUTS (only when that collection is mutable) and a zero perturbation
# from CAPTURED_GRADS (only when passed) is added to its output, whose gradient is dY
CAPTURED_INPUTS = "dense_inputs"
CAPTURED_GRADS = "dense_output_grads"


class SketchedDense(nn.Module):
    """``y = x @ kernel + bias``: exact forward and dX, dW from a rank-R sketch.

    The bias gradient Σ_b dY[b] is always exact. The sketch key comes from the
    RNG stream ``sketch`` (``rngs={"sketch": key}`` in ``apply``), so parameter
    initialisation never depends on the estimator. ``estimator="exact"`` needs no
    sketch key at all, nor does an estimator whose entry needs none. With ``layers`` > 1 the caller passes ``key``, shared by the
    ``layers`` layers whose hash sketches are drawn together, and this is ``layer``
    (``engine.sketch.basis.sketched_matmul``).
    """

    features: int
    use_bias: bool = True
    estimator: str = "exact"
    rank: int = 1
    lam: float = 0.0
    dtype: jnp.dtype = jnp.float32
    kernel_init: nn.initializers.Initializer = nn.initializers.normal(0.02)
    gather_axis: str | None = None  # engine.sketch.basis.sketched_matmul's
    layer: int = 0  # sketched_matmul's, with the key passed to __call__
    layers: int = 1

    @nn.compact
    def __call__(self, x: jax.Array, key: jax.Array | None = None) -> jax.Array:
        kernel = self.param("kernel", self.kernel_init, (x.shape[-1], self.features), jnp.float32)
        x = checkpoint_name(x.astype(self.dtype), DENSE_INPUT)
        kernel = kernel.astype(self.dtype)
        self.sow(CAPTURED_INPUTS, "x", x)
        spec = lookup(self.estimator)
        if spec.exact:
            y = x @ kernel
        else:
            key = self.make_rng(SKETCH_RNG) if key is None and spec.needs_key else key
            y = sketched_matmul(x, kernel, key, rank=self.rank, lam=self.lam, estimator=self.estimator,
                                gather_axis=self.gather_axis, layer=self.layer, layers=self.layers)
        y = self.perturb("dy", y, collection=CAPTURED_GRADS)
        if self.use_bias:
            bias = self.param("bias", nn.initializers.zeros, (self.features,), jnp.float32)
            y = y + bias.astype(self.dtype)
        return y


class FusedHead(nn.Module):
    """The bias-free LM head and mean cross-entropy in one (``engine.sketch.head.head_loss``).

    Same parameter (``kernel``, N×V) and sketch key as ``SketchedDense(V,
    use_bias=False)`` under the same name, so either can stand in for the other.
    """

    features: int
    chunk: int
    estimator: str = "exact"
    rank: int = 1
    lam: float = 0.0
    dtype: jnp.dtype = jnp.float32
    kernel_init: nn.initializers.Initializer = nn.initializers.normal(0.02)
    gather_axis: str | None = None  # engine.sketch.head.head_loss's
    layer: int = 0  # as SketchedDense's
    layers: int = 1

    @nn.compact
    def __call__(self, x: jax.Array, targets: jax.Array, key: jax.Array | None = None) -> jax.Array:
        kernel = self.param("kernel", self.kernel_init, (x.shape[-1], self.features), jnp.float32)
        if not lookup(self.estimator).needs_key:
            key = None
        elif key is None:
            key = self.make_rng(SKETCH_RNG)
        return head_loss(
            x.astype(self.dtype), kernel.astype(self.dtype), targets, key,
            chunk=self.chunk, estimator=self.estimator, rank=self.rank, lam=self.lam,
            gather_axis=self.gather_axis, layer=self.layer, layers=self.layers,
        )


_gelu_kept = keep_tagged(nn.gelu, NONLINEARITY)


def gelu(h: jax.Array, *, recompute: bool) -> jax.Array:
    """GELU, tanh form (``nn.gelu``). With ``recompute`` only its input h is kept for
    the backward pass, which recomputes the tanh terms (a few elementwise passes)."""
    h = checkpoint_name(h, NONLINEARITY)
    return jax.checkpoint(nn.gelu)(h) if recompute else _gelu_kept(h)


def _layer_norm(x: jax.Array, scale: jax.Array, bias: jax.Array) -> jax.Array:
    # apply's annotation also covers mutable collections (output, state); without them: the output
    return cast(jax.Array, nn.LayerNorm().apply({"params": {"scale": scale, "bias": bias}}, x))


_layer_norm_kept = keep_tagged(_layer_norm, NONLINEARITY)


class LayerNorm(nn.Module):
    """``nn.LayerNorm`` (same parameters), whose saved internals are tagged ``NONLINEARITY``."""

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        features = (x.shape[-1],)
        scale = self.param("scale", nn.initializers.ones, features, jnp.float32)
        bias = self.param("bias", nn.initializers.zeros, features, jnp.float32)
        return _layer_norm_kept(x, scale, bias)
