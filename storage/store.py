"""RunStore: every read and write of runs, metrics, workers, diagnostics, reports and saved views goes through here.

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
- ``store.campaigns``: campaigns of runs in stages, advanced exactly once (:mod:`storage.campaigns`);
- ``store.leases``: a worker's beat, its heartbeats written and its leases read back at once (:mod:`storage.lease`).

Each method uses its own short session (``with db.session(write) as s:``); write methods
take SQLite's write lock at BEGIN and wait up to the busy timeout for it.  A database error
becomes a one-line :class:`StorageError`; a transient one (locked, busy, serialization
failure, dropped connection) a :class:`DatabaseBusyError` that the caller may retry.

The store also answers each repository method by its name (``store.create_run(…)`` is
``store.runs.create_run(…)``), as before it had repositories; ``store.metrics(ids)`` reads
metric rows (``store.metrics.read``), ``store.eval_losses(ids, split="val")`` the per-batch
evaluation losses (``store.eval_losses.read``).

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

from typing import Any, Optional

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


class _Via:
    """A store attribute that is the repository ``repository``'s method of the same name
    (read from the class, a function of the store: ``RunStore.get_run(store, 1)``)."""

    def __init__(self, repository: str):
        self.repository = repository
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, store: Any, owner: Optional[type] = None) -> Any:
        if store is None:
            repository, name = self.repository, self.name

            def method(store: RunStore, *args: Any, **kwargs: Any) -> Any:
                return getattr(getattr(store, repository), name)(*args, **kwargs)

            method.__name__ = method.__qualname__ = name
            return method
        return getattr(getattr(store, self.repository), self.name)


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

    def identity(self) -> Identity:
        """This database's :class:`Identity` (:meth:`IdentityRepository.identity`)."""
        return self.identities.identity()

    # The repositories' methods by their names, as callers knew them before the split.
    create_run = _Via("runs")
    create_runs = _Via("runs")
    set_status = _Via("runs")
    heartbeat = _Via("runs")
    append_notes = _Via("runs")
    set_checkpoint_step = _Via("runs")
    run_lease = _Via("runs")
    set_device = _Via("runs")
    set_tags = _Via("runs")
    edit_tags = _Via("runs")
    request_cancel = _Via("runs")
    cancel_requested = _Via("runs")
    active_runs_heartbeats = _Via("runs")
    mark_interrupted = _Via("runs")
    get_run = _Via("runs")
    list_runs = _Via("runs")
    rename_run = _Via("runs")
    set_notes = _Via("runs")
    delete_run = _Via("runs")
    resolve_runs = _Via("runs")
    claim = _Via("queue")
    claim_next = _Via("queue")
    requeue = _Via("queue")
    touch_queued = _Via("queue")
    queued_owners = _Via("queue")
    release_queued = _Via("queue")
    adopt_queued = _Via("queue")
    add_metrics = _Via("metrics")
    delete_metrics_after = _Via("metrics")
    metrics_after = _Via("metrics")
    history_versions = _Via("metrics")
    final_metrics = _Via("metrics")
    metric_names = _Via("metrics")
    add_eval_losses = _Via("eval_losses")
    delete_eval_losses_after = _Via("eval_losses")
    register_worker = _Via("workers")
    worker_heartbeat = _Via("workers")
    end_worker = _Via("workers")
    list_workers = _Via("workers")
    create_diagnostic = _Via("diagnostics")
    claim_diagnostic = _Via("diagnostics")
    set_diagnostic_status = _Via("diagnostics")
    request_cancel_diagnostic = _Via("diagnostics")
    diagnostic_cancel_requested = _Via("diagnostics")
    running_diagnoses_heartbeats = _Via("diagnostics")
    delete_diagnostic = _Via("diagnostics")
    add_diagnostic_results = _Via("diagnostics")
    diagnostic_results = _Via("diagnostics")
    save_report = _Via("reports")
    list_reports = _Via("reports")
    get_report = _Via("reports")
    delete_report = _Via("reports")
    runs_frame = _Via("frames")
    workers_frame = _Via("frames")
    diagnostics_frame = _Via("frames")
    save_view = _Via("views")
    saved_views = _Via("views")
    delete_view = _Via("views")
    add_run_logs = _Via("logs")
    run_logs = _Via("logs")
    alerts_after = _Via("logs")
    last_log_id = _Via("logs")
