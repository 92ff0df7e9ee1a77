"""Jitted train and eval steps, kept apart from configuration and I/O."""

from __future__ import annotations

import functools
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from engine.core.choices import OPTIMIZERS
from engine.core.presets import GPTConfig
from engine.model.gpt import DTYPES, loss_fn


class TrainState(NamedTuple):
    params: dict
    opt_state: optax.OptState
    step: jax.Array


def optimizer_of(name: str, lr, *, momentum: float = 0.9, weight_decay: float = 0.0) -> optax.GradientTransformation:
    """``sgd``: SGD with (heavy-ball) momentum, as in the paper; ``adamw``: AdamW. ``lr`` is a
    number or, inside a trace, a scalar array: the learning rate as data. Neither optimizer's
    state holds it (each scales its update by −lr last: ``optax.scale_by_learning_rate``), so
    the state is one pytree whatever the learning rate."""
    if name == "sgd":
        return optax.sgd(lr, momentum=momentum or None)
    if name == "adamw":
        return optax.adamw(lr, weight_decay=weight_decay)
    raise ValueError(f"unknown optimizer {name!r}; choose one of {', '.join(OPTIMIZERS)}")


@functools.lru_cache(maxsize=16)
def make_optimizer(name: str, lr: float, *, momentum: float = 0.9, weight_decay: float = 0.0):
    """``optimizer_of`` with the learning rate a constant of the program. One object per
    setting in a process (optax's are pure functions), so what is compiled for an optimizer
    can be kept for the next run of the same setting."""
    return optimizer_of(name, lr, momentum=momentum, weight_decay=weight_decay)


def floor_optimizer(cfg: GPTConfig, optimizer: optax.GradientTransformation) -> optax.GradientTransformation:
    """``optimizer`` with the gradients of ``cfg``'s sketched kernels set to zero.

    A train step built with it never reads those dW, so XLA drops them and the sketches
    that only feed them; the forward pass, every dX, the other dW and the full update of
    every parameter remain. Its time is the floor of any estimator of the sketched
    layers' dW at ``cfg``'s shapes and options: a benchmark's best case, never a run's."""
    sketched = set(cfg.sketched_kernel_paths())
    mask = lambda params: jax.tree_util.tree_map_with_path(
        lambda path, _: path[-1].key == "kernel" and tuple(k.key for k in path[:-1]) in sketched, params
    )
    return optax.chain(optax.masked(optax.set_to_zero(), mask), optimizer)


def _train_step(cfg: GPTConfig, optimizer: optax.GradientTransformation) -> Callable:
    def step(state: TrainState, batch: jax.Array, sketch_key: jax.Array):
        loss, grads = jax.value_and_grad(lambda p: loss_fn(cfg, p, batch, sketch_key))(state.params)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        return TrainState(params, opt_state, state.step + 1), loss

    return step


def make_train_step(cfg: GPTConfig, optimizer: optax.GradientTransformation) -> jax.stages.Wrapped:
    """``step(state, batch, sketch_key) -> (state, loss)``, jitted, state donated."""
    return jax.jit(_train_step(cfg, optimizer), donate_argnums=0)


def make_train_block(cfg: GPTConfig, optimizer: optax.GradientTransformation) -> Callable:
    """``block(state, batches[n, B, T+1], sketch_root, first) -> (state, losses[n])``:
    n train steps as one compiled program (``lax.scan``; one dispatch instead of n),
    jitted, state donated. Step i takes ``batches[i]`` and the sketch key
    ``fold_in(sketch_root, first + i)``, the key the step-by-step loop gives step
    ``first + i`` (``engine.training.build.sketch_key``), so the block computes what n
    calls of ``make_train_step`` compute."""
    return jax.jit(_scan(_train_step(cfg, optimizer)), donate_argnums=0)


def _scan(step: Callable) -> Callable:
    def block(state: TrainState, batches: jax.Array, sketch_root: jax.Array, first: jax.Array):
        def body(state, xs):
            batch, i = xs
            return step(state, batch, jax.random.fold_in(sketch_root, first + i))

        index = jnp.arange(batches.shape[0], dtype=jnp.int32)
        return jax.lax.scan(body, state, (batches, index))

    return block


def lr_train_block(cfg: GPTConfig, optimizer: str, *, momentum: float, weight_decay: float) -> Callable:
    """``block(state, batches[n, B, T+1], sketch_root, first, lr) -> (state, losses[n])``:
    ``make_train_block``'s block (not jitted) with the learning rate as data: the optimizer
    (``optimizer_of``) is built in the trace around ``lr``, cast to the parameters' dtype as
    a number would be, so one program trains every learning rate, each as its run with that
    rate as a constant does (to rounding), on a state of the same pytree."""
    dtype = DTYPES[cfg.dtype]

    def block(state: TrainState, batches: jax.Array, sketch_root: jax.Array, first: jax.Array, lr: jax.Array):
        rule = optimizer_of(optimizer, lr.astype(dtype), momentum=momentum, weight_decay=weight_decay)
        return _scan(_train_step(cfg, rule))(state, batches, sketch_root, first)

    return block


def make_eval_step(cfg: GPTConfig) -> Callable:
    """``eval(params, batches[n, B, T+1]) -> losses[n]``: the mean loss of each of the n
    validation batches (float32, in batch order), with exact forward (sketching never
    changes the forward pass).

    The n validation batches are disjoint, evenly spaced windows of held-out text, the
    same for every run of a dataset; the loop summarises them on the host
    (``engine.training.loop.val_summary``) and stores them as they are, so that a later
    analysis can pair batch b of two runs."""
    exact = cfg.replace(estimator="exact")

    def evaluate(params, batches):
        return jax.lax.map(lambda b: loss_fn(exact, params, b, None), batches)

    return jax.jit(evaluate)


def init_state(params, optimizer: optax.GradientTransformation) -> TrainState:
    """Step 0 of training: ``params``, the optimizer's initial state (one compiled call,
    not one dispatch per leaf) and a step counter of 0."""
    return TrainState(params, _jitted_init(optimizer)(params), jax.numpy.zeros((), jax.numpy.int32))


@functools.lru_cache(maxsize=16)
def _jitted_init(optimizer: optax.GradientTransformation) -> Callable:
    return jax.jit(optimizer.init)
