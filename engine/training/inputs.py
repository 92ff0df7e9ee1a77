"""The tokens a run trains and validates on. No JAX: ``engine.runner.preflight`` checks a
grid's data with it before anything is written or compiled."""

from __future__ import annotations

import numpy as np

from engine import data
from engine.config import RunConfig


def load_data(config: RunConfig) -> tuple[np.ndarray, np.ndarray]:
    """(train tokens, fixed validation batches) of ``config``."""
    train_tokens, val_tokens = data.load_splits(
        config.dataset, val_tokens=config.val_tokens, **config.dataset_options
    )
    val = data.validation_batches(
        val_tokens, config.effective_batch_size, config.effective_seq_len, config.effective_val_batches
    )
    return train_tokens, val
