"""The data pipeline's one error type, and the check of a whole-number option."""

from __future__ import annotations

from engine.core import checks
from engine.errors import UserError


class DataError(UserError, ValueError):
    """A bad data input; the message names the problem and the fix."""


def whole(name: str, value: int, minimum: int = 1) -> int:
    """``value`` as an int; DataError unless it is a whole number ``>= minimum``."""
    if not checks.is_whole(value, minimum):
        raise DataError(f"{name}={value!r} is not a whole number >= {minimum}: fix by passing one")
    return int(value)
