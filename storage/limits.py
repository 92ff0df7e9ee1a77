"""What the schema can hold: the one definition of the longest name, notes and tag, and of
the integers the database stores.  ``models.py`` sizes its columns from these,
``RunStore`` refuses values beyond them (naming the field), and the run schema
(``engine.config``), the CLI and the dashboard's form read them from here.

- ``NAME_MAX`` characters for a run's name (``runs.name`` is ``VARCHAR(NAME_MAX)``),
- ``NOTES_MAX`` characters for a run's notes (``runs.notes`` is unbounded text; notes that
  a run appends to itself keep their newest ``NOTES_MAX`` characters),
- ``TAG_MAX`` characters for one tag (``runs.tags`` is a JSON list),
- integers in ``[INT_MIN, INT_MAX]``: every integer column that a run's settings reach
  (seed, steps, steps done, rank, checkpoint step, metric step) is 64-bit (``BIGINT``).
"""

from __future__ import annotations

NAME_MAX = 200
NOTES_MAX = 10_000
TAG_MAX = 64
INT_MIN, INT_MAX = -(2**63), 2**63 - 1


def check_text(field: str, value: str, limit: int) -> str:
    """``value`` if it has at most ``limit`` characters, else ValueError naming ``field``."""
    if len(value) > limit:
        raise ValueError(f"{field} is {len(value):,} characters long; the most is {limit:,}: shorten it")
    return value


def check_int(field: str, value: int) -> int:
    """``value`` if a 64-bit integer column holds it, else ValueError naming ``field``."""
    if not INT_MIN <= value <= INT_MAX:
        raise ValueError(f"{field} = {value} does not fit the database (a 64-bit integer, at most {INT_MAX:,})")
    return value
