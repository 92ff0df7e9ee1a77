"""Editing a run's tags after launch: the dashboard's Run detail and Runs pages and
``python -m engine tag RUN --add a,b --remove c`` all go through ``edit_tags``.

Tags are typed as comma lists everywhere (the Launch form's box, ``--tags``), so a tag
holds no comma; each is checked as at launch (``storage.records``: not empty, at most
``storage.limits.TAG_MAX`` characters, UTF-8), and a bad one is a one-line ValueError
naming it, with nothing stored.
"""

from __future__ import annotations

from typing import Iterable

from engine.errors import InvalidValueError
from storage import RunStore


def parse_tags(text: str | Iterable[str] | None) -> list[str]:
    """The tags of a comma list (or of a list of such lists), stripped, empty ones
    dropped, duplicates once, in order."""
    parts = [text] if isinstance(text, str) else list(text or [])
    return list(dict.fromkeys(t.strip() for part in parts for t in str(part).split(",") if t.strip()))


def edit_tags(store: RunStore, run_id: int, *, add: Iterable[str] = (), remove: Iterable[str] = ()) -> list[str]:
    """Give run ``run_id`` the tags ``add`` (appended, unless it has them) and take ``remove``
    away; store and return its tags. Removing a tag it does not have is an
    ``InvalidValueError`` (a one-line user error, and a ValueError) naming the tags it has;
    nothing is stored then."""
    current = list(store.get_run(run_id).tags or [])
    add, remove = parse_tags(list(add)), parse_tags(list(remove))
    missing = [t for t in remove if t not in current and t not in add]
    if missing:
        raise InvalidValueError(f"run {run_id} has no tag {', '.join(map(repr, missing))} (its tags: "
                         f"{', '.join(current) or 'none'}); check the spelling")
    tags = [t for t in current + [t for t in add if t not in current] if t not in set(remove) - set(add)]
    store.set_tags(run_id, tags)
    return list(store.get_run(run_id).tags)


def replace_tags(store: RunStore, run_id: int, text: str) -> list[str]:
    """Set run ``run_id``'s tags to those of the comma list ``text`` (a form's box)."""
    store.set_tags(run_id, parse_tags(text))
    return list(store.get_run(run_id).tags)
