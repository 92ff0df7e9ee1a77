"""Sketched matrix multiplication: exact forward and exact dX, sketched dW.

For a dense layer ``Y = X W`` with ``X ∈ R^{B×N}`` (all leading dims of ``x`` are
flattened into the B sketched rows) and ``W ∈ R^{N×M}``::

    dX = dY Wᵀ                                     (exact, every estimator)
    dW ≈ X̂ᵀ dŶ,  X̂ = c · γ_X · S X,  dŶ = c · γ_dY · S dY,  c = 1 − λ

with a random sketch ``S ∈ R^{R×B}`` drawn afresh from ``key`` at every step.
The peer estimators below (row sampling, feature projection) are written in the
same form with their own S, and every one takes the same shrink c² = (1 − λ)².

Estimators (selected by name) are entries of ``engine.core.estimators``: each states its
S (``sketch``), its bias, and the bytes its backward pass keeps for dW (``kept_bytes``);
this module runs the math of every family, reading only the entry. "Rank R" means R
rows' worth of X, R·N floats, so methods compare at equal memory.

Hash sketches have ``S[r, b] = s(b)·[h(b) = r]`` with Rademacher signs ``s``.
Uniform hashing draws ``h(b)`` independently; balanced hashing is a random
permutation of ``arange(B) mod R``, so every bin holds ⌊B/R⌋ or ⌈B/R⌉ rows. In
both cases ``E[SᵀS] = I``, so the estimator without scalars is unbiased. The
invariant scalar ``γ_X = ‖X‖_F / (‖SX‖_F + ε)`` makes the sketch keep exactly the
Frobenius norm of X (likewise for dY), trading a small bias for lower variance.

Row sampling (``crs``, ``wta-crs``; ``sample_rows``) keeps R weighted rows
``x̃_j = c² w_j x_{i_j}`` and their indices, and ``dW ≈ Σ_j x̃_jᵀ dy_{i_j}``: dY is
unknown in the forward pass, so the probabilities use X alone, ``p_b ∝ ‖x_b‖``.
Feature projection (``proj``; ``projection``) sketches the other axis:
``dW ≈ c² P (X P)ᵀ dY`` with ``P ∈ R^{N×k}`` regenerated from the key.

On several devices (``gather_axis``, a mesh axis inside ``shard_map``) each device
sketches only its own B_d rows with its own S_d, and the run's dW is Σ_d X̂_dᵀ dŶ_d.
By default the caller sums each device's d_in×d_out dW (an all-reduce). With
``gather_axis`` the backward pass instead all-gathers the R-row factors, X̂ (R×d_in)
and dŶ (R×d_out), and forms the sum as one product [X̂_1; …; X̂_D]ᵀ [dŶ_1; …; dŶ_D]
on every device: D·R·(d_in + d_out) floats move instead of the dW. Row sampling
gathers x̃ and dY[i] the same way; ``proj`` keeps its dW local (``gathers``).

R is clipped to B. At R = B balanced hashing is a signed permutation, so
``SᵀS = I`` and dW is exact up to the factor c²; ``wta-crs`` keeps every row
(exact up to c²); ``crs`` still draws B rows with replacement (random);
``proj`` has k = N and keeps X itself (exact up to c²). ``gaussian``,
``countsketch`` and ``scalars`` stay random at R = B.

What the backward pass keeps is tagged where it is made with
``jax.ad_checkpoint.checkpoint_name(·, DENSE_INPUT)``, so memory accounting can
sort it. The hash and signs (or P) are replayed from ``key`` (inside one jit XLA
computes them once for both passes; with ``layers`` > 1, once for all the layers drawn
together, ``engine.sketch.draws``). A hash sketch costs one pass over its input:
a segment sum (O(B·N)), or with few rows or small R the signed one-hot product S·a
(see ``DENSE_MAX_RANK``). Sketches are accumulated in float32 whatever the input
dtype.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from engine.core.estimators import Estimator, lookup
from engine.core.estimators.spec import projection_width
from engine.core.presets import validate_method
from engine.sketch.draws import Sketch, draw_sketch
from engine.sketch.draws import hashings_agree as hashings_agree  # re-exported
from engine.sketch.residuals import DENSE_INPUT

EPS = 1e-12  # ε of γ = ‖a‖_F / (‖S a‖_F + ε)

# A hash sketch S·a is applied in one of three ways (``SKETCH_METHODS``):
# - ``dense``: the signed one-hot product S·a (2·R·B·F flops, one streaming pass),
#   at float32 precision (a GPU's default TF32 product is off by 2–4 % of the sketch);
# - ``segment``: a segment sum of the rows of a into 2R bins, h(b) when s(b) = +1 and
#   R + h(b) when s(b) = −1, then the first R minus the last R (one scattered pass;
#   scattering a·s would first write a signed copy of a);
# - ``gather`` (balanced hashing only): gather the rows in bin order (``members``,
#   ⌈B/R⌉ slots per bin, an empty slot reads sign 0) and sum each bin by a reshape:
#   one read of a, no scatter;
# - ``dense-bf16``: the one-hot product in bfloat16, where S's 0 and ±1 are exact: a
#   bfloat16 a in one product, a wider a as the sum of three bfloat16 terms
#   (``bfloat16_terms``) in three, accumulated in float32: float32-accurate, for the
#   bfloat16 units of a GPU (never the default; ``bench/gpu.py --explore`` times it).
# Measured on the 2-core CPU, at B = 4096, F = 1024: the segment sum 0.63–0.68 ms at
# any R, the product 0.46 ms at R = 1, 0.80 at R = 8, 2.1 at R = 32. At B = 64,
# F = 50257 (the LM head's dY) the product wins at every R. On an H200 at B = 16384,
# F = 50257 (bench/gpu.py --explore): segment sum 3.9 ms at any R; gather 1.30, 1.01,
# 0.98 ms at R = 1, 8, 32 (one read of a takes 0.77); the product at float32 precision
# 1.00, 1.05, 2.18 ms. A GPU never scatters a wide array: it gathers above R = 4.
SKETCH_METHODS = ("dense", "segment", "gather", "dense-bf16")
DENSE_MAX_RANK = 4
_DENSE_MAX_ROWS = 256


def sketch_method(sketch: Sketch, rows: int, backend: str | None = None) -> str:
    """The fastest way to apply ``sketch`` to ``rows`` rows on ``backend`` (default: JAX's)."""
    if sketch.kind == "gaussian":
        return "dense"
    if (backend or jax.default_backend()) == "cpu":
        return "dense" if sketch.rank <= DENSE_MAX_RANK or rows <= _DENSE_MAX_ROWS else "segment"
    return "gather" if sketch.members is not None and sketch.rank > DENSE_MAX_RANK else "dense"


def apply_sketch(sketch: Sketch, a: jax.Array, method: str | None = None) -> jax.Array:
    """Return S a (R × F, float32, accumulated in float32 whatever a's dtype) for a of
    shape (B, F), by ``method`` (one of ``SKETCH_METHODS``; default ``sketch_method``).

    Hash sketches take s(b) ∈ {−1, 0, +1}: a row with s(b) = 0 (padding) is left out.
    """
    rank = sketch.rank
    method = method or sketch_method(sketch, a.shape[0])
    if sketch.kind == "gaussian":
        return jnp.matmul(sketch.matrix(), a.astype(jnp.float32), precision="highest")
    bins, signs = sketch.hashed()
    if method in ("dense", "dense-bf16"):
        onehot = bins[None, :] == jnp.arange(rank, dtype=jnp.int32)[:, None]
        s = jnp.where(onehot, signs[None, :], 0.0)
        if a.dtype == jnp.bfloat16 or method == "dense-bf16":  # ±1 and 0 are exact in bfloat16
            products = (jnp.matmul(s.astype(jnp.bfloat16), t, preferred_element_type=jnp.float32)
                        for t in bfloat16_terms(a))
            return functools.reduce(jnp.add, products)
        return jnp.matmul(s, a.astype(jnp.float32), precision="highest")
    if method == "gather":
        if sketch.members is None:
            raise ValueError(f"the gather method needs a balanced sketch (got {sketch.kind!r})")
        return binned_sum(sketch, a)
    if method != "segment":
        raise ValueError(f"unknown sketch method {method!r}; choose one of {', '.join(SKETCH_METHODS)}")
    # sign-split bins; s(b) = 0 maps to 2R, out of range, which segment_sum drops
    split = jnp.where(signs > 0, bins, bins + rank)
    split = jnp.where(signs == 0, 2 * rank, split)
    sums = jax.ops.segment_sum(a.astype(jnp.float32), split, num_segments=2 * rank)
    return sums[:rank] - sums[rank:]


def bfloat16_terms(a: jax.Array) -> tuple[jax.Array, ...]:
    """a as bfloat16 terms whose float32 sum is a to float32 rounding: (a,) for a bfloat16
    a; else hi = bf16(a), mid = bf16(a − hi), lo = bf16(a − hi − mid). Each rounding keeps
    8 significant bits, so |a − hi − mid − lo| ≤ 2⁻²⁷|a|, below half a float32 ulp."""
    if a.dtype == jnp.bfloat16:
        return (a,)
    rest = a.astype(jnp.float32)
    terms = []
    for _ in range(3):
        term = rest.astype(jnp.bfloat16)
        terms.append(term)
        rest = rest - term.astype(jnp.float32)
    return tuple(terms)


def binned_sum(sketch: Sketch, a: jax.Array) -> jax.Array:
    """S a for a balanced sketch: Σ_k s(m_kr)·a[m_kr] over the members m_kr of bin r."""
    return _binned(sketch, a)[0]


def _binned(sketch: Sketch, a: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(S a, ‖a‖²_F) of a balanced sketch from one read of a: every row of a is gathered
    once with sign ±1 (an empty slot reads sign 0), so Σ of the gathered rows' squares
    is ‖a‖²_F, summed in the same pass as the bins."""
    rows, rank = a.shape[0], sketch.rank
    slots = sketch.members
    if slots is None:
        raise ValueError(f"a {sketch.kind} sketch has no members; the binned sum needs a balanced one")
    valid = slots < rows
    index = jnp.where(valid, slots, 0)
    signs = jnp.where(valid, sketch.hashed()[1][index], 0.0)
    picked = jnp.take(a, index, axis=0, mode="clip").astype(jnp.float32) * signs[:, None]
    return axis_sum(picked.reshape(-1, rank, a.shape[1]), 0), jnp.sum(jnp.square(picked))


def axis_sum(a: jax.Array, axis: int, backend: str | None = None) -> jax.Array:
    """``a.sum(axis)``; on a CPU by pairwise halving along ``axis`` (⌈log₂ n⌉ adds of halves).

    XLA's CPU reduction over a leading or middle axis of a wide array is slow: summing
    (2, 32, 50257) over axis 0 took 175 ms on the 2-core CPU (jax 0.10.2), the halves'
    sum 1 ms; (128, 32, 1024) 146 ms against 1.8 ms. Other backends reduce directly.
    The order of the additions differs from ``jnp.sum``'s only by float rounding.
    """
    if (backend or jax.default_backend()) != "cpu":
        return a.sum(axis)
    while a.shape[axis] > 1:
        n = a.shape[axis]
        half = n // 2
        take = lambda start, stop: jax.lax.slice_in_dim(a, start, stop, axis=axis)
        head = take(0, half) + take(half, 2 * half)
        a = head if n % 2 == 0 else jnp.concatenate([head, take(2 * half, n)], axis=axis)
    return jnp.squeeze(a, axis)


def sketch_rows(
    a: jax.Array, sketch: Sketch, *, scalars: bool, shrink: float, method: str | None = None
) -> jax.Array:
    """X̂ = (1 − λ) · γ · S a with γ = ‖a‖_F / (‖S a‖_F + ε) when ``scalars``, else γ = 1.

    With the ``gather`` method ‖a‖_F comes from the same pass as S a (``_binned``);
    otherwise from a second read of a."""
    method = method or sketch_method(sketch, a.shape[0])
    if scalars and method == "gather" and sketch.members is not None:
        sa, square = _binned(sketch, a)
    elif scalars:
        sa = apply_sketch(sketch, a, method)
        square = jnp.sum(jnp.square(a.astype(jnp.float32)))
    else:
        sa = apply_sketch(sketch, a, method)
        return sa * shrink if shrink != 1.0 else sa
    sa = sa * (jnp.sqrt(square) / (jnp.linalg.norm(sa) + EPS))
    return sa * shrink if shrink != 1.0 else sa

class RowSample(NamedTuple):
    """R rows of X chosen for dW: row ``index[j]`` enters with weight ``weight[j]``."""

    index: jax.Array  # type: ignore[assignment]  # (R,) int32; shadows tuple.index, which no caller uses
    weight: jax.Array  # (R,) float32

def _row_norms(x: jax.Array) -> jax.Array:
    return jnp.linalg.norm(x.astype(jnp.float32), axis=1)

def _draw(key: jax.Array, mass: jax.Array, count: int) -> jax.Array:
    """``count`` iid row indices with P(b) = mass_b / Σ mass (inverse CDF); uniform,
    with zero weight to follow, when all mass is zero."""
    cdf = jnp.cumsum(mass)
    total = cdf[-1]
    u = jax.random.uniform(key, (count,), jnp.float32)
    index = jnp.searchsorted(cdf, u * total, side="right")
    uniform = (u * mass.shape[0]).astype(jnp.int32)
    index = jnp.where(total > 0, index, uniform)
    return jnp.minimum(index, mass.shape[0] - 1).astype(jnp.int32)

def _crs(key: jax.Array, norms: jax.Array, rank: int) -> RowSample:
    """Column-row sampling (Drineas, Kannan & Mahoney 2006; Adelman et al., NeurIPS 2021).

    R iid draws ``i_j ~ p``, ``p_b = ‖x_b‖ / Σ‖x‖``, weights ``w_j = 1 / (R p_{i_j})``:

        E[Σ_j w_j x_{i_j}ᵀ dy_{i_j}] = R · Σ_b p_b · x_bᵀ dy_b / (R p_b) = Xᵀ dY.

    Rows with x_b = 0 are never drawn (p_b = 0) and contribute nothing to dW.
    """
    total = jnp.sum(norms)
    index = _draw(key, norms, rank)
    picked = norms[index]
    weight = jnp.where(picked > 0, total / (rank * jnp.where(picked > 0, picked, 1.0)), 0.0)
    return RowSample(index, weight)

def _wta_crs(key: jax.Array, norms: jax.Array, rank: int) -> RowSample:
    """Winner-take-all column-row sampling (Liu et al., NeurIPS 2023), with p_b ∝ ‖x_b‖.

    The |C| = c most probable rows are kept exactly; the other R − c slots are iid
    draws from the rest with the probabilities renormalised there,
    ``q_i = p_i / (1 − P_C)``, ``P_C = Σ_{b∈C} p_b``::

        d̂W = Σ_{b∈C} x_bᵀ dy_b + 1/(R − c) · Σ_{j=1}^{R−c} x_{i_j}ᵀ dy_{i_j} / q_{i_j}.

    Unbiased: C depends on X only, not on the key, and for one draw
    ``E[x_iᵀ dy_i / q_i] = Σ_{i∉C} q_i · x_iᵀ dy_i / q_i = Σ_{i∉C} x_iᵀ dy_i``, so the
    mean of the R − c draws is the sum over the complement and E[d̂W] = Xᵀ dY.
    Kept rows have weight 1, drawn rows ``1/((R − c) q_i) = (1 − P_C)/((R − c) p_i)``.

    Choice of c (the reference code's ``k_adaptive``, from the paper's variance bound
    (Theorem 2), whose sampled part scales as (1 − P_C)/(R − c) against 1/R for
    CRS): with P_c the mass of the c most probable rows,

        c = argmin_{c ∈ {0, …, R}} (1 − P_c) / (R − c),

    where c = 0 is plain CRS (score 1/R) and c = R scores 0 when the top R rows hold
    all the mass (then every nonzero row is kept: exact) and +∞ otherwise; ties go
    to the smaller c. The masses are computed as sums of the rows left out (never
    1 − a rounded sum), so at R = B c = B and the estimate is exact.
    """
    rows = norms.shape[0]
    top, top_index = jax.lax.top_k(norms, rank)
    in_top = jnp.zeros(rows, bool).at[top_index].set(True)
    mass_out = jnp.sum(jnp.where(in_top, 0.0, norms))  # exactly 0 when the top R are all rows
    suffix = jnp.concatenate([jnp.cumsum(top[::-1])[::-1], jnp.zeros(1, norms.dtype)])
    rest = suffix + mass_out  # rest[c]: mass outside the c most probable rows
    slots = jnp.arange(rank + 1)
    score = jnp.where(
        slots < rank, rest / jnp.maximum(rank - slots, 1), jnp.where(rest > 0, jnp.inf, 0.0)
    )
    c = jnp.argmin(score)
    kept = jnp.zeros(rows, bool).at[top_index].set(jnp.arange(rank) < c)
    drawn = _draw(key, jnp.where(kept, 0.0, norms), rank)
    picked = norms[drawn]
    rest_c = rest[c]
    draw_weight = rest_c / (jnp.maximum(rank - c, 1) * jnp.where(picked > 0, picked, 1.0))
    draw_weight = jnp.where(picked > 0, draw_weight, 0.0)
    deterministic = jnp.arange(rank) < c
    index = jnp.where(deterministic, top_index, drawn).astype(jnp.int32)
    weight = jnp.where(deterministic, 1.0, draw_weight)
    return RowSample(index, weight)

def sample_rows(key: jax.Array, x: jax.Array, estimator: str, rank: int) -> RowSample:
    """The R rows (and weights) of a (B, N) ``x`` that a row-sampling estimator
    (``crs`` or ``wta-crs`` sketch) keeps."""
    norms = _row_norms(x)
    return _crs(key, norms, rank) if lookup(estimator).sketch == "crs" else _wta_crs(key, norms, rank)

def weighted_rows(x: jax.Array, sample: RowSample, shrink: float) -> jax.Array:
    """x̃ = (1 − λ)² · diag(w) · X[index] (R × N, float32): the sampled estimator's X̂."""
    return x[sample.index].astype(jnp.float32) * (sample.weight * shrink**2)[:, None]


def projection(key: jax.Array, features: int, width: int) -> jax.Array:
    """P ∈ R^{N×k} with entries N(0, 1/k), so E[P Pᵀ] = I_N.

    Random projection of the feature axis (the RAD / CompAct family: Oktay et al.,
    "Randomized automatic differentiation", ICLR 2021; CompAct, 2024):
    ``d̂W = P (X P)ᵀ dY`` has E[d̂W] = E[P Pᵀ] Xᵀ dY = Xᵀ dY.
    """
    return jax.random.normal(key, (features, width), jnp.float32) / math.sqrt(width)

def sketch_kind(spec: Estimator) -> str:
    """The kind of S ∈ R^{R×B} the entry ``spec`` draws (``Sketch.kind``)."""
    if spec.draws is None:
        raise ValueError(f"estimator {spec.name!r} draws no sketch S (its sketch is {spec.sketch!r})")
    return spec.draws


def draws_together(estimator: str) -> bool:
    """Whether layers of this estimator can draw their sketches together from one key
    (``draw_sketch``'s ``layers``): the hash sketches."""
    return lookup(estimator).draws_together


def check_drawn(estimator: str, layers: int) -> None:
    """Refuse layers drawn together (``layers`` > 1) by an estimator that draws no hash
    sketch; ``draw_sketch`` checks that ``layer`` is one of them."""
    if layers != 1 and not draws_together(estimator):
        raise ValueError(f"layers drawn together need a hash sketch (estimator {estimator!r} draws its own)")


def gathers(estimator: str) -> bool:
    """Whether this estimator's dW is the product of two R-row factors that a
    ``gather_axis`` all-gathers (hash and Gaussian sketches, sampled rows); ``exact``
    and the others (projections, compressions) keep their dW local, for the caller to sum."""
    return lookup(estimator).gathers


def gathered_product(a: jax.Array, b: jax.Array, axis: str | None) -> jax.Array:
    """aᵀ b, or with ``axis`` Σ_d a_dᵀ b_d over the devices d of that mesh axis: both
    R-row factors all-gathered (D·R rows each), then one product, equal on every device."""
    if axis is not None:
        a = jax.lax.all_gather(a, axis, tiled=True)
        b = jax.lax.all_gather(b, axis, tiled=True)
    return a.T @ b


def sketched_matmul(
    x: jax.Array,
    w: jax.Array,
    key: jax.Array | None,
    *,
    rank: int,
    lam: float = 0.0,
    estimator: str = "basis",
    gather_axis: str | None = None,
    layer: int = 0,
    layers: int = 1,
) -> jax.Array:
    """``y = x @ w`` whose backward pass returns exact dX and a sketched dW.

    Args:
      x: (..., N); every leading dim is a sketched row, B = prod(x.shape[:-1]).
      w: (N, M).
      key: PRNG key, fresh each step; it only draws S (its gradient is zero). None for
        an estimator whose entry needs no key.
      rank: R ≥ 1, clipped to B.
      lam: shrink λ ∈ [0, 1); dW is scaled by (1 − λ)².
      estimator: one of ``ESTIMATORS``; ``exact`` is an ordinary matmul.
      gather_axis: inside ``shard_map``, the mesh axis whose devices' sketches are
        all-gathered so that dW is already their sum (``gathers(estimator)`` only);
        None: this device's dW alone.
      layer, layers: a hash sketch drawn with those of ``layers`` layers from one key
        (``draw_sketch``; ``key`` is then the same for all of them): this layer's index.
    """
    validate_method(estimator, rank, lam)
    check_drawn(estimator, layers)
    if lookup(estimator).needs_key and key is None:
        raise ValueError(f"estimator {estimator!r} needs a sketch key (got None)")
    if x.ndim < 1 or w.ndim != 2 or x.shape[-1] != w.shape[0]:
        raise ValueError(
            f"shape mismatch: x {tuple(x.shape)} @ w {tuple(w.shape)}; "
            "x must be (..., N) and w (N, M)"
        )
    if lookup(estimator).exact:
        return x @ w
    lead = x.shape[:-1]
    rows = math.prod(lead)
    axis = gather_axis if gathers(estimator) else None
    drawn = (layer, layers)
    y = _sketched_2d(x.reshape(rows, x.shape[-1]), w, key, min(rank, rows), float(lam), estimator, axis, drawn)
    return y.reshape(*lead, w.shape[1])

@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5, 6, 7))
def _sketched_2d(x, w, key, rank, lam, estimator, axis, drawn):
    return x @ w

def _kept(*arrays):
    return tuple(checkpoint_name(a, DENSE_INPUT) for a in arrays)

def _fwd(x, w, key, rank, lam, estimator, axis, drawn):
    spec = lookup(estimator)
    shrink = 1.0 - lam
    x_dtype = jnp.zeros((0,), x.dtype)  # zero-size: carries x's dtype for dX
    kept, key = _keep(spec, x, key, rank, shrink, drawn)
    # the key (a PRNG key: memory accounting knows it by its dtype) replays S or P
    return x @ w, (kept, key, w, *_kept(x_dtype))

def _keep(spec: Estimator, x, key, rank, shrink, drawn):
    """(what the forward pass keeps of x for dW, the key the backward pass needs or None)."""
    rows, features = x.shape
    if spec.samples_rows:
        sample = sample_rows(key, x, spec.name, rank)
        return _kept(weighted_rows(x, sample, shrink), sample.index), None
    if spec.compression is not None:
        return _kept(*spec.compression.encode(x.astype(jnp.float32), rank)), None
    if spec.sketch == "projection":
        width = projection_width(rows, features, rank)
        if width >= features:  # X P would be no smaller than X: keep X, exact
            return _kept(x.astype(jnp.float32) * shrink**2), None
        return _kept(x.astype(jnp.float32) @ projection(key, features, width) * shrink**2), key
    sketch = draw_sketch(key, sketch_kind(spec), rows, rank, *drawn)
    return _kept(sketch_rows(x, sketch, scalars=spec.scalars, shrink=shrink)), key

def _bwd(rank, lam, estimator, axis, drawn, residuals, dy):
    spec = lookup(estimator)
    kept, key, w, x_dtype = residuals
    rows, features = dy.shape[0], w.shape[0]
    if spec.samples_rows:
        x_tilde, index = kept
        dw = gathered_product(x_tilde, dy[index].astype(jnp.float32), axis)
    elif spec.compression is not None:
        x_hat = spec.compression.decode(kept, rows, features)
        dw = x_hat.T @ dy.astype(jnp.float32) * (1.0 - lam) ** 2
    elif spec.sketch == "projection" and key is None:  # X itself, times c²
        dw = kept[0].T @ dy.astype(jnp.float32)
    elif spec.sketch == "projection":
        p = projection(key, features, projection_width(rows, features, rank))
        dw = p @ (kept[0].T @ dy.astype(jnp.float32))
    else:
        sketch = draw_sketch(key, sketch_kind(spec), rows, rank, *drawn)
        dy_hat = sketch_rows(dy, sketch, scalars=spec.scalars, shrink=1.0 - lam)
        dw = gathered_product(kept[0], dy_hat, axis)
    dx = (dy @ w.T).astype(x_dtype.dtype)
    return dx, dw.astype(w.dtype), None

_sketched_2d.defvjp(_fwd, _bwd)
