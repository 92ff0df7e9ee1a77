"""New test databases at the newest schema, copied from one migrated template per backend.

Migrating a new database through every Alembic revision costs about 0.14 s of this process
on SQLite, and on PostgreSQL as much again in the server; the suite opens hundreds. A copy
of a database migrated once per pytest process costs a file copy (SQLite) or
``CREATE DATABASE … TEMPLATE`` (PostgreSQL). The template has no identity, as a backup
has none, so each copy makes its own when :func:`fresh` opens it: every database a test
gets is its own, and its lineage starts with itself, as a new database's does.

Tests of the migrations themselves take an empty database instead (``empty_db_url``).
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

from tests.support.postgres import ThrowawayPostgres


def fresh(url: str) -> str:
    """``url``, after a store opened it once (at the newest schema, with its own identity)."""
    from storage import RunStore

    store = RunStore(url)
    store.identities.identity()
    store.close()
    return url


def _forget_identity(url: str) -> None:
    """Migrate the database at ``url`` and leave it with no identity and no lineage."""
    from sqlalchemy import delete

    from storage import make_engine
    from storage.models import DatabaseIdentity, DatabaseLineage

    engine = make_engine(url)
    with engine.begin() as con:
        con.execute(delete(DatabaseIdentity))
        con.execute(delete(DatabaseLineage))
    engine.dispose()


class SqliteTemplate:
    """A migrated SQLite file in ``folder``, copied whole into each test's directory."""

    def __init__(self, folder: Path):
        self.path = folder / "template.db"
        _forget_identity(f"sqlite:///{self.path}")
        with sqlite3.connect(self.path) as con:  # everything in the main file, none in the log
            con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        con.close()

    def copy(self, path: Path) -> str:
        shutil.copyfile(self.path, path)
        return fresh(f"sqlite:///{path}")


class PostgresTemplate:
    """A migrated database in ``cluster`` that new ones are created from (no session may
    be connected to it while they are)."""

    def __init__(self, cluster: ThrowawayPostgres):
        self.cluster = cluster
        self.name, url = cluster.new_database()
        _forget_identity(url)

    def copy(self) -> tuple[str, str]:
        """(name, URL) of a new database copied from the template."""
        name, url = self.cluster.new_database(template=self.name)
        return name, fresh(url)
