"""From a run to what trains it: the model config on the running backend, the keys,
the initial parameters and the optimizer (its tokens: ``engine.training.inputs``).
Every method of a seed gets the same parameters and batches from here, so runs
differ only by the estimator."""

from __future__ import annotations

import jax

from engine.config import RunConfig
from engine.core.presets import GPTConfig
from engine.model.gpt import init_params
from engine.training import compile_cache
from engine.training.steps import make_optimizer


def model_config(config: RunConfig, backend: str | None = None) -> GPTConfig:
    """``config.model_config`` on ``backend`` (default: the one JAX runs on, whose programs
    are about to be compiled: the persistent compilation cache is enabled first,
    ``engine.training.compile_cache``)."""
    if backend is None:
        compile_cache.enable()
    return config.model_config(backend or jax.default_backend())


def run_keys(seed: int) -> tuple[jax.Array, jax.Array]:
    """(parameter key, root of the sketch-key stream) of a seed."""
    root = jax.random.key(seed)
    return jax.random.fold_in(root, 0), jax.random.fold_in(root, 1)


def sketch_key(sketch_root: jax.Array, step: int) -> jax.Array:
    return jax.random.fold_in(sketch_root, step)


def initial_params(config: RunConfig):
    """The parameters every method of ``config.seed`` starts from."""
    return init_params(model_config(config), run_keys(config.seed)[0])


def optimizer_for(config: RunConfig):
    """The optax optimizer ``config`` names, with its lr, momentum and weight decay."""
    return make_optimizer(config.optimizer, config.lr, momentum=config.momentum, weight_decay=config.weight_decay)
