"""The schema a database holds, checked against the models each time a process opens it.

``alembic_version`` says which revision a database is at; it does not prove the database
holds that revision's tables and columns (a copy from another branch of BASIS Lab may be
stamped with a revision it never ran). So every open (:func:`storage.db.ensure_schema`)
also asks the database itself, through SQLAlchemy's inspector, whether every table and
column of :data:`storage.models.Base` is there; one that is missing is a one-line
:class:`~storage.errors.StorageError` naming the table/columns and the fix (restore a
backup, or add them), raised before anything is written.

The rule: only presence is checked (names, not types or constraints; Alembic's revisions
keep those), and a database that matched is not asked again in this process (the
result is cached by its URL), so the check costs one reflection per database and process.
"""

from __future__ import annotations

from typing import Iterable, Mapping

from sqlalchemy import inspect
from sqlalchemy.engine import Connection

from .errors import FIX_HINT, StorageError

__all__ = ["check_models", "missing_columns", "mismatch_error", "forget_checked"]

_MATCHED: set[str] = set()  # URLs (passwords included) of the databases that matched, in this process
_SHOWN = 8  # missing names an error lists before "and N more"


def missing_columns(conn: Connection, wanted: Mapping[str, Iterable[str]]) -> list[str]:
    """What of ``wanted`` ({table: column names}) ``conn``'s database lacks, as ``table
    <name>`` for a missing table and ``<table>.<column>`` for a missing column, in order."""
    insp = inspect(conn)
    tables = set(insp.get_table_names())
    missing = [f"table {t}" for t in wanted if t not in tables]
    present = [t for t in wanted if t in tables]
    have = {key[1]: {c["name"] for c in cols} for key, cols in insp.get_multi_columns(filter_names=present).items()}
    for table in present:
        missing += [f"{table}.{c}" for c in wanted[table] if c not in have.get(table, set())]
    return missing


def mismatch_error(url: str, revision: str, missing: list[str]) -> StorageError:
    """The one-line error for a database marked ``revision`` (its ``alembic_version``, and
    what it was being upgraded to, if so) that lacks ``missing`` (:func:`missing_columns`)."""
    shown = ", ".join(missing[:_SHOWN]) + (f" and {len(missing) - _SHOWN} more" if len(missing) > _SHOWN else "")
    return StorageError(
        f"database {url} is marked schema revision {revision} but lacks {shown} (a copy from another version of "
        f"BASIS Lab?); nothing was written: restore a backup of it, or add the missing columns, or {FIX_HINT}")


def check_models(conn: Connection, url: str, revision: str) -> None:
    """Raise :func:`mismatch_error` (``url``: as it may be shown) if ``conn``'s database
    lacks a table or column of the models; a database that matched once is not checked
    again in this process."""
    from .models import Base

    key = conn.engine.url.render_as_string(hide_password=False)
    if key in _MATCHED:
        return
    missing = missing_columns(conn, {name: [c.name for c in t.columns] for name, t in Base.metadata.tables.items()})
    if missing:
        raise mismatch_error(url, revision, missing)
    _MATCHED.add(key)


def forget_checked() -> None:
    """Check every database again at its next open (after this process changed one's schema)."""
    _MATCHED.clear()
