"""What the schema can hold: the one definition of the longest name, notes and tag, and of
the integers the database stores.  ``models.py`` sizes its columns from these,
``RunStore`` refuses values beyond them (naming the field), and the run schema
(``engine.config``), the CLI and the dashboard's form read them from here.

- ``NAME_MAX`` characters for a run's name (``runs.name`` is ``VARCHAR(NAME_MAX)``),
- ``NOTES_MAX`` characters for a run's notes (``runs.notes`` is unbounded text; notes that
  a run appends to itself keep their newest ``NOTES_MAX`` characters),
- ``TAG_MAX`` characters for one tag (``runs.tags`` is a JSON list),
- text that UTF-8 can encode (``check_utf8``): a string holding a lone surrogate (a byte
  that was not UTF-8 where it came from, e.g. a command-line argument the locale could not
  decode, ``$'x\\xfe'``) is refused, as no database column, CSV or page could hold it,
- integers in ``[INT_MIN, INT_MAX]``: every integer column that a run's settings reach
  (seed, steps, steps done, rank, checkpoint step, metric step) is 64-bit (``BIGINT``).

Text stored before the UTF-8 check is read, never refused: a string UTF-8 cannot encode
comes back with each such character as its visible escape (``as_utf8``: the byte ``0xfe``
that was decoded as the lone surrogate U+DCFE reads ``\\udcfe``), the form in which it can
be typed to edit it (``engine tag RUN --remove 't\\udcfe'``); revision 0011 stores it so.
"""

from __future__ import annotations

import json
import re
from typing import Any

from .family import InvalidValueError

NAME_MAX = 200
NOTES_MAX = 10_000
TAG_MAX = 64
INT_MIN, INT_MAX = -(2**63), 2**63 - 1


def check_text(field: str, value: str, limit: int) -> str:
    """``value`` if it has at most ``limit`` characters and is UTF-8 text (``check_utf8``),
    else ValueError naming ``field``."""
    if len(value) > limit:
        raise InvalidValueError(f"{field} is {len(value):,} characters long; the most is {limit:,}: shorten it")
    return check_utf8(field, value)


def check_utf8(field: str, value: Any) -> Any:
    """``value`` if every string in it (a string, or the keys and values of nested dicts and
    lists) can be stored as UTF-8, else a one-line ValueError naming ``field`` and where the
    bad byte is (the message itself is ASCII-safe)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            shown = ascii(value[max(0, e.start - 10):e.start + 10])
            raise InvalidValueError(f"{field} is not UTF-8 text: character {e.start + 1} ({shown}) is a byte that "
                                    "could not be decoded; retype it in UTF-8") from None
    elif isinstance(value, dict):
        for key, item in value.items():
            check_utf8(field, key)
            check_utf8(f"{field}[{key!a}]" if isinstance(key, str) else field, item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            check_utf8(field, item)
    return value


def check_int(field: str, value: int) -> int:
    """``value`` if a 64-bit integer column holds it, else ValueError naming ``field``."""
    if not INT_MIN <= value <= INT_MAX:
        raise InvalidValueError(f"{field} = {value} does not fit the database (a 64-bit integer, at most {INT_MAX:,})")
    return value


def as_utf8(text: str) -> str:
    """``text`` with every character UTF-8 cannot encode written as its escape (``\\udcfe``):
    for text the program writes itself (an error, a note quoting a path), which must be
    stored rather than refused."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")  # a JSON escape of a UTF-16 surrogate: \ud83d, \udcfe
_SURROGATE_ESCAPE_BYTES = re.compile(rb"\\u[dD][89a-fA-F]")


def has_surrogate_escape(text: "str | bytes") -> bool:
    """Whether JSON ``text`` may decode to a lone surrogate: it escapes a surrogate
    (``\\udcfe``; a pair such as ``\\ud83d\\ude00`` is an emoji and decodes whole)."""
    if isinstance(text, str):
        return _SURROGATE_ESCAPE.search(text) is not None
    return _SURROGATE_ESCAPE_BYTES.search(text) is not None


def as_utf8_value(value: Any) -> Any:
    """``value`` (a string, or nested dicts and lists as JSON gives them) with every string
    in it, keys included, passed through :func:`as_utf8`: what UTF-8 cannot encode becomes its
    visible escape. For stored text read back; nothing else changes."""
    if isinstance(value, str):
        return value if value.isascii() else as_utf8(value)
    if isinstance(value, dict):
        return {as_utf8_value(k): as_utf8_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [as_utf8_value(v) for v in value]
    return value


def json_text_as_utf8(text: str) -> str:
    """JSON ``text`` kept as text (a report's content) as it is, unless a string in it is a
    lone surrogate (escaped in the text as ``\\udcfe``): then the same JSON with each such
    string passed through :func:`as_utf8_value`. Text that is not JSON is left as it is."""
    if not has_surrogate_escape(text):
        return text
    try:
        value = json.loads(text)
    except ValueError:
        return text
    fixed = as_utf8_value(value)
    return text if fixed == value else json.dumps(fixed)
