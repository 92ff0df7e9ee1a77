"""Bias, variance and MSE of the dW estimators on real training states.

dX is exact for every estimator, so the dY that reaches a sketched layer is the
exact-backprop dY for the same parameters and batch. One exact forward/backward
pass therefore gives, for every sketched layer, its input X (B×N) and output
gradient dY (B×M) (``capture``), and with them the exact ``dW = Xᵀ dY``. Each
estimator's d̂W is then drawn from (X, dY) through ``sketched_matmul``'s own VJP
(the loss ⟨dY, X W⟩ has output gradient dY), so it is exactly the estimator
training uses, for K independent sketch keys, ``jax.vmap``-ed over chunks of keys.

Moments over K keys, e_k = d̂W_k − dW, ē = (1/K) Σ_k e_k (``dw_moments``)::

    variance  V = 1/(K−1) · Σ_k ‖e_k − ē‖²                (unbiased for tr Σ = E‖d̂W − E d̂W‖²)
    bias²     b² = ‖ē‖² − V/K                              (E‖ē‖² = ‖E d̂W − dW‖² + tr Σ/K)
    MSE       (1/K) Σ_k ‖e_k‖² = b² + V
    cosine    (1/K) Σ_k ⟨d̂W_k, dW⟩ / (‖d̂W_k‖ ‖dW‖)

The standard error of b²: for ē ≈ N(b, Σ/K), Var ‖ē‖² = 4 bᵀΣb/K + 2 tr(Σ²)/K²,
and bᵀΣb ≤ ‖b‖² tr Σ, tr(Σ²) ≤ (tr Σ)², so

    se(b²) = sqrt(4 max(b², 0) · V / K + 2 V² / K²)

is a conservative (upper-bound) standard error from the two numbers at hand; an
unbiased estimator's b² is zero within a few of it.

Moments are streamed: each chunk of keys gives its mean error and its sum of squared
deviations on the device (float32); chunks are merged on the host in float64 with
Chan's pairwise update, so memory stays at one chunk of d̂W (chunk × N × M floats)
whatever K.

``diagnose`` reports, per layer, estimator, R and λ, the numbers above relative to
‖dW‖²_F of the exact gradient on the same batch, pooled over batches as Σ numerators
/ Σ ‖dW‖²; the row with layer ``all`` pools the layers the same way (and averages
the cosine over layers and batches).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd

from engine.core import checks
from engine.core.presets import GPTConfig, validate_method
from engine.model.gpt import GPT
from engine.model.layers import CAPTURED_GRADS, CAPTURED_INPUTS
from engine.sketch.basis import sketched_matmul

COLUMNS = (
    "layer", "estimator", "rank", "lam", "bias2", "bias2_se", "variance", "mse", "cos_mean",
    "keys", "batches",
)


@dataclass(frozen=True)
class Moments:
    """Moments of one estimator's d̂W over K keys on one (X, dY); absolute, not relative."""

    dw_norm2: float  # ‖dW‖²_F
    bias2: float  # ‖ē‖² − V/K
    bias2_se: float  # conservative standard error of bias2
    variance: float  # V
    mse: float  # (1/K) Σ ‖e_k‖²
    cos_mean: float
    keys: int


def capture(cfg: GPTConfig, params, batch: jax.Array) -> dict[str, tuple[jax.Array, jax.Array]]:
    """``{layer: (X (B×N), dY (B×M))}`` of every kernel in ``cfg.sketched_kernel_paths()``,
    from one exact forward/backward pass (unfused head, no remat: same numbers)."""
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


@functools.partial(jax.jit, static_argnums=(2, 3, 4, 5))
def _chunk_moments(x, dy, w_shape, estimator, rank, lam, keys):
    """Per chunk of keys: mean error m, Σ‖e_k − m‖², Σ‖e_k‖², Σ cos_k (float32)."""
    w = jnp.zeros(w_shape, jnp.float32)
    dw = x.T.astype(jnp.float32) @ dy.astype(jnp.float32)

    def one(key):
        linear = lambda w: jnp.sum(dy * sketched_matmul(x, w, key, rank=rank, lam=lam, estimator=estimator))
        return jax.grad(linear)(w)

    dws = jax.vmap(one)(keys)
    err = dws - dw
    mean = err.mean(axis=0)
    m2 = jnp.sum((err - mean) ** 2)
    sq = jnp.sum(err**2)
    norms = jnp.sqrt(jnp.sum(dws**2, axis=(1, 2))) * jnp.linalg.norm(dw)
    cos = jnp.sum(jnp.tensordot(dws, dw, axes=2) / jnp.where(norms > 0, norms, 1.0))
    return mean, m2, sq, cos, jnp.sum(dw**2)


def dw_moments(
    x: jax.Array,
    dy: jax.Array,
    w_shape: tuple[int, int],
    estimator: str,
    rank: int,
    lam: float,
    keys: int,
    key: jax.Array,
    chunk: int = 32,
) -> Moments:
    """``Moments`` of ``estimator``'s d̂W from (X (B×N), dY (B×M)) over ``keys`` keys
    split from ``key``, ``chunk`` keys per vmap."""
    validate_method(estimator, rank, lam)
    for name, value, low in (("keys", keys, 2), ("chunk", chunk, 1)):
        checks.whole(name, value, low)
    if x.ndim != 2 or dy.ndim != 2 or x.shape[0] != dy.shape[0] or tuple(w_shape) != (x.shape[1], dy.shape[1]):
        raise ValueError(
            f"shape mismatch: x {tuple(x.shape)}, dy {tuple(dy.shape)}, w {tuple(w_shape)}; "
            "need x (B, N), dy (B, M), w (N, M)"
        )
    all_keys = jax.random.split(key, keys)
    n, mean, m2, sq, cos, dw_norm2 = 0, None, 0.0, 0.0, 0.0, 0.0
    for start in range(0, keys, chunk):
        part = all_keys[start:start + chunk]
        m_c, m2_c, sq_c, cos_c, dw_norm2 = _chunk_moments(
            x, dy, tuple(w_shape), estimator, int(rank), float(lam), part
        )
        n_c = part.shape[0]
        m_c = np.asarray(m_c, np.float64)
        if mean is None:
            mean, m2 = m_c, float(m2_c)
        else:  # Chan et al.: merge (n, mean, M2) with (n_c, m_c, M2_c)
            delta = m_c - mean
            m2 = m2 + float(m2_c) + float(np.sum(delta**2)) * n * n_c / (n + n_c)
            mean = mean + delta * (n_c / (n + n_c))
        n += n_c
        sq += float(sq_c)
        cos += float(cos_c)
    variance = m2 / (n - 1)
    bias2 = float(np.sum(mean**2)) - variance / n
    se = math.sqrt(4 * max(bias2, 0.0) * variance / n + 2 * variance**2 / n**2)
    return Moments(float(dw_norm2), bias2, se, variance, sq / n, cos / n, n)


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
    chunk: int = 32,
    on_progress: Callable[[int, int], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> pd.DataFrame:
    """One row (``COLUMNS``) per sketched layer (and ``all``), estimator, rank and λ:
    bias², its standard error, variance and MSE relative to ‖dW‖²_F, and the mean
    cosine, pooled over ``batches`` (each (B, T+1) tokens). ``on_progress(done,
    total)`` is called after each (batch, estimator, rank, λ). When ``should_stop()``
    turns true (asked after each of those), the rows pool the batches each setting has
    done so far (its ``batches`` column says how many); settings not begun are left out."""
    if not batches:
        raise ValueError("batches is empty; pass at least one (B, T+1) token batch")
    for estimator in estimators:
        for rank in ranks:
            for lam in lams:
                validate_method(estimator, rank, lam)
    settings = [(e, r, lam) for e in estimators for r in ranks for lam in lams]
    total, done = len(batches) * len(settings), 0
    # sums[(layer, setting)] = [‖dW‖², bias², se², variance, mse, cos]
    sums: dict[tuple, np.ndarray] = {}
    counts = [0] * len(settings)  # batches done per setting
    layers: list[str] = []
    stopped = False
    for b, batch in enumerate(batches):
        captured = capture(model_cfg, params, batch)
        layers = list(captured)
        for s, (estimator, rank, lam) in enumerate(settings):
            for i, (layer, (x, dy)) in enumerate(captured.items()):
                k = jax.random.fold_in(jax.random.fold_in(jax.random.fold_in(key, b), s), i)
                m = dw_moments(x, dy, (x.shape[1], dy.shape[1]), estimator, rank, lam, keys, k, chunk)
                row = np.array([m.dw_norm2, m.bias2, m.bias2_se**2, m.variance, m.mse, m.cos_mean])
                sums[layer, s] = sums.get((layer, s), 0.0) + row
            counts[s] += 1
            done += 1
            if on_progress is not None:
                on_progress(done, total)
            if should_stop is not None and should_stop():
                stopped = True
                break
        if stopped:
            break
    records = []
    for s, (estimator, rank, lam) in enumerate(settings):
        if not counts[s]:
            continue
        per_layer = [sums[layer, s] for layer in layers]
        for layer, acc in [*zip(layers, per_layer), ("all", sum(per_layer))]:
            count = counts[s] * (len(layers) if layer == "all" else 1)
            norm = acc[0]
            records.append(dict(
                layer=layer, estimator=estimator, rank=rank, lam=lam,
                bias2=acc[1] / norm, bias2_se=math.sqrt(acc[2]) / norm,
                variance=acc[3] / norm, mse=acc[4] / norm, cos_mean=acc[5] / count,
                keys=keys, batches=counts[s],
            ))
    return pd.DataFrame.from_records(records, columns=list(COLUMNS))
