"""Names of what the backward pass keeps, given where each residual is made.

Every array the project's code keeps for a backward pass is tagged with
``jax.ad_checkpoint.checkpoint_name(array, TAG)`` where it is made (an identity), so
that memory accounting (``engine.model.memory``) reads its category off JAX's saved-residual
listing. A library function whose residuals we cannot tag inside (Flax LayerNorm, the
GELU, XLA attention, optax's cross-entropy) is run through ``keep_tagged``.
"""

from __future__ import annotations

from typing import Callable

import jax
from jax.ad_checkpoint import checkpoint_name

DENSE_INPUT = "sketched_inputs"  # what a dense layer keeps for dW: X, or its sketch
NONLINEARITY = "nonlinearity"  # LayerNorm and GELU state
ATTENTION = "attention"  # Q, K, V and the probabilities or the row log-sum-exp
LOSS_LOGITS = "loss_logits"  # the loss's softmax, or what the fused head keeps


def tag_all(tree, name: str):
    """``checkpoint_name(leaf, name)`` on every leaf of ``tree``."""
    return jax.tree_util.tree_map(lambda a: checkpoint_name(a, name), tree)


def keep_tagged(fn: Callable, name: str, *, static: int = 0) -> Callable:
    """``fn`` with the same value and gradient, whose residuals are all tagged ``name``.

    The forward pass is ``jax.vjp(fn, ...)``; its pullback (a pytree whose leaves are
    exactly what ``fn``'s backward pass needs) is kept with every leaf tagged. The last
    ``static`` positional arguments are integer inputs (such as targets): they are
    passed through and get no gradient.
    """

    @jax.custom_vjp
    def wrapped(*args):
        return fn(*args)

    def fwd(*args):
        split = len(args) - static
        diff, rest = args[:split], args[split:]
        out, pullback = jax.vjp(lambda *d: fn(*d, *rest), *diff)
        return out, tag_all(pullback, name)

    def bwd(pullback, g):
        return (*pullback(g), *(None,) * static)

    wrapped.defvjp(fwd, bwd)
    return wrapped
