"""Quantities as people read them: durations (``format_seconds``).

In ``engine.core`` because the dashboard, the CLI, the time estimates and the report all
print durations, and none of them should import training for it.
"""

from __future__ import annotations

import math
from typing import Optional


def format_seconds(seconds: Optional[float]) -> str:
    """``42 s``, ``3 min 05 s``, ``2 h 07 min`` (rounded to the second); ``?`` for NaN, ±inf or None."""
    if seconds is None or not math.isfinite(seconds):
        return "?"
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {(s % 3600) // 60:02d} min"
