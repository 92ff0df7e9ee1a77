"""Sketched matrix multiplication: exact forward and exact dX, sketched dW.

For a dense layer ``Y = X W`` with ``X ∈ R^{B×N}`` (all leading dims of ``x`` are
flattened into the B sketched rows) and ``W ∈ R^{N×M}``::

    dX = dY Wᵀ                                     (exact)
    dW ≈ X̂ᵀ dŶ,  X̂ = c · γ_X · S X,  dŶ = c · γ_dY · S dY,  c = 1 − λ

with a random sketch ``S ∈ R^{R×B}`` drawn afresh from ``key`` at every step.

Estimators (the family studied in the paper, selected by name):

=============  ==================  ==================  ==========
name           S                   invariant scalars   E[dW]
=============  ==================  ==================  ==========
exact          (none)              --                  dW
basis          balanced hash       yes                 biased
countsketch    uniform hash        no                  c² dW
balanced       balanced hash       no                  c² dW
scalars        uniform hash        yes                 biased
gaussian       N(0, 1/R) entries   no                  c² dW
=============  ==================  ==================  ==========

Hash sketches have ``S[r, b] = s(b)·[h(b) = r]`` with Rademacher signs ``s``.
Uniform hashing draws ``h(b)`` independently; balanced hashing is a random
permutation of ``arange(B) mod R``, so every bin holds ⌊B/R⌋ or ⌈B/R⌉ rows. In
both cases ``E[SᵀS] = I``, so the estimator without scalars is unbiased. The
invariant scalar ``γ_X = ‖X‖_F / (‖SX‖_F + ε)`` makes the sketch keep exactly the
Frobenius norm of X (likewise for dY), trading a small bias for lower variance.

R is clipped to B. At R = B balanced hashing is a signed permutation, so
``SᵀS = I`` and dW is exact up to the factor c².

Only ``X̂`` (R×N), ``W`` and ``key`` are saved for the backward pass; the hash
and signs are replayed from ``key`` (inside one jit XLA computes them once for both
passes). A hash sketch costs one pass over its input: a segment sum (O(B·N)), or
with few rows or small R the signed one-hot product S·a (see ``DENSE_MAX_RANK``).
Sketches are accumulated in float32 whatever the input dtype.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

ESTIMATORS = ("exact", "basis", "countsketch", "balanced", "scalars", "gaussian")
SKETCH_KIND = {  # the S each non-exact estimator draws
    "basis": "balanced",
    "countsketch": "uniform",
    "balanced": "balanced",
    "scalars": "uniform",
    "gaussian": "gaussian",
}
USES_SCALARS = frozenset({"basis", "scalars"})  # estimators with invariant scalars
EPS = 1e-12  # ε of γ = ‖a‖_F / (‖S a‖_F + ε)


class Sketch(NamedTuple):
    """Everything that defines S ∈ R^{R×B}; rebuilt from the key in the backward pass."""

    kind: str  # "balanced", "uniform" or "gaussian"
    rank: int
    bins: jax.Array | None  # hash sketches: h(b) ∈ [0, R)
    signs: jax.Array | None  # hash sketches: s(b) ∈ {−1, +1}
    dense: jax.Array | None  # gaussian: S itself, entries N(0, 1/R)


def validate(estimator: str, rank: int, lam: float) -> None:
    """Raise ``ValueError`` naming the fix for an unknown estimator, rank < 1 or λ ∉ [0, 1)."""
    if estimator not in ESTIMATORS:
        raise ValueError(
            f"unknown estimator {estimator!r}; choose one of {', '.join(ESTIMATORS)}"
        )
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ValueError(f"rank must be an integer >= 1 (got {rank!r}); use rank=1 or more")
    if not (isinstance(lam, (int, float)) and 0.0 <= lam < 1.0):
        raise ValueError(f"lam (λ) must be in [0, 1) (got {lam!r}); use 0.0 for no shrink")


def draw_sketch(key: jax.Array, kind: str, rows: int, rank: int) -> Sketch:
    """Draw S for ``rows`` = B input rows and ``rank`` = R ≤ B bins.

    Balanced: h = RandomPermutation(arange(B) mod R). Uniform: h(b) ~ U{0..R−1} iid.
    """
    k_hash, k_sign = jax.random.split(key)
    if kind == "gaussian":
        dense = jax.random.normal(k_hash, (rank, rows), jnp.float32) / math.sqrt(rank)
        return Sketch(kind, rank, None, None, dense)
    signs = jax.random.rademacher(k_sign, (rows,), jnp.float32)
    if kind == "balanced":
        # argsort of iid 32-bit keys is a uniform permutation (one sort, where
        # jax.random.permutation does two); a tie (chance ≈ B²/2³³) only keeps two
        # rows in order, and bins stay balanced whatever the order
        bins = _argsort(jax.random.bits(k_hash, (rows,), jnp.uint32)) % rank
    else:
        bins = jax.random.randint(k_hash, (rows,), 0, rank, dtype=jnp.int32)
    return Sketch(kind, rank, bins, signs, None)


def _argsort(keys: jax.Array) -> jax.Array:
    """``jnp.argsort(keys)`` (stable, as int32) of a 1-D array of keys.

    The keys alone are sorted, each key's rank found by binary search, and the order
    is the inverse of the ranks: 0.25 ms against 0.70 ms for the key-and-index sort of
    ``jnp.argsort`` at 4096 keys on the 2-core CPU. Tied keys share a rank, so then
    ``jnp.argsort`` itself runs.
    """
    n = keys.shape[0]
    ordered = jnp.sort(keys)

    def invert_ranks(keys):
        rank = jnp.searchsorted(ordered, keys).astype(jnp.int32)
        index = jnp.arange(n, dtype=jnp.int32)
        return jnp.zeros(n, jnp.int32).at[rank].set(index, unique_indices=True)

    tie = jnp.any(ordered[1:] == ordered[:-1])
    return jax.lax.cond(tie, lambda k: jnp.argsort(k).astype(jnp.int32), invert_ranks, keys)


# A hash sketch is applied in one of two ways. With few rows or small R, as the signed
# one-hot product S·a (2·R·B·F flops, one streaming pass). Otherwise as a segment sum of
# the rows of a into 2R bins, h(b) when s(b) = +1 and R + h(b) when s(b) = −1, then the
# first R minus the last R: one scattered pass over a, where scattering a·s would first
# write a signed copy of a. Measured on the 2-core CPU, at B = 4096, F = 1024: the
# segment sum 0.63–0.68 ms at any R (a·s scattered: 1.35 ms), the product 0.46 ms at
# R = 1, 0.50 at R = 2, 0.55 at R = 4, 0.80 at R = 8, 2.1 at R = 32. At B = 64, F = 50257
# (the LM head's dY) the product wins at every R (0.39, 0.52, 1.14 ms at R = 1, 8, 32
# against 0.53, 1.15, 1.92): scattering into wide rows costs more per element.
DENSE_MAX_RANK = 4
_DENSE_MAX_ROWS = 256


def apply_sketch(sketch: Sketch, a: jax.Array) -> jax.Array:
    """Return S a (R × F, float32) for a of shape (B, F).

    Hash sketches take s(b) ∈ {−1, 0, +1}: a row with s(b) = 0 (padding) is left out.
    """
    a = a.astype(jnp.float32)
    rank = sketch.rank
    if sketch.kind == "gaussian":
        return sketch.dense @ a
    if rank <= DENSE_MAX_RANK or a.shape[0] <= _DENSE_MAX_ROWS:
        onehot = sketch.bins[None, :] == jnp.arange(rank, dtype=jnp.int32)[:, None]
        return jnp.where(onehot, sketch.signs[None, :], 0.0) @ a
    # sign-split bins; s(b) = 0 maps to 2R, out of range, which segment_sum drops
    split = jnp.where(sketch.signs > 0, sketch.bins, sketch.bins + rank)
    split = jnp.where(sketch.signs == 0, 2 * rank, split)
    sums = jax.ops.segment_sum(a, split, num_segments=2 * rank)
    return sums[:rank] - sums[rank:]


def sketch_rows(
    a: jax.Array, sketch: Sketch, *, scalars: bool, shrink: float
) -> jax.Array:
    """X̂ = (1 − λ) · γ · S a with γ = ‖a‖_F / (‖S a‖_F + ε) when ``scalars``, else γ = 1."""
    sa = apply_sketch(sketch, a)
    if scalars:
        norm_a = jnp.linalg.norm(a.astype(jnp.float32))
        sa = sa * (norm_a / (jnp.linalg.norm(sa) + EPS))
    return sa * shrink if shrink != 1.0 else sa


def sketched_matmul(
    x: jax.Array,
    w: jax.Array,
    key: jax.Array,
    *,
    rank: int,
    lam: float = 0.0,
    estimator: str = "basis",
) -> jax.Array:
    """``y = x @ w`` whose backward pass returns exact dX and a sketched dW.

    Args:
      x: (..., N); every leading dim is a sketched row, B = prod(x.shape[:-1]).
      w: (N, M).
      key: PRNG key, fresh each step; it only draws S (its gradient is zero).
      rank: R ≥ 1, clipped to B.
      lam: shrink λ ∈ [0, 1); both sketches are scaled by (1 − λ).
      estimator: one of ``ESTIMATORS``; ``exact`` is an ordinary matmul.
    """
    validate(estimator, rank, lam)
    if x.ndim < 1 or w.ndim != 2 or x.shape[-1] != w.shape[0]:
        raise ValueError(
            f"shape mismatch: x {tuple(x.shape)} @ w {tuple(w.shape)}; "
            "x must be (..., N) and w (N, M)"
        )
    if estimator == "exact":
        return x @ w
    lead = x.shape[:-1]
    rows = math.prod(lead)
    y = _sketched_2d(x.reshape(rows, x.shape[-1]), w, key, min(rank, rows), float(lam), estimator)
    return y.reshape(*lead, w.shape[1])


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _sketched_2d(x, w, key, rank, lam, estimator):
    return x @ w


def _fwd(x, w, key, rank, lam, estimator):
    sketch = draw_sketch(key, SKETCH_KIND[estimator], x.shape[0], rank)
    x_hat = sketch_rows(x, sketch, scalars=estimator in USES_SCALARS, shrink=1.0 - lam)
    x_dtype = jnp.zeros((0,), x.dtype)  # zero-size: carries x's dtype for dX
    return x @ w, (x_hat, w, key, x_dtype)


def _bwd(rank, lam, estimator, residuals, dy):
    x_hat, w, key, x_dtype = residuals
    sketch = draw_sketch(key, SKETCH_KIND[estimator], dy.shape[0], rank)
    dy_hat = sketch_rows(dy, sketch, scalars=estimator in USES_SCALARS, shrink=1.0 - lam)
    dx = (dy @ w.T).astype(x_dtype.dtype)
    dw = (x_hat.T @ dy_hat).astype(w.dtype)
    return dx, dw, None


_sketched_2d.defvjp(_fwd, _bwd)
