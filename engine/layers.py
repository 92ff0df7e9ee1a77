"""Flax modules around the sketched matmul."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from engine.basis import sketched_matmul

SKETCH_RNG = "sketch"


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
        key = None if self.estimator == "exact" else self.make_rng(SKETCH_RNG)
        y = sketched_matmul(
            x.astype(self.dtype),
            kernel.astype(self.dtype),
            key,
            rank=self.rank,
            lam=self.lam,
            estimator=self.estimator,
        )
        if self.use_bias:
            bias = self.param("bias", nn.initializers.zeros, (self.features,), jnp.float32)
            y = y + bias.astype(self.dtype)
        return y
