"""Flax modules around the sketched matmul and the fused LM head, and the GELU.

Values kept whole for the backward pass are tagged at their consumer with
``jax.ad_checkpoint.checkpoint_name`` (an identity), so that ``engine.metrics``
can tell what each saved byte is for: the input of a dense layer
(``DENSE_INPUT``) or of a nonlinearity (``NONLINEARITY``), or attention state
(``ATTENTION``).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from engine.attention import ATTENTION
from engine.basis import DENSE_INPUT, sketched_matmul
from engine.head import LOSS_LOGITS, head_loss

__all__ = ["ATTENTION", "DENSE_INPUT", "LOSS_LOGITS", "NONLINEARITY"]  # the residual tags

SKETCH_RNG = "sketch"
NONLINEARITY = "nonlinearity"
# what a dense layer's dW is made of, for engine.diagnostics: its input X is sown
# into CAPTURED_INPUTS (only when that collection is mutable) and a zero perturbation
# from CAPTURED_GRADS (only when passed) is added to its output, whose gradient is dY
CAPTURED_INPUTS = "dense_inputs"
CAPTURED_GRADS = "dense_output_grads"


class SketchedDense(nn.Module):
    """``y = x @ kernel + bias``: exact forward and dX, dW from a rank-R sketch.

    The bias gradient Σ_b dY[b] is always exact. The sketch key comes from the
    RNG stream ``sketch`` (``rngs={"sketch": key}`` in ``apply``), so parameter
    initialisation never depends on the estimator. ``estimator="exact"`` needs no
    sketch key at all.
    """

    features: int
    use_bias: bool = True
    estimator: str = "exact"
    rank: int = 1
    lam: float = 0.0
    dtype: jnp.dtype = jnp.float32
    kernel_init: nn.initializers.Initializer = nn.initializers.normal(0.02)

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        kernel = self.param("kernel", self.kernel_init, (x.shape[-1], self.features), jnp.float32)
        x = checkpoint_name(x.astype(self.dtype), DENSE_INPUT)
        kernel = kernel.astype(self.dtype)
        self.sow(CAPTURED_INPUTS, "x", x)
        if self.estimator == "exact":
            y = x @ kernel
        else:
            key = self.make_rng(SKETCH_RNG)
            y = sketched_matmul(x, kernel, key, rank=self.rank, lam=self.lam, estimator=self.estimator)
        y = self.perturb("dy", y, collection=CAPTURED_GRADS)
        if self.use_bias:
            bias = self.param("bias", nn.initializers.zeros, (self.features,), jnp.float32)
            y = y + bias.astype(self.dtype)
        return y


class FusedHead(nn.Module):
    """The bias-free LM head and mean cross-entropy in one (``engine.head.head_loss``).

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

    @nn.compact
    def __call__(self, x: jax.Array, targets: jax.Array) -> jax.Array:
        kernel = self.param("kernel", self.kernel_init, (x.shape[-1], self.features), jnp.float32)
        key = None if self.estimator == "exact" else self.make_rng(SKETCH_RNG)
        return head_loss(
            x.astype(self.dtype), kernel.astype(self.dtype), targets, key,
            chunk=self.chunk, estimator=self.estimator, rank=self.rank, lam=self.lam,
        )


def gelu(h: jax.Array, *, recompute: bool) -> jax.Array:
    """GELU, tanh form (``nn.gelu``). With ``recompute`` only its input h is kept for
    the backward pass, which recomputes the tanh terms (a few elementwise passes)."""
    h = checkpoint_name(h, NONLINEARITY)
    return jax.checkpoint(nn.gelu)(h) if recompute else nn.gelu(h)
