"""Bias, variance and MSE of the dW estimators on real training states.

dX is exact for every estimator, so the dY that reaches a sketched layer is the
exact-backprop dY for the same parameters and batch. One exact forward/backward
pass therefore gives, for every sketched layer, its input X (B×N) and output
gradient dY (B×M) (``capture``), and with them the exact ``dW = Xᵀ dY``. Each
estimator's d̂W is then drawn from (X, dY) through ``sketched_matmul``'s own VJP
(the loss ⟨dY, X W⟩ has output gradient dY), so it is exactly the estimator
training uses, for K sketch keys, ``jax.vmap``-ed over chunks of keys.

Per-key values (``key_values``), e_k = d̂W_k − dW, ē = (1/K) Σ_k e_k: each key's
‖e_k‖², ‖e_k − ē‖² and cosine ⟨d̂W_k, dW⟩ / (‖d̂W_k‖ ‖dW‖). From them (``dw_moments``,
``engine.analysis.keystats``)::

    variance  V = 1/(K−1) · Σ_k ‖e_k − ē‖²                (unbiased for tr Σ = E‖d̂W − E d̂W‖²)
    MSE       M = (1/K) Σ_k ‖e_k‖²
    bias²     b² = M − V = ‖ē‖² − V/K                       (E‖ē‖² = ‖E d̂W − dW‖² + tr Σ/K)

and the standard error of b² is the SD over keys of w_k = ‖e_k‖² − K/(K−1) ‖e_k − ē‖²
divided by √K (its delta method; ``keystats``). A diagnosis keeps every key's values
(``KEY_VALUES``) so that intervals come from them.

Paired keys: the K keys of a (batch, layer) do not depend on the estimator, R or λ, so
estimators that differ in one component share their draws: scalars on and off use the
same S (basis/balanced, scalars/countsketch), balanced and uniform hashing the same
signs (``engine.sketch.basis.draw_sketch`` splits the key alike for both).

Speed: the row-space reduction (``reduce``). For the estimators that sketch rows
(hash and Gaussian sketches, row sampling), d̂W = Xᵀ A dY with a B×B matrix A whose law
depends on X and dY only through their Gram matrices (γ_X = ‖X‖/‖SX‖ and
‖SX‖² = tr(S XXᵀ Sᵀ); sampling reads the row norms, diag XXᵀ). When N > B, an orthonormal
basis Q (N×B, orthonormal columns) of X's row space gives X = X' Qᵀ with X' = X Q (B×B)
and X'X'ᵀ = XXᵀ, so d̂W(X, dY) = Q d̂W(X', dY) and dW = Q dW': every norm, inner product
and cosine above is that of (X', dY). Likewise dY = dY' Q_yᵀ on the right when M > B
(also for an estimator whose entry is not ``row_space``, such as ``proj`` or ``velora``:
it acts on X's feature axis, which stays whole).
At the paper preset (B·T = 64) the head's 64 × 50,257 dW becomes 64 × 64 for every key.

``diagnose`` reports, per layer, estimator, R and λ, the numbers above relative to
‖dW‖²_F of the exact gradient on the same batch, pooled over batches as Σ numerators
/ Σ ‖dW‖²; the row with layer ``all`` pools the layers the same way (and averages
the cosine over layers and batches). Each row carries its per-key values.
"""

from __future__ import annotations

import functools
import operator
from dataclasses import dataclass
from typing import Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd

from engine.analysis import keystats
from engine.core import checks
from engine.core.estimators import lookup
from engine.core.presets import GPTConfig, validate_method
from engine.model.gpt import GPT
from engine.model.layers import CAPTURED_GRADS, CAPTURED_INPUTS
from engine.sketch.basis import sketched_matmul

COLUMNS = (
    "layer", "estimator", "rank", "lam", "bias2", "bias2_se", "variance", "mse", "cos_mean",
    "keys", "batches",
)
KEY_VALUES = keystats.KEY_VALUES  # the extra column of ``diagnose``'s rows: ``keystats.pack`` arrays


@dataclass(frozen=True)
class Moments:
    """Moments of one estimator's d̂W over K keys on one (X, dY); absolute, not relative."""

    dw_norm2: float  # ‖dW‖²_F
    bias2: float  # ‖ē‖² − V/K
    bias2_se: float  # standard error of bias2 (per-key delta method)
    variance: float  # V
    mse: float  # (1/K) Σ ‖e_k‖²
    cos_mean: float
    keys: int


class KeyValues(NamedTuple):
    """Per key k of one estimator on one (X, dY): ‖e_k‖², ‖e_k − ē‖², cos_k; and ‖dW‖²."""

    dw_norm2: float
    sq: np.ndarray
    dev: np.ndarray
    cos: np.ndarray


def capture(cfg: GPTConfig, params, batch: jax.Array) -> dict[str, tuple[jax.Array, jax.Array]]:
    """``{layer: (X (B×N), dY (B×M))}`` of every kernel in ``cfg.sketched_kernel_paths()``,
    from one exact forward/backward pass (unfused head, no remat: same numbers), compiled."""
    return _capture(cfg, params, batch)


@functools.partial(jax.jit, static_argnums=0)
def _capture(cfg: GPTConfig, params, batch: jax.Array) -> dict[str, tuple[jax.Array, jax.Array]]:
    exact = cfg.replace(estimator="exact", head_chunk=0, remat="none")
    model = GPT(exact)
    idx, targets = batch[:, :-1], batch[:, 1:]
    _, state = model.apply(
        {"params": params}, idx, targets, mutable=[CAPTURED_INPUTS, CAPTURED_GRADS]
    )

    def loss(perturbations):
        return model.apply({"params": params, CAPTURED_GRADS: perturbations}, idx, targets)

    grads = jax.grad(loss)(state[CAPTURED_GRADS])
    out = {}
    for path in cfg.sketched_kernel_paths():
        x, dy = state[CAPTURED_INPUTS], grads
        for part in path:
            x, dy = x[part], dy[part]
        x, dy = x["x"][0], dy["dy"]
        out["/".join(path)] = (x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1]))
    return out


@jax.jit
def _factor(a: jax.Array) -> jax.Array:
    """A' = A Q (B×B) for A (B×F), F > B, with Q (F×B) an orthonormal basis of A's row space:
    A'A'ᵀ = AAᵀ, and equal rows of A stay exactly equal (each row is mapped alone), so a
    sketch that cancels rows of A cancels those of A'. Q = Aᵀ U Λ^{-1/2} from the
    eigendecomposition AAᵀ = U Λ Uᵀ (three products and a B×B eigh: several times faster
    than a QR of the F×B Aᵀ). Directions with λ ≤ 10⁻⁶ λ_max get a zero column: float32
    finds their eigenvectors only to about 10⁻⁷ λ_max, and Λ^{-1/2} would blow that noise
    up; they hold at most B · 10⁻⁶ of ‖A‖² (rank-deficient A, e.g. repeated rows, loses
    nothing: its null directions have λ = 0)."""
    a = a.astype(jnp.float32)
    lam, u = jnp.linalg.eigh(jnp.matmul(a, a.T, precision="highest"))
    keep = lam > lam[-1] * 1e-6
    inverse_root = jnp.where(keep, 1.0 / jnp.sqrt(jnp.where(keep, lam, 1.0)), 0.0)
    return jnp.matmul(a, jnp.matmul(a.T, u * inverse_root, precision="highest"), precision="highest")


def reduce(x: jax.Array, dy: jax.Array) -> dict[bool, tuple[jax.Array, jax.Array]]:
    """``{row_side: (X', dY')}``: (X, dY) with both feature axes reduced to at most B
    (``row_side``, the estimators whose entry is ``row_space``) or only dY's; module docstring."""
    rows = x.shape[0]
    dy_r = _factor(dy) if dy.shape[1] > rows else dy
    x_r = _factor(x) if x.shape[1] > rows else x
    return {True: (x_r, dy_r), False: (x, dy_r)}


def _chunk_values_impl(x, dy, keys, center, *, estimator, rank, lam, own_center):
    """Per key of a chunk: ‖e_k‖², ‖e_k − c‖², cos_k (float32), with c = ``center`` or,
    with ``own_center``, the chunk's mean error; and the chunk's Σ e_k and ‖dW‖²."""
    w = jnp.zeros((x.shape[1], dy.shape[1]), jnp.float32)
    dw = x.T.astype(jnp.float32) @ dy.astype(jnp.float32)

    def one(key):
        linear = lambda w: jnp.sum(dy * sketched_matmul(x, w, key, rank=rank, lam=lam, estimator=estimator))
        return jax.grad(linear)(w)

    dws = jax.vmap(one)(keys)
    err = dws - dw
    c = err.mean(axis=0) if own_center else center
    sq = jnp.sum(err**2, axis=(1, 2))
    dev = jnp.sum((err - c) ** 2, axis=(1, 2))
    norms = jnp.sqrt(jnp.sum(dws**2, axis=(1, 2))) * jnp.linalg.norm(dw)
    cos = jnp.tensordot(dws, dw, axes=2) / jnp.where(norms > 0, norms, 1.0)
    return sq, dev, cos, err.sum(axis=0), jnp.sum(dw**2)


_STATIC = ("estimator", "rank", "lam", "own_center")
# XLA's optimisations cost seconds per setting to compile and gain little on small
# reduced problems (most of a diagnosis's time was compiling): those compile without them
FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}
CHUNK_FLOATS = 1 << 25  # at most this many floats of d̂W per chunk (128 MiB): fewer keys per vmap when larger
SMALL_PROBLEM = 1 << 22  # floats of d̂W per chunk (keys × N' × M') up to which FAST_COMPILE is used
_chunk_fast = jax.jit(_chunk_values_impl, static_argnames=_STATIC, compiler_options=FAST_COMPILE)
_chunk_full = jax.jit(_chunk_values_impl, static_argnames=_STATIC)


def _chunk_values(x, dy, keys, center, **static):
    small = keys.shape[0] * x.shape[1] * dy.shape[1] <= SMALL_PROBLEM
    return (_chunk_fast if small else _chunk_full)(x, dy, keys, center, **static)


def _check(x, dy, w_shape, estimator, rank, lam, keys, chunk) -> None:
    validate_method(estimator, rank, lam)
    for name, value, low in (("keys", keys, 2), ("chunk", chunk, 1)):
        checks.whole(name, value, low)
    if x.ndim != 2 or dy.ndim != 2 or x.shape[0] != dy.shape[0] or tuple(w_shape) != (x.shape[1], dy.shape[1]):
        raise ValueError(
            f"shape mismatch: x {tuple(x.shape)}, dy {tuple(dy.shape)}, w {tuple(w_shape)}; "
            "need x (B, N), dy (B, M), w (N, M)"
        )


def _values(x, dy, estimator, rank, lam, all_keys, chunk) -> KeyValues:
    """``KeyValues`` of (already reduced) x, dy over ``all_keys``: one pass when they fit
    one chunk (``chunk`` keys, fewer if their d̂W would pass ``CHUNK_FLOATS``), else a
    pass for ē and a second for ‖e_k − ē‖²."""
    static = dict(estimator=estimator, rank=int(rank), lam=float(lam))
    n = all_keys.shape[0]
    chunk = max(1, min(chunk, CHUNK_FLOATS // (x.shape[1] * dy.shape[1])))
    zero = jnp.zeros((x.shape[1], dy.shape[1]), jnp.float32)
    if n <= chunk:
        sq, dev, cos, _, dw_norm2 = _chunk_values(x, dy, all_keys, zero, own_center=True, **static)
        return KeyValues(float(dw_norm2), *(np.asarray(a, np.float64) for a in (sq, dev, cos)))
    sqs, coss, total = [], [], np.zeros(zero.shape, np.float64)
    for start in range(0, n, chunk):
        sq, _, cos, err_sum, dw_norm2 = _chunk_values(x, dy, all_keys[start:start + chunk], zero,
                                                      own_center=False, **static)
        sqs.append(np.asarray(sq, np.float64))
        coss.append(np.asarray(cos, np.float64))
        total += np.asarray(err_sum, np.float64)
    center = jnp.asarray(total / n, jnp.float32)
    devs = [np.asarray(_chunk_values(x, dy, all_keys[start:start + chunk], center, own_center=False, **static)[1],
                       np.float64) for start in range(0, n, chunk)]
    return KeyValues(float(dw_norm2), np.concatenate(sqs), np.concatenate(devs), np.concatenate(coss))


def key_values(
    x: jax.Array,
    dy: jax.Array,
    w_shape: tuple[int, int],
    estimator: str,
    rank: int,
    lam: float,
    keys: int,
    key: jax.Array,
    chunk: int = 256,
) -> KeyValues:
    """``KeyValues`` of ``estimator``'s d̂W from (X (B×N), dY (B×M)) over ``keys`` keys
    split from ``key`` (the same keys whatever the estimator, R and λ), ``chunk`` keys
    per vmap, on the reduced (X', dY') of ``reduce``."""
    _check(x, dy, w_shape, estimator, rank, lam, keys, chunk)
    xr, dyr = reduce(x, dy)[lookup(estimator).row_space]
    return _values(xr, dyr, estimator, rank, lam, jax.random.split(key, keys), chunk)


def moments(values: KeyValues) -> Moments:
    """``Moments`` of one estimator's ``KeyValues`` (module docstring)."""
    s = keystats.summary(keystats.pack([1.0], values.sq[None], values.dev[None]))
    return Moments(values.dw_norm2, s["bias2"], s["bias2_se"], s["variance"], s["mse"],
                   float(values.cos.mean()), len(values.sq))


def dw_moments(
    x: jax.Array,
    dy: jax.Array,
    w_shape: tuple[int, int],
    estimator: str,
    rank: int,
    lam: float,
    keys: int,
    key: jax.Array,
    chunk: int = 256,
) -> Moments:
    """``Moments`` of ``estimator``'s d̂W from (X (B×N), dY (B×M)) over ``keys`` keys
    split from ``key``, ``chunk`` keys per vmap (``key_values``)."""
    return moments(key_values(x, dy, w_shape, estimator, rank, lam, keys, key, chunk))


def diagnose(
    model_cfg: GPTConfig,
    params,
    batches: Sequence[jax.Array],
    *,
    estimators: Sequence[str],
    ranks: Sequence[int],
    lams: Sequence[float],
    keys: int,
    key: jax.Array,
    chunk: int = 256,
    on_progress: Callable[[int, int], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> pd.DataFrame:
    """One row (``COLUMNS`` and ``KEY_VALUES``) per sketched layer (and ``all``),
    estimator, rank and λ: bias², its standard error, variance and MSE relative to
    ‖dW‖²_F, the mean cosine, and the per-key values behind them, pooled over
    ``batches`` (each (B, T+1) tokens). Every setting draws the same keys on a
    (batch, layer) (module docstring: paired keys); one exact pass and one reduction
    per (batch, layer) serve every setting. ``on_progress(done, total)`` is called after
    each (batch, estimator, rank, λ). When ``should_stop()`` turns true (asked after
    each of those), the rows pool the batches each setting has done so far (its
    ``batches`` column says how many); settings not begun are left out."""
    if not batches:
        raise ValueError("batches is empty; pass at least one (B, T+1) token batch")
    for estimator in estimators:
        for rank in ranks:
            for lam in lams:
                validate_method(estimator, rank, lam)
    for name, value in (("keys", keys), ("chunk", chunk)):
        checks.whole(name, value, 2 if name == "keys" else 1)
    settings = [(e, r, lam) for e in estimators for r in ranks for lam in lams]
    progress = _Progress(len(batches) * len(settings), on_progress, should_stop)
    got: dict[tuple, list[KeyValues]] = {}  # (layer, setting) -> one KeyValues per batch done
    layers: list[str] = []
    for b, batch in enumerate(batches):
        captured = capture(model_cfg, params, batch)
        layers = list(captured)
        reduced = {layer: reduce(x, dy) for layer, (x, dy) in captured.items()}
        layer_keys = {layer: jax.random.split(jax.random.fold_in(jax.random.fold_in(key, b), i), keys)
                      for i, layer in enumerate(layers)}
        for s, (estimator, rank, lam) in enumerate(settings):
            for layer in layers:
                x, dy = reduced[layer][lookup(estimator).row_space]
                got.setdefault((layer, s), []).append(_values(x, dy, estimator, rank, lam, layer_keys[layer], chunk))
            if progress.step():
                return _rows(settings, layers, got, keys)
    return _rows(settings, layers, got, keys)


class _Progress:
    """Counts the (batch, setting) passes of a diagnosis, reports each to ``on_progress``
    and asks ``should_stop`` whether to go on."""

    def __init__(self, total: int, on_progress: Callable[[int, int], None] | None,
                 should_stop: Callable[[], bool] | None):
        self.total, self.done = total, 0
        self.on_progress, self.should_stop = on_progress, should_stop

    def step(self) -> bool:
        """One pass done; whether the diagnosis is to stop now."""
        self.done += 1
        if self.on_progress is not None:
            self.on_progress(self.done, self.total)
        return self.should_stop is not None and self.should_stop()


def _rows(settings: list[tuple], layers: list[str], got: dict[tuple, list[KeyValues]], keys: int) -> pd.DataFrame:
    """The ``diagnose`` frame: per setting begun, one row per layer and one for ``all``
    (the layers' key values summed), pooled over the batches it has done."""
    records = []
    for s, (estimator, rank, lam) in enumerate(settings):
        if (layers[0], s) not in got:
            continue
        per_layer = {layer: keystats.pack([v.dw_norm2 for v in got[layer, s]], [v.sq for v in got[layer, s]],
                                          [v.dev for v in got[layer, s]]) for layer in layers}
        per_layer["all"] = functools.reduce(operator.add, per_layer.values())
        for layer, values in per_layer.items():
            cos = [float(v.cos.mean()) for name in ([layer] if layer != "all" else layers) for v in got[name, s]]
            records.append(dict(
                layer=layer, estimator=estimator, rank=rank, lam=lam, **keystats.summary(values),
                cos_mean=float(np.mean(cos)), keys=keys, batches=len(got[layers[0], s]), **{KEY_VALUES: values},
            ))
    return pd.DataFrame.from_records(records, columns=[*COLUMNS, KEY_VALUES])
