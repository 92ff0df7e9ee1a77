"""The explicit migration: where a database's schema stands, and bringing it to this code's.

Opening a database migrates it only where that is the opener's to do (:mod:`storage.db`:
an empty database, a SQLite file); a shared PostgreSQL database at an older revision is
refused until someone runs ``python -m engine db upgrade --db URL``, which is
:func:`upgrade`: a backup first (:func:`storage.backup.backup_url`: ``pg_dump`` or SQLite's
backup API), then every missing revision in one transaction under the upgrade lock; a
failed upgrade changes nothing and removes its backup. :func:`schema_status` (``engine db
current``) reads the revision without changing anything.
"""

from __future__ import annotations

import pathlib
from dataclasses import dataclass
from typing import Literal, Optional

from sqlalchemy import exc, inspect
from sqlalchemy.engine import Engine

from .backup import Backup, backup_url
from .db import FIX_HINT, _refuse_newer, ensure_schema, head_revision, masked_url, open_engine, schema_revision
from .errors import UPGRADE_COMMAND, SchemaNewerError, storage_error

__all__ = ["SchemaStatus", "Upgraded", "schema_status", "upgrade", "default_backup_path"]

State = Literal["current", "behind", "newer", "empty"]


@dataclass(frozen=True)
class SchemaStatus:
    """Where a database's schema stands: its ``revision`` (None: before Alembic, or empty),
    this code's ``head`` and the ``state`` they make (``current``, ``behind``: run
    ``engine db upgrade``, ``newer``: upgrade BASIS Lab, ``empty``: no table yet)."""

    url: str
    revision: Optional[str]
    head: str
    state: State

    def describe(self) -> str:
        """The status line ``engine db current`` prints."""
        at = f"schema revision {self.revision or 'none'}"
        if self.state == "current":
            return f"{self.url}: {at}, current (this BASIS Lab's newest)"
        if self.state == "empty":
            return f"{self.url}: no tables yet; the first open creates the schema at {self.head}"
        if self.state == "newer":
            return f"{self.url}: {at}, newer than this BASIS Lab's {self.head}: upgrade BASIS Lab to use it"
        return f"{self.url}: {at}, behind this BASIS Lab's {self.head}: run `{UPGRADE_COMMAND.format(url=self.url)}`"


@dataclass(frozen=True)
class Upgraded:
    """What :func:`upgrade` did: the revision it left (``before``), the one it reached, and its backup."""

    before: Optional[str]
    after: str
    backup: Optional[Backup]

    def describe(self) -> str:
        if self.before == self.after:
            return f"already at schema revision {self.after}; nothing to do"
        kept = f"; backup: {self.backup.path} ({self.backup.describe()})" if self.backup else ""
        return f"upgraded from schema revision {self.before or 'none'} to {self.after}{kept}"


def _state(engine: Engine) -> SchemaStatus:
    revision, head, url = schema_revision(engine), head_revision(), masked_url(engine.url)
    if revision == head:
        return SchemaStatus(url, revision, head, "current")
    with engine.connect() as conn:
        try:
            _refuse_newer(engine, conn, revision)
        except SchemaNewerError:
            return SchemaStatus(url, revision, head, "newer")
        state: State = "behind" if inspect(conn).get_table_names() else "empty"
    return SchemaStatus(url, revision, head, state)


def schema_status(url: Optional[str] = None) -> SchemaStatus:
    """Where the database at ``url`` stands (:class:`SchemaStatus`), read without writing;
    a SQLite file that does not exist is a :class:`~storage.errors.StorageError`."""
    engine = open_engine(url, create=False)
    try:
        return _state(engine)
    except exc.SQLAlchemyError as e:
        raise storage_error(e, f"cannot read database {masked_url(engine.url)}", FIX_HINT) from e
    finally:
        engine.dispose()


def default_backup_path(engine: Engine) -> pathlib.Path:
    """Where :func:`upgrade` writes its backup when not told: beside a SQLite file
    (``lab.db.before-<head>.db``, as the automatic migration does), else
    ``<database>.before-<head>.dump`` in the working directory."""
    head, database = head_revision(), str(engine.url.database or "basis-lab")
    if engine.url.get_backend_name() == "sqlite":
        source = pathlib.Path(database)
        return source.with_name(f"{source.name}.before-{head}.db")
    return pathlib.Path.cwd() / f"{pathlib.Path(database).name}.before-{head}.dump"


def upgrade(url: Optional[str] = None, out: Optional[str] = None, *, force: bool = False,
            keep_backup: bool = True) -> Upgraded:
    """Migrate the database at ``url`` to this code's newest revision, on any backend: first a
    backup to ``out`` (None: :func:`default_backup_path`, replaced if there; an ``out`` that
    exists is refused unless ``force``), written under the upgrade lock before any revision
    runs and removed if the upgrade fails; ``keep_backup`` False skips it. A database at a
    newer revision is refused (:class:`~storage.errors.SchemaNewerError`), one already
    current is left as it is. Raises :class:`~storage.errors.StorageError` with the fix."""
    engine = open_engine(url, create=False)
    written: list[Backup] = []

    def before(eng: Engine, _revision: Optional[str]) -> Optional[pathlib.Path]:
        if not keep_backup:
            return None
        target = pathlib.Path(out) if out else default_backup_path(eng)
        written.append(backup_url(eng.url, target, force=force or not out))
        return written[-1].path

    try:
        revision = schema_revision(engine)
        after = ensure_schema(engine, before=before)
    except exc.SQLAlchemyError as e:
        raise storage_error(e, f"cannot upgrade database {masked_url(engine.url)}", FIX_HINT) from e
    finally:
        engine.dispose()
    return Upgraded(revision, after, written[-1] if written else None)
