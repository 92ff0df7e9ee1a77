"""Editing a run's tags after launch: ``python -m engine tag RUN… --add a,b --remove c`` and
``engine.api.Lab.tag`` go through ``tag_runs`` (``edit_tags`` on each run), the dashboard's Run
detail and Runs pages through ``change_tags``.

Tags are typed as comma lists everywhere (the Launch form's box, ``--tags``), so a tag
holds no comma; each is checked as at launch (``storage.records``: not empty, at most
``storage.limits.TAG_MAX`` characters, UTF-8), and a bad one is a one-line ValueError
naming it, with nothing stored.

An edit is a change (tags to add, tags to remove), applied to the tags stored at that
moment under the run's row lock (``RunsRepository.edit_tags``: one transaction), never a whole
list written back from an earlier read: two edits at once (ten ``engine tag 1 --add tK``,
the CLI and a page) each keep what the other did.
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


def edit_tags(store: RunStore, run_id: int, *, add: Iterable[str] = (), remove: Iterable[str] = (),
              missing_ok: bool = False) -> list[str]:
    """Give run ``run_id`` the tags ``add`` (appended, unless it has them) and take ``remove``
    away, atomically (the change is applied to the tags stored when the run's row is locked);
    return its tags. Removing a tag it does not have is an ``InvalidValueError`` (a one-line
    user error, and a ValueError) naming the tags it has, nothing stored, unless
    ``missing_ok`` (a page removing a tag someone removed meanwhile)."""
    add, remove = parse_tags(list(add)), parse_tags(list(remove))
    dropped = set(remove) - set(add)

    def change(current: list[str]) -> list[str]:
        if not missing_ok:
            _check_has(run_id, current, add, remove)
        return [t for t in current + [t for t in add if t not in current] if t not in dropped]

    return store.runs.edit_tags(run_id, change)


def _check_has(run_id: int, current: list[str], add: list[str], remove: list[str]) -> None:
    """An ``InvalidValueError`` unless run ``run_id``, with tags ``current``, has every tag of
    ``remove`` that ``add`` does not give it back."""
    missing = [t for t in remove if t not in current and t not in add]
    if missing:
        raise InvalidValueError(f"run {run_id} has no tag {', '.join(map(repr, missing))} (its tags: "
                                f"{', '.join(current) or 'none'}); check the spelling")


def tag_runs(store: RunStore, refs: Iterable[str | int], *, add: str | Iterable[str] = (),
             remove: str | Iterable[str] = ()) -> dict[int, list[str]]:
    """``edit_tags`` on each run ``refs`` names (ids or exact names), for ``python -m engine tag``
    and ``engine.api.Lab.tag``; ``add`` and ``remove`` are comma lists or lists of them; per run
    id, its tags after. Checked on every run before any is changed: an unknown run, or a tag to
    remove that one of them lacks, changes none."""
    ids = store.runs.resolve_runs(list(refs))
    add, remove = parse_tags(add), parse_tags(remove)
    for run_id in ids:
        _check_has(run_id, store.runs.get_run(run_id).tags, add, remove)
    return {run_id: edit_tags(store, run_id, add=add, remove=remove) for run_id in ids}


def change_tags(store: RunStore, run_id: int, shown: str | Iterable[str] | None,
                wanted: str | Iterable[str] | None) -> list[str]:
    """What a page's tag box did, stored as a change: the tags in ``wanted`` and not in
    ``shown`` (what the box showed, comma lists or lists) are added, those in ``shown`` and
    not in ``wanted`` removed (one removed meanwhile is no error), and every tag added
    elsewhere meanwhile kept (``edit_tags``); the run's tags."""
    before, after = parse_tags(shown), parse_tags(wanted)
    return edit_tags(store, run_id, add=[t for t in after if t not in before],
                     remove=[t for t in before if t not in after], missing_ok=True)
