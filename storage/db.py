"""Database location, engine set-up and schema versioning for BASIS Lab.

Where the data lives
--------------------
The database URL is chosen in this order (see :func:`resolve_url`):

1. an explicit ``url`` argument (the CLI's ``--db``), then
2. the environment variable ``BASIS_LAB_DB_URL``, then
3. the SQLite file :data:`DEFAULT_DB_PATH` = ``~/.local/share/basis-lab/basis-lab.db``
   (its directory is created on first use).

Any SQLAlchemy URL works, e.g. ``sqlite:////abs/path/lab.db`` or PostgreSQL through
psycopg 3 (``pip install "psycopg[binary]"``)::

    export BASIS_LAB_DB_URL=postgresql+psycopg://user:pw@host:5432/basis_lab

A value without ``://`` is taken as the path of a SQLite file (``--db runs.db``).

SQLite settings
---------------
Every SQLite connection gets ``journal_mode=WAL`` (readers never block the writer),
``busy_timeout`` of :data:`BUSY_TIMEOUT_S` seconds (a writer waits for the lock instead of
failing with "database is locked"), ``foreign_keys=ON`` (deleting a run deletes its metrics)
and ``synchronous=NORMAL``.  SQLAlchemy emits ``BEGIN`` itself; write transactions run on
:func:`write_engine` and start with ``BEGIN IMMEDIATE`` so they take the write lock up front
(waiting on the busy timeout) rather than failing when upgrading a read snapshot.

Schema versions
---------------
The one-row table ``schema_version`` holds the version of the schema.  ``MIGRATIONS[n]``
upgrades a database from version ``n`` to ``n + 1``; :func:`ensure_schema` applies the
missing ones in order inside one transaction, so a failed migration leaves the database as
it was.  Version 0 is a database written before versioning (a ``runs`` table but no
``schema_version``).  To change the schema: edit ``models.py``, append a migration that does
the same change to an existing database, and bump nothing else (``SCHEMA_VERSION`` is
``len(MIGRATIONS)``).  Migrations only ever add; nothing here drops or rewrites stored runs,
and a database that cannot be opened is reported with :class:`StorageError`, never replaced.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from typing import Any, Callable, Optional

import sqlalchemy
from sqlalchemy import (
    JSON,
    Boolean,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    cast,
    delete,
    event,
    exc,
    inspect,
    insert,
    literal,
    select,
    update,
)
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.pool import StaticPool

from .models import Base, SchemaVersion, UTCDateTime

__all__ = [
    "DEFAULT_DB_PATH",
    "ENV_URL",
    "BUSY_TIMEOUT_S",
    "SCHEMA_VERSION",
    "MIGRATIONS",
    "StorageError",
    "resolve_url",
    "make_engine",
    "ensure_schema",
    "schema_version",
    "write_engine",
    "json_dumps",
]

DEFAULT_DB_PATH: pathlib.Path = pathlib.Path.home() / ".local" / "share" / "basis-lab" / "basis-lab.db"
ENV_URL = "BASIS_LAB_DB_URL"
BUSY_TIMEOUT_S = 30.0
FIX_HINT = f"set {ENV_URL} or pass --db to use another database"
_WRITE_OPTION = "basis_lab_write"
_SQLITE_MAGIC = b"SQLite format 3\x00"


class StorageError(RuntimeError):
    """The database cannot be opened or used; the message says how to fix it."""


# --------------------------------------------------------------------------- URLs


def resolve_url(url: Optional[str] = None) -> str:
    """Explicit ``url`` > ``$BASIS_LAB_DB_URL`` > ``sqlite:///`` + :data:`DEFAULT_DB_PATH`.

    A value without ``://`` is a SQLite file path (``~`` is expanded).
    """
    raw = (url or "").strip() or os.environ.get(ENV_URL, "").strip()
    if not raw:
        return f"sqlite:///{DEFAULT_DB_PATH}"
    if raw == ":memory:":
        return "sqlite://"
    if "://" not in raw:
        return f"sqlite:///{pathlib.Path(raw).expanduser().absolute()}"
    return raw


def _safe(url: Any) -> str:
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # malformed: show nothing that might be a password
        return "<malformed URL>"


def _is_memory(database: Optional[str]) -> bool:
    return database in (None, "", ":memory:") or "mode=memory" in (database or "")


def _check_sqlite_file(path: pathlib.Path) -> None:
    """Fail early, without touching anything, if ``path`` cannot hold our SQLite database."""
    if path.is_dir():
        raise StorageError(f"database path {path} is a directory; {FIX_HINT} (a file path such as {path / 'basis-lab.db'})")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise StorageError(
            f"cannot create the database directory {path.parent} ({e.strerror or e}); {FIX_HINT} "
            "pointing at a writable location"
        ) from e
    if path.exists():
        try:
            with open(path, "rb") as f:
                header = f.read(len(_SQLITE_MAGIC))
        except OSError as e:
            raise StorageError(f"cannot read the database file {path} ({e.strerror or e}); fix its permissions or {FIX_HINT}") from e
        if header and header != _SQLITE_MAGIC:
            raise StorageError(
                f"{path} is not a SQLite database (it was left untouched); {FIX_HINT}, or move that file away"
            )


# --------------------------------------------------------------------------- JSON


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "tolist"):  # numpy / jax scalars and arrays, without importing them
        return obj.tolist()
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    if isinstance(obj, (set, frozenset)):
        return sorted(obj, key=repr)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON serialisable")


def json_dumps(obj: Any) -> str:
    """``json.dumps`` that also accepts numpy-like scalars/arrays, paths, sets and dataclasses."""
    return json.dumps(obj, default=_json_default)


# --------------------------------------------------------------------------- engine


def _install_sqlite_hooks(engine: Engine, memory: bool) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # SQLAlchemy emits BEGIN (see _on_begin)
        cur = dbapi_conn.cursor()
        try:
            cur.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
            cur.execute("PRAGMA foreign_keys = ON")
            if not memory:
                cur.execute("PRAGMA journal_mode = WAL")
                cur.execute("PRAGMA synchronous = NORMAL")
        finally:
            cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        write = conn.get_execution_options().get(_WRITE_OPTION, False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")


def write_engine(engine: Engine) -> Engine:
    """The same engine (same pool) whose transactions take the SQLite write lock at BEGIN."""
    return engine.execution_options(**{_WRITE_OPTION: True})


def make_engine(url: Optional[str] = None) -> Engine:
    """Open (creating or migrating if needed) the BASIS Lab database; raise :class:`StorageError`."""
    resolved = resolve_url(url)
    try:
        u = make_url(resolved)
    except exc.ArgumentError as e:
        raise StorageError(
            f"malformed database URL {resolved!r}; {FIX_HINT} with a URL like "
            "sqlite:////abs/path/lab.db or postgresql+psycopg://user:pw@host/db"
        ) from e
    kwargs: dict[str, Any] = {"json_serializer": json_dumps}
    is_sqlite = u.get_backend_name() == "sqlite"
    memory = is_sqlite and _is_memory(u.database)
    if is_sqlite:
        kwargs["connect_args"] = {"timeout": BUSY_TIMEOUT_S, "check_same_thread": False}
        if memory:
            kwargs["poolclass"] = StaticPool  # one shared in-memory database
        else:
            path = pathlib.Path(u.database).expanduser().absolute()
            _check_sqlite_file(path)
            u = u.set(database=str(path))
    try:
        engine = sqlalchemy.create_engine(u, **kwargs)
    except (exc.ArgumentError, exc.NoSuchModuleError, ImportError) as e:
        raise StorageError(
            f"cannot use database URL {_safe(u)} ({e}); install its driver "
            f'(PostgreSQL: pip install "psycopg[binary]") or {FIX_HINT}'
        ) from e
    if is_sqlite:
        _install_sqlite_hooks(engine, memory)
    try:
        ensure_schema(engine)
    except exc.SQLAlchemyError as e:
        engine.dispose()
        reason = getattr(e, "orig", None) or e
        raise StorageError(f"cannot open database {_safe(u)} ({reason}); {FIX_HINT}") from e
    except BaseException:
        engine.dispose()
        raise
    return engine


# --------------------------------------------------------------------------- schema


def _read_version(conn: Connection) -> Optional[int]:
    """Schema version of the database on ``conn``: None if it has none of our tables."""
    tables = set(inspect(conn).get_table_names())
    if "schema_version" in tables:
        v = conn.execute(select(sqlalchemy.func.max(SchemaVersion.version))).scalar()
        if v is not None:
            return int(v)
    return 0 if "runs" in tables else None


def schema_version(engine: Engine) -> Optional[int]:
    """The schema version recorded in the database (None for an empty database)."""
    with engine.connect() as conn:
        return _read_version(conn)


def ensure_schema(engine: Engine) -> int:
    """Create the schema in an empty database or migrate an older one; return the version."""
    with engine.connect() as conn:  # cheap read-only check first: no write lock when current
        version = _read_version(conn)
    if version == SCHEMA_VERSION:
        return version
    if version is not None and version > SCHEMA_VERSION:
        raise StorageError(
            f"database {_safe(engine.url)} has schema version {version}, newer than this BASIS Lab "
            f"({SCHEMA_VERSION}); upgrade BASIS Lab or {FIX_HINT}"
        )
    with write_engine(engine).begin() as conn:  # one transaction: all migrations or none
        version = _read_version(conn)  # re-check under the write lock
        if version is None:
            Base.metadata.create_all(conn)
        elif version < SCHEMA_VERSION:
            for n, migrate in enumerate(MIGRATIONS[version:SCHEMA_VERSION], start=version):
                try:
                    migrate(conn)
                except StorageError:
                    raise
                except Exception as e:  # rolled back by the enclosing transaction
                    raise StorageError(
                        f"migrating database {_safe(engine.url)} from schema version {n} to {n + 1} failed "
                        f"({e}); the database was left unchanged; report this bug or {FIX_HINT}"
                    ) from e
        if version != SCHEMA_VERSION:
            conn.execute(delete(SchemaVersion))
            conn.execute(insert(SchemaVersion).values(version=SCHEMA_VERSION))
    return SCHEMA_VERSION


# ---- migration 0 -> 1: adopt a database written before schema versioning ----------------
# Frozen copy of the version-1 schema: later migrations must not change what this one does.


def _v1_tables() -> dict[str, Table]:
    md = MetaData()
    runs = Table(
        "runs", md,
        Column("id", Integer, primary_key=True),
        Column("name", String(200), index=True),
        Column("status", String(16), index=True),
        Column("created_at", UTCDateTime),
        Column("started_at", UTCDateTime),
        Column("finished_at", UTCDateTime),
        Column("heartbeat_at", UTCDateTime),
        Column("config", JSON),
        Column("estimator", String(64), index=True),
        Column("rank", Integer, index=True),
        Column("lam", Float, index=True),
        Column("seed", Integer, index=True),
        Column("preset", String(64), index=True),
        Column("steps", Integer, index=True),
        Column("steps_done", Integer),
        Column("error", Text),
        Column("notes", Text),
        Column("versions", JSON),
        Column("git_commit", String(64)),
        Column("device", String(200)),
        Column("owner", String(255)),
        Column("cancel_requested", Boolean),
    )
    metrics = Table(
        "metrics", md,
        Column("id", Integer, primary_key=True),
        Column("run_id", Integer, ForeignKey("runs.id", ondelete="CASCADE")),
        Column("step", Integer),
        Column("wall_time", Float),
        Column("name", String(64)),
        Column("value", Float),
        Index("ix_metrics_run_id_id", "run_id", "id"),
        Index("ix_metrics_run_id_name_step", "run_id", "name", "step"),
        sqlite_autoincrement=True,
    )
    version = Table("schema_version", md, Column("version", Integer, primary_key=True, autoincrement=False))
    return {"runs": runs, "metrics": metrics, "schema_version": version}


def _migrate_0_to_1(conn: Connection) -> None:
    """Add the version-1 columns, tables and indexes that a pre-versioning database lacks.

    Existing rows are kept; new columns are filled with neutral values (status ``finished``,
    empty config/notes, no cancel request).
    """
    tables = _v1_tables()
    insp = inspect(conn)
    existing = set(insp.get_table_names())
    quote = conn.dialect.identifier_preparer.quote
    for tname in ("runs", "metrics"):
        table = tables[tname]
        if tname not in existing:
            table.create(conn)
            continue
        have = {c["name"] for c in insp.get_columns(tname)}
        needed = {"runs": {"id"}, "metrics": {"id", "run_id"}}[tname]
        if not needed <= have:
            raise StorageError(
                f"the database has a {tname!r} table that BASIS Lab did not create (no {sorted(needed - have)} "
                f"column); it was left untouched; {FIX_HINT}"
            )
        for col in table.columns:
            if col.name not in have:
                ddl = col.type.compile(dialect=conn.dialect)
                conn.exec_driver_sql(f"ALTER TABLE {quote(tname)} ADD COLUMN {quote(col.name)} {ddl}")
        have_ix = {ix["name"] for ix in insp.get_indexes(tname)}
        for ix in table.indexes:
            if ix.name not in have_ix:
                ix.create(conn)
    runs = tables["runs"]
    backfill = {
        "name": literal("run-") + cast(runs.c.id, String),
        "status": "finished",
        "config": {},
        "versions": {},
        "notes": "",
        "steps_done": 0,
        "cancel_requested": False,
    }
    for name, value in backfill.items():
        conn.execute(update(runs).where(runs.c[name].is_(None)).values({name: value}))
    tables["schema_version"].create(conn, checkfirst=True)


MIGRATIONS: list[Callable[[Connection], None]] = [_migrate_0_to_1]
SCHEMA_VERSION: int = len(MIGRATIONS)
