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
The schema is migrated by Alembic; its environment and revisions live inside this package
(``storage/migrations``, found through :data:`MIGRATIONS_DIR`, so no ``alembic.ini`` and any
working directory will do).  :func:`make_engine` brings a database to the newest revision
before handing it out (:func:`ensure_schema`), where that is the process's to do:

- an empty database (no table) gets the whole schema, on SQLite and on PostgreSQL;
- a SQLite file at an older revision (a file the lab owns, which one user's processes share) is
  first backed up beside itself (``lab.db.before-<head>.db``, :mod:`storage.backup`) and then
  migrated, with no command to run;
- a PostgreSQL database at an older revision (shared: every process of every user opens it)
  is refused with one line naming ``python -m engine db upgrade --db URL``
  (:class:`~storage.errors.SchemaBehindError`), which backs it up and migrates it
  (:mod:`storage.upgrade`; ``engine db current`` says where a database stands).

Each upgrade runs in one transaction (a failed upgrade leaves the database as it was, and its
backup is removed), under SQLite's write lock (``BEGIN IMMEDIATE``) or a PostgreSQL advisory
lock, so processes opening the database at once upgrade it once.  A
database written before Alembic (with the old one-row ``schema_version`` table, or from before
any versioning) is adopted by revision ``0001`` and upgraded in place, keeping every run and
metric.  A database at a revision this code does not know (written by a newer BASIS Lab) is
refused untouched, and so is one whose ``alembic_version`` names the newest revision while it
lacks a table or column of the models (:mod:`storage.schema_check`).  To change the schema:
edit ``models.py`` and add a revision under ``storage/migrations/versions`` that does the same
to a stored database (a test compares them).  Revisions never drop stored runs nor rewrite
what they hold, but for text that UTF-8 cannot encode (revision 0011 writes each such byte as
its escape), and a database that cannot be opened is reported with :class:`StorageError`,
never replaced.

Stored JSON is read through :func:`json_loads`: a string holding a lone surrogate (stored
before the UTF-8 check) comes back with it escaped, never as text no file or page can hold.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import re
import urllib.parse
import zlib
from typing import Any, Callable, Optional, cast

import sqlalchemy
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy import event, exc, inspect
from sqlalchemy.engine import Connection, CursorResult, Engine, Result, make_url
from sqlalchemy.pool import StaticPool

from .errors import (  # noqa: F401  (db's names before errors.py existed)
    ENV_URL,
    FIX_HINT,
    DatabaseBusyError,
    SchemaBehindError,
    SchemaNewerError,
    StorageError,
    storage_error,
)
from .limits import as_utf8_value, has_surrogate_escape
from .schema_check import check_models

__all__ = [
    "DEFAULT_DB_PATH",
    "ENV_URL",
    "BUSY_TIMEOUT_S",
    "MIGRATIONS_DIR",
    "StorageError",
    "DatabaseBusyError",
    "resolve_url",
    "masked_url",
    "make_engine",
    "open_engine",
    "ensure_schema",
    "head_revision",
    "schema_revision",
    "storage_error",
    "write_engine",
    "json_dumps",
    "json_loads",
]

DEFAULT_DB_PATH: pathlib.Path = pathlib.Path.home() / ".local" / "share" / "basis-lab" / "basis-lab.db"
BUSY_TIMEOUT_S = 30.0
CONNECT_TIMEOUT_S = 10  # PostgreSQL: seconds to reach the server (libpq's connect_timeout), unless the URL sets it
_WRITE_OPTION = "basis_lab_write"
_SQLITE_MAGIC = b"SQLite format 3\x00"


MIGRATIONS_DIR: pathlib.Path = pathlib.Path(__file__).parent / "migrations"
_PG_LOCK_KEY = zlib.crc32(b"basis-lab schema upgrade")  # advisory lock taken around upgrades


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


_SECRET_KEY = re.compile(r"pass|pwd|secret|token", re.IGNORECASE)  # query keys whose values are secrets
_USERINFO = re.compile(r"(://[^/?#]*?:)[^/?#]*(@)")  # ://user:PASSWORD@ (up to the last @ of the authority)
_SECRET_PARAM = re.compile(r"([?&;][^=&;#]*(?:pass|pwd|secret|token)[^=&;#]*=)[^&;#]*", re.IGNORECASE)


def masked_url(url: Any) -> str:
    """``url`` (a string or SQLAlchemy URL) as it may be shown or printed: the password of
    ``user:password@`` and the value of every query parameter named like a secret
    (``?password=``, ``sslpassword``, ``token`` …) replaced by ``***``. The one masking
    of database URLs: the CLI, the dashboard and every error message use it. A URL
    SQLAlchemy cannot parse is masked by pattern, so its secrets never show either."""
    try:
        u = url if isinstance(url, sqlalchemy.engine.URL) else make_url(str(url))
    except (exc.ArgumentError, ValueError, TypeError):  # malformed: mask by pattern what might be a secret
        return _SECRET_PARAM.sub(r"\1***", _USERINFO.sub(r"\1***\2", str(url)))
    base = u.set(query={}).render_as_string(hide_password=True)
    pairs = [(k, "***" if _SECRET_KEY.search(k) else v) for k, vs in u.query.items()
             for v in ((vs,) if isinstance(vs, str) else vs)]
    return f"{base}?{urllib.parse.urlencode(pairs, safe='*/:,')}" if pairs else base


def _is_memory(database: Optional[str]) -> bool:
    return database in (None, "", ":memory:") or "mode=memory" in (database or "")


def _check_sqlite_file(path: pathlib.Path, create: bool) -> None:
    """Fail early, without touching anything, if ``path`` cannot hold our SQLite database.

    With ``create`` False a missing file is an error and nothing (file or directory) is made.
    """
    if path.is_dir():
        raise StorageError(f"database path {path} is a directory; {FIX_HINT} (a file path such as {path / 'basis-lab.db'})")
    if not create and not path.exists():
        raise StorageError(f"no database at {path}; check the path or set {ENV_URL} (or --db)")
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
        if not os.access(path, os.W_OK):
            raise StorageError(f"the database file {path} is read-only; make it writable (chmod u+w) or {FIX_HINT}")
    if not os.access(path.parent, os.W_OK | os.X_OK):
        raise StorageError(
            f"the database directory {path.parent} is not writable (SQLite keeps its -wal and -shm files there); "
            f"make it writable or {FIX_HINT}"
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


def json_loads(text: "str | bytes") -> Any:
    """A stored JSON value (every JSON column is read through this): ``json.loads``, and
    where the text escapes a UTF-16 surrogate (``\\udcfe``) every string that UTF-8 cannot
    encode (a lone surrogate, stored by a version before the UTF-8 check) gets that escape
    as visible text (:func:`storage.limits.as_utf8_value`), so no reader, CSV or page fails
    on it. Text without such an escape costs one search."""
    value = json.loads(text)
    return as_utf8_value(value) if has_surrogate_escape(text) else value


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


def make_engine(url: Optional[str] = None, *, create: bool = True) -> Engine:
    """Open the BASIS Lab database with its schema at the newest revision (:func:`ensure_schema`:
    created in an empty database, migrated in a SQLite file, refused in an older PostgreSQL one).

    With ``create`` False a SQLite file that does not exist is an error (read-only commands
    must not make an empty database at a mistyped path).  Raises :class:`StorageError`.
    """
    engine = open_engine(url, create=create)
    try:
        ensure_schema(engine)
    except exc.SQLAlchemyError as e:
        engine.dispose()
        raise storage_error(e, f"cannot open database {masked_url(engine.url)}", FIX_HINT) from e
    except BaseException:
        engine.dispose()
        raise
    return engine


def open_engine(url: Optional[str] = None, *, create: bool = True) -> Engine:
    """The engine of the database at ``url`` (:func:`resolve_url`) with BASIS Lab's settings,
    its schema neither read nor changed (:func:`make_engine` does both)."""
    resolved = resolve_url(url)
    try:
        u = make_url(resolved)
    except (exc.ArgumentError, ValueError) as e:  # ValueError: a port that is not a number
        raise StorageError(
            f"malformed database URL {masked_url(resolved)!r}; {FIX_HINT} with a URL like "
            "sqlite:////abs/path/lab.db or postgresql+psycopg://user:pw@host/db"
        ) from e
    kwargs: dict[str, Any] = {"json_serializer": json_dumps, "json_deserializer": json_loads}
    is_sqlite = u.get_backend_name() == "sqlite"
    memory = is_sqlite and _is_memory(u.database)
    if is_sqlite:
        kwargs["connect_args"] = {"timeout": BUSY_TIMEOUT_S, "check_same_thread": False}
        if memory:
            kwargs["poolclass"] = StaticPool  # one shared in-memory database
        else:
            path = pathlib.Path(str(u.database)).expanduser().absolute()
            _check_sqlite_file(path, create)
            u = u.set(database=str(path))
    else:
        kwargs["pool_pre_ping"] = True  # a server restart must not fail the next write
        if u.get_backend_name() == "postgresql" and "connect_timeout" not in u.query:
            kwargs["connect_args"] = {"connect_timeout": CONNECT_TIMEOUT_S}  # a dead server hangs no thread
    try:
        engine = sqlalchemy.create_engine(u, **kwargs)
    except (exc.ArgumentError, exc.NoSuchModuleError, ImportError) as e:
        raise StorageError(
            f"cannot use database URL {masked_url(u)} ({e}); install its driver "
            f'(PostgreSQL: pip install "psycopg[binary]") or {FIX_HINT}'
        ) from e
    if is_sqlite:
        _install_sqlite_hooks(engine, memory)
    return engine


def rowcount(result: Result[Any]) -> int:
    """How many rows an ``UPDATE`` or ``DELETE`` matched.  ``Session.execute`` is typed as returning
    a ``Result``; for those statements it is a ``CursorResult``, which counts them."""
    return cast(CursorResult[Any], result).rowcount


# --------------------------------------------------------------------------- schema


def _alembic_config(connection: Optional[Connection] = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.attributes["connection"] = connection
    return cfg


def _scripts() -> ScriptDirectory:
    return ScriptDirectory.from_config(_alembic_config())


def head_revision() -> str:
    """The newest Alembic revision this code knows: every database is upgraded to it."""
    head = _scripts().get_current_head()
    assert head is not None, f"{MIGRATIONS_DIR} holds no revision"
    return head


def _read_revision(conn: Connection) -> Optional[str]:
    return MigrationContext.configure(conn).get_current_revision()


def schema_revision(engine: Engine) -> Optional[str]:
    """The Alembic revision recorded in the database (None before its first upgrade)."""
    with engine.connect() as conn:
        return _read_revision(conn)


def _legacy_version(conn: Connection) -> Optional[int]:
    """The pre-Alembic ``schema_version`` of the database, if it has that table."""
    if "schema_version" not in inspect(conn).get_table_names():
        return None
    v = conn.exec_driver_sql("SELECT max(version) FROM schema_version").scalar()
    return None if v is None else int(v)


def _refuse_newer(engine: Engine, conn: Connection, revision: Optional[str]) -> None:
    """Raise :class:`SchemaNewerError` (touching nothing) if a newer BASIS Lab wrote the database."""
    if revision is not None:
        try:
            known = _scripts().get_revision(revision) is not None
        except CommandError:
            known = False
        if not known:
            raise SchemaNewerError(
                f"database {masked_url(engine.url)} has schema revision {revision!r}, newer than this BASIS Lab "
                f"(newest known {head_revision()!r}); nothing was written: upgrade BASIS Lab or {FIX_HINT}"
            )
        return
    legacy = _legacy_version(conn)
    if legacy is not None and legacy > 1:
        raise SchemaNewerError(
            f"database {masked_url(engine.url)} has schema version {legacy}, newer than this BASIS Lab (1); "
            f"nothing was written: upgrade BASIS Lab or {FIX_HINT}"
        )


# Called under the upgrade's lock with the revision being left (None: before Alembic), before any
# revision runs; returns the backup it wrote (removed again if the upgrade fails), or None.
BeforeUpgrade = Callable[[Engine, Optional[str]], Optional[pathlib.Path]]


def _may_upgrade(engine: Engine, conn: Connection, revision: Optional[str], before: Optional[BeforeUpgrade]) -> bool:
    """Whether ``conn``'s database, not at the head ``revision``, may be brought there now;
    raises (touching nothing) where it may not.  The rule: a newer schema is refused
    (:func:`_refuse_newer`); an empty database (no table) is created at head on every backend;
    an older one is upgraded where the upgrade is explicit (``before`` given) or the database is
    a SQLite file or in-memory database this process owns, and refused on PostgreSQL, whose
    database is shared (:class:`SchemaBehindError`, naming ``engine db upgrade``).  True: it has
    tables, so the upgrade is a migration (and gets its backup)."""
    _refuse_newer(engine, conn, revision)
    if not inspect(conn).get_table_names():
        return False
    if before is None and conn.dialect.name != "sqlite":
        raise SchemaBehindError(masked_url(engine.url), revision or "none (before Alembic)", head_revision())
    return True


def _upgrade(engine: Engine, conn: Connection, head: str, before: Optional[BeforeUpgrade]) -> None:
    """Run the missing revisions on ``conn`` (inside its transaction, under the lock), then
    check the result against the models (a mismatch rolls every revision back).  A migration
    of stored tables is preceded by ``before`` (or, automatic, :func:`_backup_beside` on a
    SQLite file); its backup is removed when the upgrade fails, as nothing changed."""
    revision = _read_revision(conn)  # re-check under the lock: another process may have done it
    if revision == head:
        check_models(conn, masked_url(engine.url), head)
        return
    stored = _may_upgrade(engine, conn, revision, before)
    backup = (before or _backup_beside)(engine, revision) if stored else None
    try:
        _run_revisions(engine, conn, revision, head)
        check_models(conn, masked_url(engine.url), f"{revision or 'none'} (upgraded here to {head})")
    except BaseException:
        if backup is not None:
            backup.unlink(missing_ok=True)
        raise


def _backup_beside(engine: Engine, revision: Optional[str]) -> Optional[pathlib.Path]:
    """The automatic migration's backup of a SQLite file: ``<file>.before-<head>.db`` beside it
    (:func:`storage.backup.backup`; replaced if there); none for an in-memory database."""
    from .backup import backup_url

    if _is_memory(engine.url.database):
        return None
    source = pathlib.Path(str(engine.url.database))
    return backup_url(engine.url, source.with_name(f"{source.name}.before-{head_revision()}.db"), force=True).path


def _run_revisions(engine: Engine, conn: Connection, revision: Optional[str], head: str) -> None:
    """``alembic upgrade head`` on ``conn``; a failure is a StorageError saying nothing changed."""
    try:
        command.upgrade(_alembic_config(conn), "head")
        if conn.dialect.name == "sqlite":
            broken = conn.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
            if broken:
                raise RuntimeError(f"{len(broken)} rows would point at missing rows, e.g. {tuple(broken[0])}")
    except StorageError:
        raise
    except (exc.SQLAlchemyError, CommandError, RuntimeError, OSError, ValueError, LookupError, TypeError) as e:
        # a migration that failed (rolled back by the enclosing transaction)
        raise StorageError(
            f"upgrading database {masked_url(engine.url)} from schema revision {revision or 'none'} to {head} failed "
            f"({e}); the database was left unchanged; report this bug or {FIX_HINT}"
        ) from e


def ensure_schema(engine: Engine, *, before: Optional[BeforeUpgrade] = None) -> str:
    """Bring the database to the newest revision where :func:`_may_upgrade` allows it; return the revision.

    Automatic (``before`` None, every open): an empty database gets the schema, a SQLite file
    at an older revision is backed up beside itself and migrated, an older PostgreSQL
    database is refused (:class:`SchemaBehindError`).  Explicit (``engine db upgrade``:
    :func:`storage.upgrade.upgrade`): ``before`` writes the backup, then any backend migrates.
    One transaction for all revisions, under SQLite's write lock or a PostgreSQL advisory lock.
    On SQLite, foreign keys are off during the upgrade (a table rebuild must not cascade into
    its children) and checked with ``PRAGMA foreign_key_check`` before it commits.  A database
    at the newest revision (already, or once upgraded) must hold every table and column of the
    models (:mod:`storage.schema_check`, once per database and process), else it is refused
    with nothing written.
    """
    head = head_revision()
    with engine.connect() as conn:  # cheap read-only check first: no write lock when current or refused
        revision = _read_revision(conn)
        if revision == head:
            check_models(conn, masked_url(engine.url), head)
            return head
        _may_upgrade(engine, conn, revision, before)
    if engine.dialect.name == "sqlite":
        with write_engine(engine).connect() as conn:
            raw = conn.connection.dbapi_connection
            assert raw is not None  # a live connection's
            raw.execute("PRAGMA foreign_keys = OFF")  # outside a transaction, where it takes effect
            try:
                with conn.begin():  # BEGIN IMMEDIATE
                    _upgrade(engine, conn, head, before)
            finally:
                raw.execute("PRAGMA foreign_keys = ON")
    else:
        with engine.begin() as conn:
            if engine.dialect.name == "postgresql":
                conn.execute(sqlalchemy.select(sqlalchemy.func.pg_advisory_xact_lock(_PG_LOCK_KEY)))
            _upgrade(engine, conn, head, before)
    return head
