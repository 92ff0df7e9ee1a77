"""The tokens a run trains, validates and tests on. No JAX: ``engine.runner.preflight`` checks a
grid's data with it before anything is written or compiled."""

from __future__ import annotations

import numpy as np

from engine import data
from engine.config import RunConfig


def load_data(config: RunConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(train tokens, fixed validation batches, fixed test batches) of ``config``. The test
    batches are ``validation_batches`` of the test split, as many as the validation batches;
    None when the run has no test split (``effective_test_tokens`` 0)."""
    options = dict(config.dataset_options, val_tokens=config.val_tokens, test_tokens=config.effective_test_tokens)
    train_tokens, val_tokens = data.load_splits(config.dataset, **options)
    shape = (config.effective_batch_size, config.effective_seq_len, config.effective_val_batches)
    val = data.validation_batches(val_tokens, *shape)
    if not config.effective_test_tokens:
        return train_tokens, val, None
    return train_tokens, val, _held_out_batches(data.load_split(config.dataset, "test", **options), *shape)


def _held_out_batches(tokens: np.ndarray, batch_size: int, seq_len: int, n_batches: int) -> np.ndarray:
    """``validation_batches`` of the test split ``tokens``; a split shorter than its
    ``n_batches · batch_size`` windows of ``seq_len + 1`` is a ``DataError`` naming test_tokens."""
    needed = n_batches * batch_size * (seq_len + 1)
    if len(tokens) < needed:
        raise data.DataError(
            f"the test split has {len(tokens):,} tokens, fewer than the {needed:,} that {n_batches} batch(es) of "
            f"{batch_size} x {seq_len + 1} need: fix by raising test_tokens or lowering val_batches, batch_size or "
            "seq_len")
    return data.validation_batches(tokens, batch_size, seq_len, n_batches)
