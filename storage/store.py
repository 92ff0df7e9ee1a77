"""RunStore: the BASIS Lab database and the repositories every read and write goes through.

The store is one :class:`storage.database.Database` (engine, sessions, dialect) and the
repositories over it, each a class that is handed the database and holds nothing else
it does not declare:

- ``store.runs``: the run lifecycle and edits: create, status, heartbeat, tags, notes (:mod:`storage.runs`);
- ``store.queue``: claims, requeue, queued-run ownership (:mod:`storage.queue`);
- ``store.metrics``: metric rows: appends, reads, truncation on resume (:mod:`storage.metrics`);
- ``store.eval_losses``: the per-batch losses of every evaluation of a run (:mod:`storage.eval_losses`);
- ``store.workers``: worker registration and heartbeats (:mod:`storage.workers`);
- ``store.diagnostics``: estimator diagnoses and their result rows (:mod:`storage.diagnostics`);
- ``store.reports``: stored reports (:mod:`storage.reports`);
- ``store.frames``: pandas frames of runs, workers and diagnoses (:mod:`storage.frames`);
- ``store.views``: saved Compare views (:mod:`storage.views`);
- ``store.identities``: the database's identity and lineage (:mod:`storage.identity`);
- ``store.logs``: each run's console lines and alerts (:mod:`storage.logs`);
- ``store.campaigns``: campaigns of runs in stages, advanced exactly once (:mod:`storage.campaigns`);
- ``store.leases``: a worker's beat, its heartbeats written and its leases read back at once (:mod:`storage.lease`).

Each method uses its own short session (``with db.session(write) as s:``); write methods
take SQLite's write lock at BEGIN and wait up to the busy timeout for it.  A database error
becomes a one-line :class:`StorageError`; a transient one (locked, busy, serialization
failure, dropped connection) a :class:`DatabaseBusyError` that the caller may retry.

RunStore holds no query of its own and no by-name delegate: a caller names the repository
(``store.runs.create_run(…)``, ``store.queue.claim_next(…)``, ``store.metrics.add_metrics(…)``,
``store.identities.identity()``), and a new query is a method of its repository.
``store.metrics(ids)`` reads metric rows (``store.metrics.read``), ``store.eval_losses(ids,
split="val")`` the per-batch evaluation losses (``store.eval_losses.read``).

Metric ids only grow (AUTOINCREMENT on SQLite, a sequence on PostgreSQL), and
``add_metrics`` locks its run's row first, so the writers of one run commit their rows in id
order on every backend (SQLite commits all writers one at a time anyway).  Writers of
different runs may commit out of order on PostgreSQL, so an incremental reader keeps one
high-water mark per run: :class:`storage.feed.MetricsFeed`.

Liveness policy (which worker is dead, when a heartbeat is stale) is not decided here:
storage offers the rows (``active_runs_heartbeats``) and the primitive (``mark_interrupted``),
and ``engine/runner/liveness.py`` decides.
"""

from __future__ import annotations

from typing import Optional

from sqlalchemy import Engine

from .campaigns import CampaignsRepository
from .database import Database
from .diagnostics import DiagnosticsRepository
from .errors import RunNotFoundError, StorageError  # noqa: F401
from .eval_losses import EvalLossesRepository
from .frames import FramesRepository
from .identity import Identity, IdentityRepository
from .lease import LeasesRepository
from .logs import LogsRepository
from .metrics import MetricsRepository
from .queue import Lease, QueueRepository  # noqa: F401
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
from .reports import ReportRecord, ReportsRepository  # noqa: F401
from .runs import RunsRepository
from .views import ViewsRepository
from .workers import WorkersRepository

__all__ = ["RunStore", "Identity"]


class RunStore:
    """Runs, metrics, workers, diagnostics, reports and saved views in the BASIS Lab database (see :mod:`storage.db`).

    ``create=False`` refuses to make a new SQLite file (for commands that only read).
    """

    def __init__(self, url: Optional[str] = None, engine: Optional[Engine] = None, *, create: bool = True):
        self.db = Database(url, engine, create=create)
        self.runs = RunsRepository(self.db)
        self.queue = QueueRepository(self.db)
        self.metrics = MetricsRepository(self.db)
        self.eval_losses = EvalLossesRepository(self.db)
        self.workers = WorkersRepository(self.db)
        self.diagnostics = DiagnosticsRepository(self.db)
        self.reports = ReportsRepository(self.db)
        self.frames = FramesRepository(self.db, self.workers)
        self.views = ViewsRepository(self.db)
        self.identities = IdentityRepository(self.db)
        self.logs = LogsRepository(self.db)
        self.campaigns = CampaignsRepository(self.db)
        self.leases = LeasesRepository(self.db)  # a worker's one beat (:mod:`storage.lease`)

    @property
    def engine(self) -> Engine:
        return self.db.engine

    @property
    def url(self) -> str:
        return self.db.url

    def __repr__(self) -> str:
        return f"RunStore({self.url!r})"

    def close(self) -> None:
        self.db.close()
