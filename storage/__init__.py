"""BASIS Lab storage: runs, metrics, workers, diagnostics and reports in SQLite (default) or PostgreSQL.

Where a change goes: a table's queries live in its repository module (``runs``, ``queue`` and
``lease`` for claims and leases, ``metrics``, ``eval_losses``, ``logs``, ``workers``,
``diagnostics``, ``campaigns``, ``reports``, ``views``, ``identity``), each over ``database``;
rows as records in ``records``, as pandas frames in ``frames``, metrics streamed or read
incrementally in ``stream`` and ``feed``; a new column is ``models`` plus a migration in
``migrations/versions`` (checked by ``schema_check``, applied by ``upgrade``); the limits both
the schema and the columns read in ``limits``, the error family in ``errors`` and ``family``;
files written from the database (exports, backups) in ``export``, ``backup`` and ``outputs``.

Knows nothing of JAX, Flax or Streamlit (layering: app -> engine -> storage).
See :mod:`storage.db` for where the database lives (``BASIS_LAB_DB_URL``, default
``~/.local/share/basis-lab/basis-lab.db``, PostgreSQL URLs) and how its schema is migrated
(Alembic, ``storage/migrations``), and :mod:`storage.feed` for reading metrics incrementally.
"""

from .database import Database
from .db import (
    BUSY_TIMEOUT_S,
    DEFAULT_DB_PATH,
    ENV_URL,
    MIGRATIONS_DIR,
    DatabaseBusyError,
    StorageError,
    ensure_schema,
    head_revision,
    make_engine,
    masked_url,
    resolve_url,
    schema_revision,
)
from .errors import DatabaseFullError, DatabaseUnreachableError, LeaseLostError
from .export import COLUMNS as CSV_COLUMNS
from .export import export_csv, long_frame, to_csv_bytes, wide_frame
from .family import BasisLabError, InvalidValueError, UserError
from .feed import MetricsFeed
from .logs import ALERT, LOG_LEVELS, LogLine
from .models import Base, Diagnostic, DiagnosticResult, EvalLosses, Metric, Report, Run, SavedView, Worker
from .store import (
    ACTIVE_STATUSES,
    DIAGNOSTIC_RESULT_COLUMNS,
    ENDED_STATUSES,
    RESUMABLE_STATUSES,
    RUN_STATUSES,
    WORKER_STATUSES,
    Lease,
    ReportRecord,
    RunNotFoundError,
    RunRecord,
    RunStore,
    WorkerRecord,
)

__all__ = [
    "ACTIVE_STATUSES",
    "ALERT",
    "LOG_LEVELS",
    "LogLine",
    "BUSY_TIMEOUT_S",
    "Base",
    "DEFAULT_DB_PATH",
    "DIAGNOSTIC_RESULT_COLUMNS",
    "Database",
    "DatabaseBusyError",
    "DatabaseFullError",
    "DatabaseUnreachableError",
    "Diagnostic",
    "DiagnosticResult",
    "ENDED_STATUSES",
    "ENV_URL",
    "EvalLosses",
    "BasisLabError",
    "InvalidValueError",
    "UserError",
    "Lease",
    "LeaseLostError",
    "MIGRATIONS_DIR",
    "Metric",
    "MetricsFeed",
    "RESUMABLE_STATUSES",
    "RUN_STATUSES",
    "Report",
    "ReportRecord",
    "Run",
    "RunNotFoundError",
    "RunRecord",
    "RunStore",
    "StorageError",
    "WORKER_STATUSES",
    "SavedView",
    "Worker",
    "WorkerRecord",
    "ensure_schema",
    "CSV_COLUMNS",
    "export_csv",
    "head_revision",
    "long_frame",
    "make_engine",
    "masked_url",
    "resolve_url",
    "schema_revision",
    "to_csv_bytes",
    "wide_frame",
]
