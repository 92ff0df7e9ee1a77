"""From a run to what trains it: the model config on the running backend, the keys,
the initial parameters and the optimizer. Every method of a seed gets the same
parameters and batches from here, so runs differ only by the estimator."""

from __future__ import annotations

import jax
import numpy as np

from engine import data
from engine.config import RunConfig
from engine.core.presets import GPTConfig
from engine.model.gpt import init_params
from engine.training.steps import make_optimizer


def model_config(config: RunConfig, backend: str | None = None) -> GPTConfig:
    """``config.model_config`` on ``backend`` (default: the one JAX runs on)."""
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


def load_data(config: RunConfig) -> tuple[np.ndarray, np.ndarray]:
    """(train tokens, fixed validation batches) of ``config``."""
    train_tokens, val_tokens = data.load_splits(
        config.dataset, val_tokens=config.val_tokens, **config.dataset_options
    )
    val = data.validation_batches(
        val_tokens, config.effective_batch_size, config.effective_seq_len, config.effective_val_batches
    )
    return train_tokens, val


def check_data(configs) -> None:
    """Load (and cache) every distinct dataset of ``configs``, so a missing file or
    a too-short corpus fails before any run is written."""
    seen = set()
    for c in configs:
        key = (c.dataset, c.dataset_options, c.val_tokens, c.effective_batch_size, c.effective_seq_len, c.effective_val_batches)
        if key not in seen:
            seen.add(key)
            load_data(c)
