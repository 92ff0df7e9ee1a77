"""The value checks every module shares, each with the message users see.

Pure Python (no JAX), so ``engine.sketch.basis`` and ``storage``-free callers can use it.
Each check raises the ``error`` class it is given (``ValueError`` by default) with a
one-line message that names the field, the allowed values and the value given.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Iterable


def is_whole(value: Any, minimum: int = 1, maximum: int | None = None) -> bool:
    """Whether ``value`` is an integer in [``minimum``, ``maximum``] (bools are not integers)."""
    return (not isinstance(value, bool) and isinstance(value, numbers.Integral) and int(value) >= minimum
            and (maximum is None or int(value) <= maximum))


def whole(name: str, value: Any, minimum: int = 1, *, note: str = "", fix: str = "",
          error: type[Exception] = ValueError) -> int:
    """``value`` as an int when it is an integer ≥ ``minimum``; else ``error`` with
    ``<name> must be an integer >= <minimum><note> (got <value>)[; <fix>]``."""
    if not is_whole(value, minimum):
        raise error(f"{name} must be an integer >= {minimum}{note} (got {value!r})" + (f"; {fix}" if fix else ""))
    return int(value)


def real(
    name: str,
    value: Any,
    low: float = -math.inf,
    high: float = math.inf,
    *,
    low_open: bool = False,
    high_open: bool = True,
    error: type[Exception] = ValueError,
) -> float:
    """``value`` as a float when it is a finite real in the interval (``[low, high)`` by default)."""
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value > low if low_open else value >= low) and (value < high if high_open else value <= high)
    if not ok:
        raise error(f"{name} must be in {interval(low, high, low_open, high_open)} (got {value!r})")
    return float(value)


def choice(name: str, value: Any, choices: Iterable, *, error: type[Exception] = ValueError) -> Any:
    """``value`` when it is one of ``choices``."""
    choices = tuple(choices)
    if value not in choices:
        raise error(f"{name} must be one of {', '.join(map(str, choices))} (got {value!r})")
    return value


def flag(name: str, value: Any, *, error: type[Exception] = ValueError) -> bool:
    """``value`` when it is True or False."""
    if not isinstance(value, bool):
        raise error(f"{name} must be True or False (got {value!r})")
    return value


def interval(low: float, high: float, low_open: bool = False, high_open: bool = True) -> str:
    """``[0, 1)``, ``(0, inf)``: the interval as users read it."""
    left = "(" if low_open or low == -math.inf else "["
    right = ")" if high_open or high == math.inf else "]"
    return f"{left}{low:g}, {high:g}{right}"
