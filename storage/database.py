"""The database object every repository of :class:`storage.store.RunStore` works through.

A :class:`Database` holds one SQLAlchemy engine and what follows from it: the engine whose
transactions take SQLite's write lock at ``BEGIN`` (:func:`storage.db.write_engine`), the
dialect (SQLite or PostgreSQL) and the URL as it may be shown.  Its :meth:`Database.session`
is the one way a repository reaches the database: one short session and transaction per
call, a database error raised as a one-line :class:`storage.errors.StorageError` (a
transient one as :class:`storage.errors.DatabaseBusyError`, which the caller may retry).
"""

from __future__ import annotations

import weakref
from contextlib import contextmanager
from typing import Any, Iterator, Optional

from sqlalchemy import Engine, FromClause, exc
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from .db import ensure_schema, make_engine, masked_url, storage_error, write_engine

__all__ = ["Database", "Repository"]


class Database:
    """One BASIS Lab database: its engine (schema at the newest revision), sessions and dialect.

    ``Database(url)`` opens the database at ``url`` with its schema at the newest revision
    (:func:`storage.db.make_engine`: created when empty, migrated when a SQLite file, refused
    when an older PostgreSQL one, which ``engine db upgrade`` migrates; ``create=False``
    refuses to make a new SQLite file); ``Database(engine=e)`` adopts an engine, by the same rule.
    """

    def __init__(self, url: Optional[str] = None, engine: Optional[Engine] = None, *, create: bool = True):
        if engine is None:
            engine = make_engine(url, create=create)
            # closed as the process exits (or when this is freed) if nobody closed it: SQLite
            # writes its log back into the file only when the file's last connection closes
            weakref.finalize(self, engine.dispose)
        else:  # an adopted engine is its owner's to dispose
            try:
                ensure_schema(engine)
            except exc.SQLAlchemyError as e:
                raise storage_error(e, f"cannot open database {masked_url(engine.url)}") from e
        self.engine: Engine = engine
        self.write_engine: Engine = write_engine(engine)
        self.dialect: str = engine.dialect.name  # "sqlite" or "postgresql"

    @property
    def url(self) -> str:
        """The database's URL with its secrets masked (:func:`storage.db.masked_url`)."""
        return masked_url(self.engine.url)

    @property
    def is_postgresql(self) -> bool:
        return self.dialect == "postgresql"

    @contextmanager
    def session(self, write: bool = False) -> Iterator[Session]:
        """A session in one transaction, committed when the block ends (rolled back when it
        raises).  ``write`` starts it on :attr:`write_engine` (SQLite: ``BEGIN IMMEDIATE``)."""
        try:
            with Session(self.write_engine if write else self.engine, expire_on_commit=False) as s, s.begin():
                yield s
        except exc.SQLAlchemyError as e:
            raise storage_error(e, f"database error on {self.url}") from e

    def insert(self, table: FromClause) -> Any:
        """``INSERT`` into ``table`` in this dialect's form, which offers ``on_conflict_do_nothing``."""
        return (postgresql if self.is_postgresql else sqlite).insert(table)

    def close(self) -> None:
        """Close every pooled connection (and so, for a SQLite file whose last connection this
        was, write its log back into the file). A database left open is closed as its process
        exits (one opened from a URL: an adopted engine is its owner's): a script's ``RunStore``
        or ``Lab`` leaves its file whole too."""
        self.engine.dispose()


class Repository:
    """A part of the store (runs, queue, metrics, …): every query it makes goes through ``db``."""

    def __init__(self, db: Database):
        self.db = db
