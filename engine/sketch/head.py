"""LM head fused with the cross-entropy loss, computed in chunks of rows.

For rows X ∈ R^{B×N}, head W ∈ R^{N×V} and targets t, the loss is

    L = (1/B) Σ_b [lse(z_b) − z_b[t_b]],   Z = X W,   lse(z) = log Σ_v exp z_v,

and its logit gradient is dZ = (softmax(Z) − onehot(t)) / B, so

    dX = dZ Wᵀ,   dW = Xᵀ dZ                                  (exact)
    dW ≈ X̂ᵀ dẐ,  X̂ = c·γ_X·S X,  dẐ = c·γ_dZ·S dZ,  c = 1 − λ   (sketched)

with S, γ and the estimators of ``engine.sketch.basis`` (S drawn by ``draw_sketch`` from the
head's key, X̂ by ``sketch_rows``). The peer estimators take the same key and draw
the same numbers as ``sketched_matmul``: row sampling (``crs``, ``wta-crs``) keeps
x̃ = c²·diag(w)·X[i] and the R sampled rows of dZ, recomputed from their logits
(R·N·V flops); ``proj`` keeps (X P)ᵀ dZ (k×V), accumulated chunk by chunk, and
dW = c²·P (X P)ᵀ dZ. The loss is the last operation, so its
cotangent is a scalar g and every gradient is g times the above: they are formed
during the forward pass, C rows at a time (logits → lse → loss and dZ → dX rows
and the chunk's share of Xᵀ dZ or of S dZ = Σ_chunks S[:, chunk] dZ[chunk]).
The B×V logits never exist at once. The invariant scalar γ_dZ needs ‖dZ‖²_F: it comes
from the softmax statistics (``_logit_grad_sq``: one more row sum, of e², over the array
the partition sums are reduced from; on a GPU one pass with them), not from dZ. Kept for the backward pass: dX (B×N) and dW (N×V) when exact; dX,
X̂ (R×N) and dẐ (R×V) when sketched or sampled, the scalar c·γ_dZ carried by X̂ (so the
R×V factor is S dZ as summed); dX,
(X P)ᵀ dZ (k×V) and the key for ``proj`` (dX and c²·dW when k ≥ N); dX and
c²·X̂ᵀ dZ for a ``compress`` entry (X̂ its compression of X, accumulated chunk by chunk).
Which of these the backward pass reads is ``_mode``, a function of the estimator's entry
and the shapes, the same in both passes. X̂ is tagged
``DENSE_INPUT`` like a sketched layer's, the rest ``LOSS_LOGITS``. The weight gradient costs R·N·V instead of B·N·V. With
``gather_axis`` (several devices, inside ``shard_map``) the two R-row factors are
all-gathered and dW is Σ_d X̂_dᵀ dẐ_d on every device (``engine.sketch.basis.gathers``).
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from engine.core import checks
from engine.core.estimators import lookup
from engine.core.presets import validate_method
from engine.sketch.basis import (
    DENSE_MAX_RANK,
    EPS,
    SKETCH_METHODS,
    Sketch,
    apply_sketch,
    axis_sum,
    check_drawn,
    draw_sketch,
    gathered_product,
    gathers,
    projection,
    projection_width,
    sample_rows,
    sketch_kind,
    sketch_rows,
    weighted_rows,
)
from engine.sketch.residuals import DENSE_INPUT, LOSS_LOGITS

BINNED = "binned"  # the head visits rows in bin order (balanced sketches)


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
    sketch_method: str | None = None,
    gather_axis: str | None = None,
    layer: int = 0,
    layers: int = 1,
) -> jax.Array:
    """Mean cross-entropy of ``softmax(x @ w)`` against ``targets``, float32.

    Args:
      x: (..., N) rows in the order ``sketched_matmul`` flattens them.
      w: (N, V).
      targets: integer array of shape x.shape[:-1].
      key: the head's sketch key (unused, may be None, when ``estimator="exact"``).
      chunk: rows per chunk C ≥ 1; B need not be a multiple of C.
      estimator, rank, lam, gather_axis: as ``engine.sketch.basis.sketched_matmul``; R
        is clipped to B.
      sketch_method: how a hash sketch meets dZ: ``binned`` (balanced hashing only: rows are visited in bin order, so S dZ is a reshape-sum of each
        chunk's signed dZ; chunks hold whole layers of bins or whole bins, so C is
        rounded to a multiple of R or of ⌈B/R⌉) or one of ``SKETCH_METHODS`` (rows in
        their own order, ``apply_sketch`` on each chunk); None: ``head_method``.
      layer, layers: as ``sketched_matmul``'s (a hash sketch drawn with other layers').
    """
    validate_method(estimator, rank, lam)
    check_drawn(estimator, layers)
    if lookup(estimator).needs_key and key is None:
        raise ValueError(f"estimator {estimator!r} needs a sketch key (got None)")
    checks.whole("chunk", chunk, 1)
    if sketch_method not in (None, BINNED, *SKETCH_METHODS):
        raise ValueError(
            f"unknown sketch method {sketch_method!r}; choose one of {BINNED}, {', '.join(SKETCH_METHODS)}"
        )
    if sketch_method == BINNED and lookup(estimator).draws != "balanced":
        raise ValueError(f"the {BINNED} head needs a balanced sketch (estimator {estimator!r} is not)")
    if w.ndim != 2 or x.shape[-1] != w.shape[0] or targets.shape != x.shape[:-1]:
        raise ValueError(
            f"shape mismatch: x {tuple(x.shape)} @ w {tuple(w.shape)} with targets "
            f"{tuple(targets.shape)}; need x (..., N), w (N, V), targets x.shape[:-1]"
        )
    rows = math.prod(targets.shape)
    return _head(
        x.reshape(rows, x.shape[-1]), w, targets.reshape(rows), key,
        min(chunk, rows), min(rank, rows), float(lam), estimator, sketch_method,
        gather_axis if gathers(estimator) else None, (layer, layers),
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


# How the sketched head gets ‖dZ‖²_F for γ_dZ: ``statistics`` zeroes the target's entry
# in the exp pass and sums e and e² over the others (``_logit_grad_sq``), one more row
# sum over the array the partition sums come from, which a GPU fuses into one pass;
# ``direct`` sums dZ² (another pass over dZ). On the 2-core CPU the zeroing costs more
# than the pass it saves: value and gradient of the exact head at 64 rows, d 64,
# V 50257, one thread, min of 60: 16.4 ms plain, 20.0 ms with the target zeroed in the
# exp pass, 17.2–17.4 ms zeroed afterwards by a scatter. The exact head always runs
# the plain form.
NORM_FROM = {"cpu": "direct"}  # a backend not named: statistics


def norm_from(backend: str | None = None) -> str:
    """``statistics`` or ``direct``: how the sketched head gets ‖dZ‖² on ``backend``."""
    return NORM_FROM.get(backend or jax.default_backend(), "statistics")


class _Softmax(NamedTuple):
    """One chunk's softmax statistics, float32 (rows b, m_b = max_v z_bv, t_b the target).

    ``e``: e_bv = exp(z_bv − m_b) (C×V; one exp per logit); ``total``: the partition sum
    s_b = Σ_v e_bv; ``nll``: lse_b − z_bt = log s_b + m_b − z_bt. With ``rest`` (the
    ``statistics`` form) e_bt is 0 in ``e``, ``rest`` is S1_b = Σ_{v≠t_b} e_bv and
    s_b = S1_b + exp(z_bt − m_b): then 1 − p_bt = S1_b / s_b has no cancellation when
    p_bt ≈ 1, where ``e / s − 1`` rounds to 0.
    """

    e: jax.Array
    total: jax.Array  # (C, 1)
    nll: jax.Array  # (C,)
    rest: jax.Array | None = None  # (C, 1)


def _softmax(xc, w, tc, statistics: bool = False) -> _Softmax:
    """The softmax statistics of one chunk's logits Z = X W (``_Softmax``)."""
    z = jnp.matmul(xc, w, preferred_element_type=jnp.float32)
    m = jnp.max(z, axis=-1, keepdims=True)
    z_target = jnp.take_along_axis(z, tc[:, None], axis=-1)
    if not statistics:
        e = jnp.exp(z - m)
        total = jnp.sum(e, axis=-1, keepdims=True)
        return _Softmax(e, total, (jnp.log(total) + m - z_target)[:, 0])
    e = jnp.where(_is_target(tc, z.shape[-1]), 0.0, jnp.exp(z - m))
    rest = jnp.sum(e, axis=-1, keepdims=True)
    total = rest + jnp.exp(z_target - m)
    return _Softmax(e, total, (jnp.log(total) + m - z_target)[:, 0], rest)


def _is_target(tc, v: int) -> jax.Array:
    return tc[:, None] == jnp.arange(v, dtype=tc.dtype)


def _logit_grad(sm: _Softmax, tc, valid, rows: int) -> jax.Array:
    """dZ = (softmax(Z) − onehot(t)) / B of one chunk (0 on padding rows); in the
    ``statistics`` form e_bv / (s_b B) off the target and −S1_b / (s_b B) = (p_bt − 1) / B at it."""
    is_target = _is_target(tc, sm.e.shape[-1])
    if sm.rest is None:
        return jnp.where(valid[:, None], sm.e / sm.total - is_target, 0.0) / rows
    scale = jnp.where(valid[:, None], 1.0 / (sm.total * rows), 0.0)
    return jnp.where(is_target, -sm.rest, sm.e) * scale


def _logit_grad_sq(sm: _Softmax, dz, valid, rows: int) -> jax.Array:
    """‖dZ‖²_F of one chunk: Σ dZ² (``direct``), or in the ``statistics`` form without
    reading dZ,

        B² ‖dZ_b‖² = Σ_v (p_bv − [v = t_b])² = Σ_{v≠t_b} p_bv² + (1 − p_bt)²
                   = (Σ_{v≠t_b} e_bv² + S1_b²) / s_b²,

    a sum of positive terms (no cancellation at p_bt ≈ 1); Σ_{v≠t} e² is reduced from
    the same array as S1."""
    if sm.rest is None:
        return jnp.sum(dz * dz)
    squares = jnp.sum(sm.e * sm.e, axis=-1, keepdims=True) + sm.rest * sm.rest
    per_row = squares / (sm.total * sm.total)
    return jnp.sum(jnp.where(valid[:, None], per_row, 0.0)) / (rows * rows)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7, 8, 9, 10))
def _head(x, w, targets, key, chunk, rank, lam, estimator, sketch_method, axis, drawn):
    def body(total, xs):
        xc, tc, valid = xs
        return total + jnp.sum(jnp.where(valid, _softmax(xc, w, tc).nll, 0.0)), None

    total, _ = jax.lax.scan(body, jnp.zeros((), jnp.float32), _chunk_inputs(x, targets, chunk))
    return total / x.shape[0]


def _sketch_chunks(sketch: Sketch, chunk: int) -> tuple:
    """The columns of S, chunk by chunk: (bins, signs, dense) each with a leading chunk axis."""
    if sketch.kind == "gaussian":
        dense = _chunked(sketch.matrix().T, chunk)  # (K, C, R)
        return None, None, jnp.swapaxes(dense, 1, 2)
    bins, signs = sketch.hashed()
    return _chunked(bins, chunk), _chunked(signs, chunk), None


def head_method(sketch: Sketch, backend: str | None = None) -> str | None:
    """How the head applies ``sketch`` by default on ``backend`` (default: JAX's):
    ``binned`` for a balanced sketch, except on a CPU at R ≤ ``DENSE_MAX_RANK``, where
    the signed one-hot product (``dense``) of each chunk is the faster; None (each
    chunk's ``sketch_method``) for other sketches.

    Measured on the 2-core CPU, value and gradient of the head at 64 rows, d 64,
    V 50257 (÷ exact, two interleaved runs): binned R=1 0.79/0.82, R=8 0.90/0.88,
    R=32 0.80/0.90; dense R=1 0.72/0.76, R=8 0.84/0.87, R=32 1.06/0.99 (its product
    costs R·C·V flops per chunk, the binned sum C·V adds).
    """
    if sketch.members is None:
        return None
    if (backend or jax.default_backend()) == "cpu" and sketch.rank <= DENSE_MAX_RANK:
        return "dense"
    return BINNED


def _mode(estimator: str, rows: int, features: int, rank: int) -> str:
    """How the head forms dW, from the estimator's entry and the shapes (static, so the
    forward and the backward pass agree): ``exact`` (Xᵀ dZ, also a projection when k ≥ N),
    ``compress`` (X̂ᵀ dZ of the entry's compression, kept as dW itself like ``exact``),
    ``sample``, ``proj`` or ``sketch`` (S applied to X and dZ)."""
    spec = lookup(estimator)
    if spec.exact:
        return "exact"
    if spec.samples_rows:
        return "sample"
    if spec.compression is not None:
        return "compress"
    if spec.sketch == "projection":
        return "proj" if projection_width(rows, features, rank) < features else "exact"
    return "sketch"


def _binned_slots(members: jax.Array, rows: int, rank: int, chunk: int) -> tuple[jax.Array, int, bool]:
    """(slots, chunk, layer_major): the order in which the binned head visits rows.

    A balanced sketch's ``members`` hold ⌈B/R⌉ = K layers of R slots (slot k·R + r: the
    k-th row of bin r; B: none). With R ≤ C a chunk is q = ⌊C/R⌋ whole layers (C
    becomes q·R) and adds ``(s·dZ).reshape(q, R, V).sum(0)`` to S dZ; with R > C it is
    q = ⌊C/K⌋ (at least 1) whole bins, slots in bin-major order (C becomes q·K), and
    ``(s·dZ).reshape(q, K, V).sum(1)`` are q rows of S dZ. Padding slots (B) fill the
    last chunk.
    """
    layers = members.shape[0] // rank
    if rank <= chunk:
        q = max(1, chunk // rank)
        pad = (-layers % q) * rank
        return jnp.pad(members, (0, pad), constant_values=rows), q * rank, True
    q = max(1, chunk // layers)
    by_bin = members.reshape(layers, rank).T
    by_bin = jnp.pad(by_bin, ((0, -rank % q), (0, 0)), constant_values=rows)
    return by_bin.reshape(-1), q * layers, False


def _binned_fwd(x, w, targets, sketch, chunk, statistics):
    """Loss sum, dX, S dZ and ‖dZ‖² of the head, visiting rows in bin order (``statistics``:
    ‖dZ‖² from the softmax statistics)."""
    rows, v, rank = x.shape[0], w.shape[1], sketch.rank
    slots, chunk, layer_major = _binned_slots(sketch.members, rows, rank, chunk)
    layers = sketch.members.shape[0] // rank
    valid = slots < rows
    index = jnp.where(valid, slots, 0)
    signs = jnp.where(valid, sketch.signs[index], 0.0)
    split = lambda a: a.reshape(-1, chunk, *a.shape[1:])
    xs = (split(x[index]), split(targets[index]), split(valid), split(signs))

    def body(carry, xs):
        total, acc, sq = carry
        xc, tc, vc, sc = xs
        sm = _softmax(xc, w, tc, statistics)
        dz = _logit_grad(sm, tc, vc, rows)
        signed = dz * sc[:, None]
        if layer_major:
            acc, rows_out = acc + axis_sum(signed.reshape(-1, rank, v), 0), None
        else:
            rows_out = axis_sum(signed.reshape(-1, layers, v), 1)
        total = total + jnp.sum(jnp.where(vc, sm.nll, 0.0))
        sq = sq + _logit_grad_sq(sm, dz, vc, rows)
        dx = jnp.matmul(dz.astype(w.dtype), w.T, preferred_element_type=jnp.float32).astype(x.dtype)
        return (total, acc, sq), (dx, rows_out)

    zero = jnp.zeros((), jnp.float32)
    acc = jnp.zeros((rank if layer_major else 0, v), jnp.float32)
    (total, acc, sq), (dx, rows_out) = jax.lax.scan(body, (zero, acc, zero), xs)
    if not layer_major:
        acc = rows_out.reshape(-1, v)[:rank]
    position = jnp.zeros(rows, jnp.int32).at[jnp.where(valid, slots, rows)].set(
        jnp.arange(slots.shape[0], dtype=jnp.int32), mode="drop", unique_indices=True
    )
    return total, dx.reshape(-1, x.shape[1])[position], acc, sq


class _Setup(NamedTuple):
    """What the head's chunk loop accumulates into (``acc``) and reads beside each chunk."""

    acc: jax.Array
    parts: Any = None  # per chunk: S's columns (``sketch``) or X̂'s rows (``compress``)
    p: jax.Array | None = None  # P (``proj``)
    sketch: Sketch | None = None
    method: str | None = None  # how a ``sketch`` meets dZ


def _setup(mode, x, w, key, chunk, rank, estimator, sketch_method, drawn) -> _Setup:
    rows, features, v = x.shape[0], x.shape[1], w.shape[1]
    if mode in ("exact", "sample"):  # dWᵀ (V×N): dZᵀ X runs faster on CPU than Xᵀ dZ
        return _Setup(jnp.zeros((v, features) if mode == "exact" else (0, v), jnp.float32))
    if mode == "compress":  # dWᵀ again, and X̂'s rows chunk by chunk beside X's
        compression = lookup(estimator).compression
        if compression is None:
            raise ValueError(f"estimator {estimator!r} has no compression")
        x_hat = compression.decode(compression.encode(x.astype(jnp.float32), rank), rows, features)
        return _Setup(jnp.zeros((v, features), jnp.float32), _chunked(x_hat, chunk))
    if mode == "proj":
        p = projection(key, features, projection_width(rows, features, rank))
        return _Setup(jnp.zeros((p.shape[1], v), jnp.float32), p=p)
    sketch = draw_sketch(key, sketch_kind(lookup(estimator)), rows, rank, *drawn)
    parts = _sketch_chunks(sketch, chunk)
    return _Setup(jnp.zeros((rank, v), jnp.float32), parts, None, sketch, sketch_method or head_method(sketch))


def _fwd(x, w, targets, key, chunk, rank, lam, estimator, sketch_method, axis, drawn):
    rows = x.shape[0]
    mode = _mode(estimator, rows, x.shape[1], rank)
    shrink = 1.0 - lam
    acc, parts, p, sketch, method = _setup(mode, x, w, key, chunk, rank, estimator, sketch_method, drawn)
    statistics = mode == "sketch" and lookup(estimator).scalars and norm_from() == "statistics"
    if mode == "sketch" and method == BINNED:
        total, dx, acc, sq = _binned_fwd(x, w, targets, sketch, chunk, statistics)
        return _sketch_residuals(x, w, key, total, dx, acc, sq, sketch, rank, lam, estimator)

    kind = "" if sketch is None else sketch.kind

    def body(carry, xs):
        total, acc, sq = carry
        (xc, tc, valid), part = xs
        sm = _softmax(xc, w, tc, statistics)
        dz = _logit_grad(sm, tc, valid, rows)
        dzc = dz.astype(w.dtype)
        if mode == "exact":
            acc = acc + jnp.matmul(dzc.T, xc, preferred_element_type=jnp.float32)
        elif mode == "compress":
            acc = acc + jnp.matmul(dz.T, part, precision="highest")
        elif mode == "proj":
            acc = acc + (xc.astype(jnp.float32) @ p).T @ dz
        elif mode == "sketch":
            acc = acc + apply_sketch(Sketch(kind, rank, *part), dz, method)
            sq = sq + _logit_grad_sq(sm, dz, valid, rows)
        total = total + jnp.sum(jnp.where(valid, sm.nll, 0.0))
        return (total, acc, sq), jnp.matmul(dzc, w.T, preferred_element_type=jnp.float32).astype(x.dtype)

    zero = jnp.zeros((), jnp.float32)
    (total, acc, sq), dx = jax.lax.scan(
        body, (zero, acc, zero), (_chunk_inputs(x, targets, chunk), parts)
    )
    dx = dx.reshape(-1, x.shape[1])[:rows]
    loss = total / rows
    w_dtype = jnp.zeros((0,), w.dtype)  # zero-size: carries w's dtype for dW
    loss_part = lambda *a: tuple(checkpoint_name(b, LOSS_LOGITS) for b in a)
    x_part = lambda a: checkpoint_name(a, DENSE_INPUT)  # the head's X̂ or x̃, as a dense layer's
    if mode in ("exact", "compress"):
        factor = 1.0 if lookup(estimator).exact else shrink**2  # proj at k ≥ N: c²·dW
        kept = (*loss_part(dx, (acc.T * factor).astype(w.dtype)), w_dtype)
    elif mode == "proj":  # the key (a PRNG key, known by its dtype) regenerates P
        kept = (*loss_part(dx, acc * shrink**2), key, w_dtype)
    elif mode == "sample":
        sample = sample_rows(key, x, estimator, rank)
        picked = targets[sample.index]
        dz_rows = _logit_grad(_softmax(x[sample.index], w, picked), picked, jnp.ones(picked.shape, bool), rows)
        x_tilde = x_part(weighted_rows(x, sample, shrink))
        kept = (loss_part(dx)[0], x_tilde, loss_part(dz_rows)[0], w_dtype)
    else:
        return _sketch_residuals(x, w, key, total, dx, acc, sq, sketch, rank, lam, estimator)
    return loss, (*kept[:-1], loss_part(w_dtype)[0])


def _sketch_residuals(x, w, key, total, dx, acc, sq, sketch, rank, lam, estimator):
    """(loss, residuals) of a hash or gaussian sketch: dX, X̂ (tagged ``DENSE_INPUT``) and
    S dZ. dW = X̂ᵀ dẐ with dẐ = c·γ_dZ·S dZ, γ_dZ = ‖dZ‖_F / (‖S dZ‖_F + ε) with scalars
    (``sq`` = ‖dZ‖²_F); the scalar c·γ_dZ is carried by the R×N factor, X̂·c·γ_dZ, not
    by the R×V one, which is kept as S dZ (one pass over it fewer)."""
    shrink = 1.0 - lam
    scalars = lookup(estimator).scalars
    scale = shrink * (jnp.sqrt(sq) / (jnp.linalg.norm(acc) + EPS)) if scalars else shrink
    x_hat = sketch_rows(x, sketch, scalars=scalars, shrink=shrink) * scale
    tag = lambda a: checkpoint_name(a, LOSS_LOGITS)
    return total / x.shape[0], (tag(dx), checkpoint_name(x_hat, DENSE_INPUT), tag(acc), tag(jnp.zeros((0,), w.dtype)))


def _bwd(chunk, rank, lam, estimator, sketch_method, axis, drawn, residuals, g):
    dx, w_dtype = residuals[0], residuals[-1]
    mode = _mode(estimator, dx.shape[0], dx.shape[1], rank)
    if mode in ("exact", "compress"):  # dW itself
        dw = g * residuals[1]
    elif mode == "proj":
        proj_dz, key = residuals[1], residuals[2]
        features = dx.shape[1]
        dw = g * (projection(key, features, proj_dz.shape[0]) @ proj_dz)
    else:  # X̂ᵀ dẐ of a sketch, or x̃ᵀ dZ[i] of sampled rows (each device's own g when gathered),
        # g on the R×N factor
        dw = gathered_product(g * residuals[1], residuals[2], axis)
    return (g * dx).astype(dx.dtype), dw.astype(w_dtype.dtype), None, None


_head.defvjp(_fwd, _bwd)
