"""The storage errors: every database failure reaches a caller as one line naming the fix.
:class:`StorageError` is a :class:`~storage.family.UserError` (the root of BASIS Lab's one
error family, re-exported here).

A value the database refuses (``DataError``: out of range, too long; ``IntegrityError``:
a missing or duplicate value) is reported with the column it concerns: the one the driver
names, else the one whose value in the failed statement does not fit its declared type."""

from __future__ import annotations

import re
from typing import Any, Optional

from sqlalchemy import exc

from .family import BasisLabError, InvalidValueError, UserError  # noqa: F401 (the family, re-exported)

ENV_URL = "BASIS_LAB_DB_URL"
FIX_HINT = f"set {ENV_URL} or pass --db to use another database"


class StorageError(UserError):
    """The database cannot be opened or used; the message says how to fix it."""


UPGRADE_COMMAND = "python -m engine db upgrade --db {url}"  # the explicit migration (engine/cli/commands/db.py)


class SchemaBehindError(StorageError):
    """A shared (PostgreSQL) database at an older schema revision than this code's: it is
    not migrated on open, since every process of every user would; nothing was written.
    The message names :data:`UPGRADE_COMMAND`, which backs the database up and migrates it."""

    def __init__(self, url: str, revision: str, head: str):
        self.revision, self.head = revision, head
        super().__init__(
            f"database {url} is at schema revision {revision}, older than this BASIS Lab's {head}; nothing was "
            f"written: migrate it with `{UPGRADE_COMMAND.format(url=url)}` (it backs the database up first), "
            f"or {FIX_HINT}")


class SchemaNewerError(StorageError):
    """A database written by a newer BASIS Lab (a schema revision this code does not know):
    refused untouched; the fix is to upgrade the code, not the database."""


class DatabaseBusyError(StorageError):
    """A transient failure: the database is locked or busy (SQLite), a lock wait timed out,
    a serialization failure or deadlock (PostgreSQL), or the database cannot be reached
    (:class:`DatabaseUnreachableError`).  Nothing of the failed transaction was stored;
    retrying it later can succeed."""


class DatabaseUnreachableError(DatabaseBusyError):
    """The connection to the database was lost or cannot be made now: the PostgreSQL server
    restarts, shuts down, is starting up or cannot be reached (connection refused, its socket
    gone, the network down); SQLite's file cannot be opened or read now (its disk unmounted).
    Transient like a busy database: retried, it succeeds once the database is back."""


class DatabaseFullError(StorageError):
    """The database's disk is full (SQLite ``database or disk is full``, PostgreSQL
    ``disk_full``).  Nothing of the failed transaction was stored; writes succeed again once
    space is freed.  ``reason``: the database's own words."""

    def __init__(self, message: str, reason: str = ""):
        super().__init__(message)
        self.reason = reason


# SQLSTATEs that mean "try again": serialization failure, deadlock, lock not available,
# statement timeout / query cancelled.
_TRANSIENT_SQLSTATES = {"40001", "40P01", "55P03", "57014"}
# ... and that mean the server went away: admin shutdown, crash shutdown, cannot connect now,
# too many connections (with class 08: connection exceptions).
_GONE_SQLSTATES = {"57P01", "57P02", "57P03", "53300"}
_DISK_FULL_SQLSTATE = "53100"
# SQLite primary result codes (``sqlite3.Error.sqlite_errorcode & 0xff``): the file cannot be
# opened or read now (SQLITE_CANTOPEN, SQLITE_IOERR), the disk is full (SQLITE_FULL).
_SQLITE_CANTOPEN, _SQLITE_IOERR, _SQLITE_FULL = 14, 10, 13
# A server that refused a new connection for a reason that passes (libpq's FATAL messages).
_PASSING_REFUSALS = ("starting up", "shutting down", "in recovery mode", "not yet accepting connections",
                     "too many clients", "remaining connection slots", "terminating connection")


def _is_unreachable(error: exc.SQLAlchemyError) -> bool:
    """Whether ``error`` says the connection to the database was lost or cannot be made now."""
    if getattr(error, "connection_invalidated", False) or isinstance(error, exc.DisconnectionError):
        return True
    orig = getattr(error, "orig", None)
    state = getattr(orig, "sqlstate", None) or ""
    if state in _GONE_SQLSTATES or state.startswith("08"):
        return True
    if not isinstance(error, exc.OperationalError):
        return False
    code = getattr(orig, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (_SQLITE_CANTOPEN, _SQLITE_IOERR)
    if type(orig).__module__.startswith("psycopg") and not state:
        # libpq failed to connect or lost the connection: no SQLSTATE, as no server answered
        # ("connection refused", "No such file or directory", "server closed the connection
        # unexpectedly"); a server that answered FATAL refused for good (no such role or
        # database, a wrong password) unless it was starting up or shutting down.
        text = str(orig)
        return "FATAL:" not in text or any(reason in text for reason in _PASSING_REFUSALS)
    return False


def _is_busy(error: exc.SQLAlchemyError) -> bool:
    orig = getattr(error, "orig", None)
    state = getattr(orig, "sqlstate", None) or ""
    if state in _TRANSIENT_SQLSTATES:
        return True
    text = str(orig or error).lower()
    return isinstance(error, exc.OperationalError) and ("database is locked" in text or "database is busy" in text)


def _is_disk_full(error: exc.SQLAlchemyError) -> bool:
    orig = getattr(error, "orig", None)
    if getattr(orig, "sqlstate", None) == _DISK_FULL_SQLSTATE:
        return True
    code = getattr(orig, "sqlite_errorcode", None)
    return (code is not None and code & 0xFF == _SQLITE_FULL) or "database or disk is full" in str(orig or error)


_TABLE = re.compile(r'^\s*(?:INSERT\s+INTO|UPDATE|DELETE\s+FROM)\s+"?(\w+)"?', re.IGNORECASE)
_NAMED = (
    re.compile(r"constraint failed: (\w+)\.(\w+)"),  # SQLite: NOT NULL / UNIQUE constraint failed: runs.uid
    re.compile(r'column "(\w+)"(?: of relation "(\w+)")?'),  # PostgreSQL: null value in column "x" of relation "t"
    re.compile(r"Key \((\w+)\)="),  # PostgreSQL: Key (uid)=(...) already exists
)


def _int_range(column: Any) -> Optional[tuple[int, int]]:
    from sqlalchemy import BigInteger, Integer, SmallInteger

    kind = column.type
    if isinstance(kind, BigInteger):
        return -(2**63), 2**63 - 1
    if isinstance(kind, SmallInteger):
        return -(2**15), 2**15 - 1
    if isinstance(kind, Integer):
        return -(2**31), 2**31 - 1
    return None


def _misfit(table: str, params: Any) -> Optional[str]:
    """``table.column`` of the first value in ``params`` its column cannot hold."""
    from .models import Base

    tbl = Base.metadata.tables.get(table)
    if tbl is None:
        return None
    rows = params if isinstance(params, (list, tuple)) else [params]
    for row in rows:
        if not isinstance(row, dict):
            continue
        for key, value in row.items():
            column = tbl.columns.get(key) or tbl.columns.get(re.sub(r"_+\d+$", "", key))
            if column is None or value is None:
                continue
            length = getattr(column.type, "length", None)
            if isinstance(value, str) and length and len(value) > length:
                return f"{table}.{column.name}"
            bounds = _int_range(column)
            if bounds and isinstance(value, int) and not bounds[0] <= value <= bounds[1]:
                return f"{table}.{column.name}"
    return None


def field_of(error: exc.SQLAlchemyError) -> Optional[str]:
    """The column (``table.column``, or ``column``) a refused value belongs to, if it can be told."""
    orig = getattr(error, "orig", None)
    statement = getattr(error, "statement", None) or ""
    m = _TABLE.match(statement)
    table = m.group(1) if m else None
    diag = getattr(orig, "diag", None)
    column = getattr(diag, "column_name", None)
    if column:
        table = getattr(diag, "table_name", None) or table
        return f"{table}.{column}" if table else column
    text = str(orig or error)
    for pattern in _NAMED:
        found = pattern.search(text)
        if found:
            groups = [g for g in found.groups() if g]
            if pattern is _NAMED[0]:
                return f"{groups[0]}.{groups[1]}"
            where = groups[1] if len(groups) > 1 else table
            return f"{where}.{groups[0]}" if where else groups[0]
    return _misfit(table, getattr(error, "params", None)) if table else None


def storage_error(error: exc.SQLAlchemyError, what: str, hint: str = "") -> StorageError:
    """The :class:`StorageError` (or :class:`DatabaseBusyError`) for a SQLAlchemy ``error``."""
    reason = str(getattr(error, "orig", None) or error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    if isinstance(error, (exc.DataError, exc.IntegrityError)):
        field = field_of(error)
        if field:
            name = field.rsplit(".", 1)[-1]
            return StorageError(f"{what}: the database refused the value of {field} ({reason}); "
                                f"fix the {name} and try again")
    if _is_unreachable(error):
        return DatabaseUnreachableError(f"{what}: the database cannot be reached ({reason}); nothing was written: "
                                        "check that its server is running (or its disk is mounted) and try again, "
                                        f"or {FIX_HINT}")
    if _is_busy(error):
        return DatabaseBusyError(f"{what}: the database is busy ({reason}); nothing was written, try again")
    if _is_disk_full(error):
        return DatabaseFullError(f"{what}: the database's disk is full ({reason}); nothing was written: free space "
                                 "on it and try again", reason)
    if "readonly database" in reason or "read-only" in reason.lower():
        return StorageError(f"{what}: the database is read-only ({reason}); make the file and its directory "
                            f"writable or {FIX_HINT}")
    return StorageError(f"{what} ({reason}){'; ' + hint if hint else ''}")


class LeaseLostError(StorageError):
    """An owner's write was refused because another claim of the run took a newer lease
    (epoch).  Nothing of the write was stored; the owner must stop training that run
    without writing anything more to it (no checkpoint, no status)."""

    def __init__(self, run_id: int, epoch: int, current: int):
        self.run_id, self.epoch, self.current = int(run_id), int(epoch), int(current)
        super().__init__(f"run {run_id}: lost its lease to epoch {current}; stopping without writing")


class RunNotFoundError(StorageError, KeyError):
    """No run with that id or name (also a KeyError)."""

    __str__ = BaseException.__str__  # KeyError would quote the message
