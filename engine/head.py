"""LM head fused with the cross-entropy loss, computed in chunks of rows.

For rows X ∈ R^{B×N}, head W ∈ R^{N×V} and targets t, the loss is

    L = (1/B) Σ_b [lse(z_b) − z_b[t_b]],   Z = X W,   lse(z) = log Σ_v exp z_v,

and its logit gradient is dZ = (softmax(Z) − onehot(t)) / B, so

    dX = dZ Wᵀ,   dW = Xᵀ dZ                                  (exact)
    dW ≈ X̂ᵀ dẐ,  X̂ = c·γ_X·S X,  dẐ = c·γ_dZ·S dZ,  c = 1 − λ   (sketched)

with S, γ and the estimators of ``engine.basis`` (S drawn by ``draw_sketch`` from the
head's key, X̂ by ``sketch_rows``). The loss is the last operation, so its
cotangent is a scalar g and every gradient is g times the above: they are formed
during the forward pass, C rows at a time (logits → lse → loss and dZ → dX rows
and the chunk's share of Xᵀ dZ or of S dZ = Σ_chunks S[:, chunk] dZ[chunk]).
The B×V logits never exist at once. Kept for the backward pass: dX (B×N) and
dW (N×V) when exact; dX, X̂ (R×N) and dẐ (R×V) when sketched, where the weight
gradient costs R·N·V instead of B·N·V.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from engine.basis import EPS, SKETCH_KIND, USES_SCALARS, Sketch, apply_sketch, draw_sketch, sketch_rows, validate


def head_loss(
    x: jax.Array,
    w: jax.Array,
    targets: jax.Array,
    key: jax.Array | None,
    *,
    chunk: int,
    estimator: str = "exact",
    rank: int = 1,
    lam: float = 0.0,
) -> jax.Array:
    """Mean cross-entropy of ``softmax(x @ w)`` against ``targets``, float32.

    Args:
      x: (..., N) rows in the order ``sketched_matmul`` flattens them.
      w: (N, V).
      targets: integer array of shape x.shape[:-1].
      key: the head's sketch key (unused, may be None, when ``estimator="exact"``).
      chunk: rows per chunk C ≥ 1; B need not be a multiple of C.
      estimator, rank, lam: as ``engine.basis.sketched_matmul``; R is clipped to B.
    """
    validate(estimator, rank, lam)
    if estimator != "exact" and key is None:
        raise ValueError(f"estimator {estimator!r} needs a sketch key (got None)")
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f"chunk must be an integer >= 1 (got {chunk!r})")
    if w.ndim != 2 or x.shape[-1] != w.shape[0] or targets.shape != x.shape[:-1]:
        raise ValueError(
            f"shape mismatch: x {tuple(x.shape)} @ w {tuple(w.shape)} with targets "
            f"{tuple(targets.shape)}; need x (..., N), w (N, V), targets x.shape[:-1]"
        )
    rows = math.prod(targets.shape)
    return _head(
        x.reshape(rows, x.shape[-1]), w, targets.reshape(rows), key,
        min(chunk, rows), min(rank, rows), float(lam), estimator,
    )


def _chunked(a: jax.Array, chunk: int) -> jax.Array:
    """(B, ...) → (⌈B/C⌉, C, ...), zero-padded at the end."""
    pad = -a.shape[0] % chunk
    a = jnp.pad(a, [(0, pad)] + [(0, 0)] * (a.ndim - 1))
    return a.reshape(-1, chunk, *a.shape[1:])


def _chunk_inputs(x, targets, chunk):
    rows = x.shape[0]
    valid = jnp.arange(rows + (-rows % chunk)) < rows
    return _chunked(x, chunk), _chunked(targets, chunk), valid.reshape(-1, chunk)


def _logits(xc, w, tc):
    """exp(Z − m) and Σ_v exp(Z − m) with m = max_v Z (one exp per logit), and the
    per-row loss lse − Z[t] = log Σ + m − Z[t] of one chunk; float32."""
    z = (xc @ w).astype(jnp.float32)
    m = jnp.max(z, axis=-1, keepdims=True)
    e = jnp.exp(z - m)
    total = jnp.sum(e, axis=-1, keepdims=True)
    nll = jnp.log(total) + m - jnp.take_along_axis(z, tc[:, None], axis=-1)
    return e, total, nll[:, 0]


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7))
def _head(x, w, targets, key, chunk, rank, lam, estimator):
    def body(total, xs):
        xc, tc, valid = xs
        return total + jnp.sum(jnp.where(valid, _logits(xc, w, tc)[2], 0.0)), None

    total, _ = jax.lax.scan(body, jnp.zeros((), jnp.float32), _chunk_inputs(x, targets, chunk))
    return total / x.shape[0]


def _sketch_chunks(sketch: Sketch, chunk: int) -> tuple:
    """The columns of S, chunk by chunk: (bins, signs, dense) each with a leading chunk axis."""
    if sketch.kind == "gaussian":
        dense = _chunked(sketch.dense.T, chunk)  # (K, C, R)
        return None, None, jnp.swapaxes(dense, 1, 2)
    return _chunked(sketch.bins, chunk), _chunked(sketch.signs, chunk), None


def _fwd(x, w, targets, key, chunk, rank, lam, estimator):
    rows, v = x.shape[0], w.shape[1]
    exact = estimator == "exact"
    if exact:  # dWᵀ (V×N): dZᵀ X runs faster on CPU than Xᵀ dZ for chunks of rows
        sketch, parts, acc = None, None, jnp.zeros((v, x.shape[1]), jnp.float32)
    else:
        sketch = draw_sketch(key, SKETCH_KIND[estimator], rows, rank)
        parts, acc = _sketch_chunks(sketch, chunk), jnp.zeros((rank, v), jnp.float32)

    def body(carry, xs):
        total, acc, sq = carry
        (xc, tc, valid), part = xs
        e, sum_e, nll = _logits(xc, w, tc)
        onehot = tc[:, None] == jnp.arange(v, dtype=tc.dtype)
        dz = jnp.where(valid[:, None], e / sum_e - onehot, 0.0) / rows
        dzc = dz.astype(w.dtype)
        if exact:
            acc = acc + jnp.matmul(dzc.T, xc, preferred_element_type=jnp.float32)
        else:
            acc = acc + apply_sketch(Sketch(sketch.kind, rank, *part), dz)
            sq = sq + jnp.sum(dz * dz)
        total = total + jnp.sum(jnp.where(valid, nll, 0.0))
        return (total, acc, sq), (dzc @ w.T).astype(x.dtype)

    zero = jnp.zeros((), jnp.float32)
    (total, acc, sq), dx = jax.lax.scan(
        body, (zero, acc, zero), (_chunk_inputs(x, targets, chunk), parts)
    )
    dx = dx.reshape(-1, x.shape[1])[:rows]
    if exact:
        return total / rows, (dx, acc.T.astype(w.dtype))
    scalars = estimator in USES_SCALARS
    x_hat = sketch_rows(x, sketch, scalars=scalars, shrink=1.0 - lam)
    dz_hat = acc * (jnp.sqrt(sq) / (jnp.linalg.norm(acc) + EPS)) if scalars else acc
    w_dtype = jnp.zeros((0,), w.dtype)  # zero-size: carries w's dtype for dW
    return total / rows, (dx, x_hat, dz_hat * (1.0 - lam), w_dtype)


def _bwd(chunk, rank, lam, estimator, residuals, g):
    if estimator == "exact":
        dx, dw = residuals
    else:
        dx, x_hat, dz_hat, w_dtype = residuals
        dw = (x_hat.T @ dz_hat).astype(w_dtype.dtype)
    return (g * dx).astype(dx.dtype), (g * dw).astype(dw.dtype), None, None


_head.defvjp(_fwd, _bwd)
