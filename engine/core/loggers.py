"""Python's ``logging`` held down for a block: ``held_below``, for a library that logs what is
no news to the user (a browser's startup chatter, a finished run's end already said)."""

from __future__ import annotations

import contextlib
import logging
from typing import Iterator


@contextlib.contextmanager
def held_below(name: str, level: int) -> Iterator[None]:
    """Logger ``name`` passes only records at ``level`` or above while the block runs; its own
    level is restored after."""
    logger = logging.getLogger(name)
    before = logger.level
    logger.setLevel(level)
    try:
        yield
    finally:
        logger.setLevel(before)
