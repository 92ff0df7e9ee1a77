"""BASIS Lab storage: runs and metrics in SQLite (default) or any SQLAlchemy database.

Knows nothing of JAX, Flax or Streamlit (layering: app -> engine -> storage).
See :mod:`storage.db` for where the database lives (``BASIS_LAB_DB_URL``, default
``~/.local/share/basis-lab/basis-lab.db``, PostgreSQL URLs) and how its schema is versioned.
"""

from .db import (
    BUSY_TIMEOUT_S,
    DEFAULT_DB_PATH,
    ENV_URL,
    MIGRATIONS,
    SCHEMA_VERSION,
    StorageError,
    ensure_schema,
    make_engine,
    resolve_url,
    schema_version,
)
from .export import export_csv, long_frame, to_csv_bytes, wide_frame
from .models import Base, Metric, Run
from .store import (
    ACTIVE_STATUSES,
    ENDED_STATUSES,
    RUN_STATUSES,
    RunNotFoundError,
    RunRecord,
    RunStore,
    current_owner,
    pid_alive,
)

__all__ = [
    "ACTIVE_STATUSES",
    "BUSY_TIMEOUT_S",
    "Base",
    "DEFAULT_DB_PATH",
    "ENDED_STATUSES",
    "ENV_URL",
    "MIGRATIONS",
    "Metric",
    "RUN_STATUSES",
    "Run",
    "RunNotFoundError",
    "RunRecord",
    "RunStore",
    "SCHEMA_VERSION",
    "StorageError",
    "current_owner",
    "ensure_schema",
    "export_csv",
    "long_frame",
    "make_engine",
    "pid_alive",
    "resolve_url",
    "schema_version",
    "to_csv_bytes",
    "wide_frame",
]
