"""Causal multi-head attention, with a backward pass that recomputes the probabilities.

For one head with queries, keys, values Q, K, V ∈ R^{T×D}::

    S = Q Kᵀ / √D + M          (M = 0 on and below the diagonal, −∞ above)
    ℓ = logsumexp_rows(S),  P = exp(S − ℓ),  O = P V

Backward, from dO (flash-attention style, P rebuilt from Q, K and ℓ)::

    dV = Pᵀ dO,  dP = dO Vᵀ,  dS = P ∘ (dP − rowsum(P ∘ dP)),
    dQ = dS K / √D,  dK = dSᵀ Q / √D

``rowsum(P ∘ dP)`` equals ``rowsum(dO ∘ O)``, so O need not be kept either: the
backward pass holds Q, K, V and ℓ (B·H·T floats) instead of the B·H·T×T probabilities.
Arrays use the (batch, time, heads, head_dim) layout of ``jax.nn.dot_product_attention``.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from engine.core.choices import ATTENTION_CHOICES
from engine.sketch.residuals import ATTENTION, keep_tagged, tag_all


def causal_attention(q: jax.Array, k: jax.Array, v: jax.Array, implementation: str = "xla") -> jax.Array:
    """softmax(Q Kᵀ/√D + M) V for (B, T, H, D) inputs.

    ``xla``: ``jax.nn.dot_product_attention`` (the fused kernel where the backend has
    one; on CPU it keeps the probabilities for the backward pass). ``recompute``: the
    custom VJP of this module, which keeps only Q, K, V and the row log-sum-exp.
    """
    if implementation == "xla":
        return _xla_attention(q, k, v)
    if implementation == "recompute":
        return recompute_attention(q, k, v)
    raise ValueError(
        f"attention must be one of {', '.join(ATTENTION_CHOICES)} (got {implementation!r})"
    )


# jax.nn.dot_product_attention, with what it keeps for its backward pass tagged
_xla_attention = keep_tagged(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True), ATTENTION)


def _scores(q: jax.Array, k: jax.Array) -> jax.Array:
    """S = Q Kᵀ / √D + M as (B, H, T, T) float32."""
    t = q.shape[1]
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32)
    causal = jnp.arange(t)[:, None] >= jnp.arange(t)[None, :]
    return jnp.where(causal, s / math.sqrt(q.shape[-1]), -jnp.inf)


def _attend(q, k, v):
    s = _scores(q, k)
    lse = jax.nn.logsumexp(s, axis=-1)
    p = jnp.exp(s - lse[..., None])
    o = jnp.einsum("bhqk,bkhd->bqhd", p.astype(v.dtype), v)
    return o, lse


@jax.custom_vjp
def recompute_attention(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    """Causal attention whose backward pass recomputes P from Q, K and ℓ."""
    return _attend(q, k, v)[0]


def _fwd(q, k, v):
    o, lse = _attend(q, k, v)
    return o, tag_all((q, k, v, lse), ATTENTION)


def _bwd(residuals, do):
    # the barrier keeps XLA from merging this recomputation with the forward pass's
    # (common-subexpression elimination would keep the B·H·T×T probabilities alive)
    q, k, v, lse = jax.lax.optimization_barrier(residuals)
    p = jnp.exp(_scores(q, k) - lse[..., None])
    dv = jnp.einsum("bhqk,bqhd->bkhd", p, do, preferred_element_type=jnp.float32)
    dp = jnp.einsum("bqhd,bkhd->bhqk", do, v, preferred_element_type=jnp.float32)
    ds = p * (dp - jnp.sum(p * dp, axis=-1, keepdims=True)) / math.sqrt(q.shape[-1])
    dq = jnp.einsum("bhqk,bkhd->bqhd", ds, k, preferred_element_type=jnp.float32)
    dk = jnp.einsum("bhqk,bqhd->bkhd", ds, q, preferred_element_type=jnp.float32)
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype)


recompute_attention.defvjp(_fwd, _bwd)
