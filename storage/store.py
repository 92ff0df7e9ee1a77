"""RunStore: every read and write of runs, metrics, workers, diagnostics, reports and saved views goes through here.

Each method uses its own short session (``with Session(engine) as s, s.begin():``); write
methods run on :func:`storage.db.write_engine`, so on SQLite they take the write lock at
BEGIN and wait up to the busy timeout for it.  A database error becomes a one-line
:class:`StorageError`; a transient one (locked, busy, serialization failure, dropped
connection) a :class:`DatabaseBusyError` that the caller may retry.

Metric ids only grow (AUTOINCREMENT on SQLite, a sequence on PostgreSQL), and
:meth:`RunStore.add_metrics` locks its run's row first, so the writers of one run commit
their rows in id order on every backend (SQLite commits all writers one at a time anyway).
Writers of different runs may commit out of order on PostgreSQL, so an incremental reader
keeps one high-water mark per run: :class:`storage.feed.MetricsFeed`.

Identity: :meth:`RunStore.identity` is this database's (``models.DatabaseIdentity``) and
the identities its contents had before it was copied (``models.DatabaseLineage``); a
backup's first use gives it its own.

Liveness policy (which worker is dead, when a heartbeat is stale) is not decided here:
storage offers the rows (:meth:`RunStore.active_runs_heartbeats`) and the primitive
(:meth:`RunStore.mark_interrupted`), and ``engine/runner/liveness.py`` decides.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Optional

from sqlalchemy import Engine, exc, insert, select
from sqlalchemy.orm import Session

from .db import ensure_schema, make_engine, masked_url, storage_error, write_engine
from .diagnostics import DiagnosticsMixin
from .errors import RunNotFoundError, StorageError  # noqa: F401
from .frames import FramesMixin
from .logs import LogsMixin
from .metrics import MetricsMixin
from .models import DatabaseIdentity, DatabaseLineage, new_uid
from .queue import Lease, QueueMixin  # noqa: F401
from .records import (  # noqa: F401  (the store's public names, as before the split)
    ACTIVE_STATUSES,
    DIAGNOSTIC_RESULT_COLUMNS,
    ENDED_STATUSES,
    LAST_METRICS,
    METRIC_COLUMNS,
    RESUMABLE_STATUSES,
    RUN_STATUSES,
    SCALAR_FIELDS,
    WORKER_STATUSES,
    RunRecord,
    WorkerRecord,
    empty_metrics_frame,
)
from .reports import ReportRecord, ReportsMixin  # noqa: F401
from .runs import RunsMixin
from .views import ViewsMixin
from .workers import WorkersMixin


@dataclass(frozen=True)
class Identity:
    """A database's identity: ``uid``, its own, and ``lineage``, every identity its
    contents have had, oldest first, ``uid`` last (a database never copied: ``(uid,)``)."""

    uid: str
    lineage: tuple[str, ...]

    @property
    def ancestors(self) -> tuple[str, ...]:
        """The databases this one was copied from, the nearest first."""
        return tuple(reversed(self.lineage[:-1]))


class RunStore(RunsMixin, QueueMixin, MetricsMixin, WorkersMixin, DiagnosticsMixin, ReportsMixin, FramesMixin,
               ViewsMixin, LogsMixin):
    """Runs, metrics, workers, diagnostics, reports and saved views in the BASIS Lab database (see :mod:`storage.db`).

    ``create=False`` refuses to make a new SQLite file (for commands that only read).
    """

    def __init__(self, url: Optional[str] = None, engine: Optional[Engine] = None, *, create: bool = True):
        if engine is None:
            engine = make_engine(url, create=create)
        else:
            try:
                ensure_schema(engine)
            except exc.SQLAlchemyError as e:
                raise storage_error(e, f"cannot open database {masked_url(engine.url)}") from e
        self._engine = engine
        self._write = write_engine(engine)
        self._pg = engine.dialect.name == "postgresql"
        self._identity: Optional[Identity] = None

    @property
    def engine(self) -> Engine:
        return self._engine

    @property
    def url(self) -> str:
        return masked_url(self._engine.url)

    def __repr__(self) -> str:
        return f"RunStore({self.url!r})"

    def close(self) -> None:
        self._engine.dispose()

    def identity(self) -> Identity:
        """This database's :class:`Identity`. A database without one (a backup, which
        leaves its original's out) gets a new one now, appended to the lineage it was
        copied with; processes that ask at once agree on one."""
        if self._identity is None:
            self._identity = self._read_identity() or self._make_identity()
        return self._identity

    def _read_identity(self) -> Optional[Identity]:
        with self._session() as s:
            uid = s.execute(select(DatabaseIdentity.uid).where(DatabaseIdentity.id == 1)).scalar()
            lineage = s.execute(select(DatabaseLineage.uid).order_by(DatabaseLineage.id)).scalars().all()
        if uid is None:
            return None
        return Identity(uid, tuple(u for u in lineage if u != uid) + (uid,))

    def _make_identity(self) -> Identity:
        try:
            with self._session(write=True) as s:
                if s.execute(select(DatabaseIdentity.id).where(DatabaseIdentity.id == 1).with_for_update()).first() is None:
                    uid = new_uid()
                    s.execute(insert(DatabaseIdentity), [{"id": 1, "uid": uid}])
                    s.execute(insert(DatabaseLineage), [{"uid": uid}])
        except StorageError:
            if self._read_identity() is None:  # not another process that made it first
                raise
        found = self._read_identity()
        if found is None:
            raise StorageError(f"the identity of {self.url} could not be stored; check that the database is writable")
        return found

    @contextmanager
    def _session(self, write: bool = False) -> Iterator[Session]:
        try:
            with Session(self._write if write else self._engine, expire_on_commit=False) as s, s.begin():
                yield s
        except exc.SQLAlchemyError as e:
            raise storage_error(e, f"database error on {self.url}") from e
