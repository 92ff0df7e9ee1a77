"""Gradient-quality probes and activation-memory accounting.

dW probe: for the same parameters and batch, one exact backward pass and one
sketched backward pass; for every sketched kernel W_l

    cos_l = ⟨dW_l, d̂W_l⟩ / (‖dW_l‖_F ‖d̂W_l‖_F),   rel_err_l = ‖d̂W_l − dW_l‖_F / ‖dW_l‖_F.

Memory: the bytes a train step keeps for its backward pass are the residuals of
``jax.vjp`` of the loss (JAX's saved-residual listing), minus the parameters,
which live in memory anyway. ``memory_breakdown`` sorts them into

- ``sketched_inputs``: what dense layers keep for dW: their input X when exact;
  X̂ (R×N) and the sketch key when sketched; the weighted rows x̃ (R×N) and their
  indices for ``crs`` / ``wta-crs``; X P (B×k) and the key for ``proj``,
- ``nonlinearity``: LayerNorm and GELU state (their inputs, or their internals),
- ``attention``: Q, K, V and the probabilities or the row log-sum-exp,
- ``loss_logits``: the cross-entropy's B·T×V softmax, or what the fused head keeps
  (dX and dW or dẐ),
- ``other``: everything else: the token indices the embedding lookup (Flax's
  ``nn.Embed``) keeps, and block inputs and matmul outputs kept by a ``remat`` policy.

A residual is placed only by the ``checkpoint_name`` tag given where it is made
(``engine.sketch.residuals``: every residual of the project's own code has one), and a
sketch's PRNG key, which is kept as it is, by its dtype.
``engine.training.compiled`` adds what XLA reports for the whole compiled train step.
"""

from __future__ import annotations

import functools
import re
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax._src.ad_checkpoint import saved_residuals

from engine.core.presets import GPTConfig
from engine.model.gpt import loss_fn
from engine.sketch.residuals import ATTENTION, DENSE_INPUT, LOSS_LOGITS, NONLINEARITY

CATEGORIES = (DENSE_INPUT, NONLINEARITY, ATTENTION, LOSS_LOGITS, "other")


def layer_name(path: tuple[str, ...]) -> str:
    return "/".join(path)


def _kernel(tree, path):
    for part in path:
        tree = tree[part]
    return tree["kernel"]


@functools.lru_cache(maxsize=16)
def make_dw_probe(cfg: GPTConfig) -> tuple[tuple[str, ...], Callable]:
    """Return (layer names, jitted probe(params, batch, key) → (cos[L], rel_err[L])), one
    per model in a process (each run of it would trace and lower the same probe again)."""
    paths = cfg.sketched_kernel_paths()
    exact_cfg = cfg.replace(estimator="exact")

    @jax.jit
    def probe(params, batch, key):
        exact = jax.grad(lambda p: loss_fn(exact_cfg, p, batch, None))(params)
        sketched = jax.grad(lambda p: loss_fn(cfg, p, batch, key))(params)
        cos, rel = [], []
        for path in paths:
            g, h = _kernel(exact, path), _kernel(sketched, path)
            g_norm = jnp.linalg.norm(g)
            cos.append(jnp.vdot(g, h) / (g_norm * jnp.linalg.norm(h) + 1e-30))
            rel.append(jnp.linalg.norm(h - g) / (g_norm + 1e-30))
        if not paths:
            return jnp.zeros((0,)), jnp.zeros((0,))
        return jnp.stack(cos), jnp.stack(rel)

    return tuple(layer_name(p) for p in paths), probe


def _listing(cfg: GPTConfig, params, batch, key) -> list[tuple[jax.core.AbstractValue, str]]:
    listing = saved_residuals(lambda p, b, k: loss_fn(cfg, p, b, k), params, batch, key)
    return [(a, why) for a, why in listing if not why.startswith("from the argument p")]


def _nbytes(aval) -> int:
    return int(np.prod(aval.shape)) * aval.dtype.itemsize


def residuals(cfg: GPTConfig, params, batch, key) -> list[tuple[int, str]]:
    """(bytes, description) of every residual the loss keeps for its backward pass,
    parameters excluded."""
    return [(_nbytes(aval), why) for aval, why in _listing(cfg, params, batch, key)]


def residual_category(aval, description: str) -> str:
    """The ``CATEGORIES`` entry of one residual of the saved-residual listing."""
    if jax.dtypes.issubdtype(aval.dtype, jax.dtypes.prng_key):
        return DENSE_INPUT  # only sketches draw keys
    tag = re.match(r"named '([^']*)'", description)
    if tag and tag.group(1) in CATEGORIES:
        return tag.group(1)
    return "other"


def memory_breakdown(cfg: GPTConfig, params, batch, key) -> dict[str, int]:
    """Bytes saved for the backward pass per category; they sum to the bytes of ``residuals``."""
    out = dict.fromkeys(CATEGORIES, 0)
    for aval, why in _listing(cfg, params, batch, key):
        out[residual_category(aval, why)] += _nbytes(aval)
    return out
