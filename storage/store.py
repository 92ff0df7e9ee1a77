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

Liveness policy (which worker is dead, when a heartbeat is stale) is not decided here:
storage offers the rows (:meth:`RunStore.active_runs_heartbeats`) and the primitive
(:meth:`RunStore.mark_interrupted`), and ``engine/runner/liveness.py`` decides.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Optional

from sqlalchemy import Engine, exc
from sqlalchemy.orm import Session

from .db import ensure_schema, make_engine, masked_url, storage_error, write_engine
from .diagnostics import DiagnosticsMixin
from .errors import RunNotFoundError  # noqa: F401
from .frames import FramesMixin
from .metrics import MetricsMixin
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


class RunStore(RunsMixin, QueueMixin, MetricsMixin, WorkersMixin, DiagnosticsMixin, ReportsMixin, FramesMixin,
               ViewsMixin):
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

    @contextmanager
    def _session(self, write: bool = False) -> Iterator[Session]:
        try:
            with Session(self._write if write else self._engine, expire_on_commit=False) as s, s.begin():
                yield s
        except exc.SQLAlchemyError as e:
            raise storage_error(e, f"database error on {self.url}") from e
