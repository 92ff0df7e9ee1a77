"""Gradient-quality probes and activation-memory accounting.

dW probe: for the same parameters and batch, one exact backward pass and one
sketched backward pass; for every sketched kernel W_l

    cos_l = ⟨dW_l, d̂W_l⟩ / (‖dW_l‖_F ‖d̂W_l‖_F),   rel_err_l = ‖d̂W_l − dW_l‖_F / ‖dW_l‖_F.

Memory: the bytes a train step keeps for its backward pass are the residuals of
``jax.vjp`` of the loss (JAX's saved-residual listing), minus the parameters,
which live in memory anyway.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax._src.ad_checkpoint import saved_residuals

from engine.model import GPTConfig, loss_fn


def layer_name(path: tuple[str, ...]) -> str:
    return "/".join(path)


def _kernel(tree, path):
    for part in path:
        tree = tree[part]
    return tree["kernel"]


def make_dw_probe(cfg: GPTConfig) -> tuple[list[str], Callable]:
    """Return (layer names, jitted probe(params, batch, key) → (cos[L], rel_err[L]))."""
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

    return [layer_name(p) for p in paths], probe


def dw_similarity(cfg: GPTConfig, params, batch, key) -> dict[str, dict[str, float]]:
    """Per sketched layer ``{"cos": ..., "rel_err": ...}`` of sketched dW against exact dW."""
    names, probe = make_dw_probe(cfg)
    cos, rel = probe(params, batch, key)
    return {
        n: {"cos": float(c), "rel_err": float(r)}
        for n, c, r in zip(names, np.asarray(cos), np.asarray(rel))
    }


def residuals(cfg: GPTConfig, params, batch, key) -> list[tuple[int, str]]:
    """(bytes, description) of every residual the loss keeps for its backward pass,
    parameters excluded."""
    listing = saved_residuals(lambda p, b, k: loss_fn(cfg, p, b, k), params, batch, key)
    out = []
    for aval, description in listing:
        if description.startswith("from the argument p"):
            continue
        out.append((int(np.prod(aval.shape)) * aval.dtype.itemsize, description))
    return out


def saved_activation_bytes(cfg: GPTConfig, params, batch, key) -> int:
    """Total bytes of activations saved for the backward pass of one train step."""
    return sum(size for size, _ in residuals(cfg, params, batch, key))
