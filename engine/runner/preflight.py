"""Checks of a grid before any of its runs is written: what the CLI and the Launch page
run first, so a bad grid fails with one line and leaves nothing behind."""

from __future__ import annotations

from typing import Iterable

from engine.config import RunConfig
from engine.training.inputs import load_data


def check_data(configs: Iterable[RunConfig]) -> None:
    """Load (and cache) every distinct dataset of ``configs``, so a missing file or
    a too-short corpus fails before any run is written."""
    seen = set()
    for c in configs:
        key = (c.dataset, c.dataset_options, c.val_tokens, c.effective_test_tokens, c.effective_batch_size,
               c.effective_seq_len, c.effective_val_batches)
        if key not in seen:
            seen.add(key)
            load_data(c)
