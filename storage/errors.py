"""The storage errors: every database failure reaches a caller as one line naming the fix.

A value the database refuses (``DataError``: out of range, too long; ``IntegrityError``:
a missing or duplicate value) is reported with the column it concerns: the one the driver
names, else the one whose value in the failed statement does not fit its declared type."""

from __future__ import annotations

import re
from typing import Any, Optional

from sqlalchemy import exc

ENV_URL = "BASIS_LAB_DB_URL"
FIX_HINT = f"set {ENV_URL} or pass --db to use another database"


class StorageError(RuntimeError):
    """The database cannot be opened or used; the message says how to fix it."""


class DatabaseBusyError(StorageError):
    """A transient failure: the database is locked or busy (SQLite), a lock wait timed out,
    a serialization failure or deadlock, or the connection dropped (PostgreSQL).  Nothing of
    the failed transaction was stored; retrying it later can succeed."""


# SQLSTATEs that mean "try again": serialization failure, deadlock, lock not available,
# statement timeout / query cancelled, admin shutdown, cannot connect now, connection errors.
_TRANSIENT_SQLSTATES = {"40001", "40P01", "55P03", "57014", "57P01", "57P02", "57P03"}


def _is_busy(error: exc.SQLAlchemyError) -> bool:
    if getattr(error, "connection_invalidated", False) or isinstance(error, exc.DisconnectionError):
        return True
    orig = getattr(error, "orig", None)
    state = getattr(orig, "sqlstate", None) or ""
    if state in _TRANSIENT_SQLSTATES or state.startswith("08"):
        return True
    text = str(orig or error).lower()
    return isinstance(error, exc.OperationalError) and ("database is locked" in text or "database is busy" in text)


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
        return f"{getattr(diag, 'table_name', None) or table}.{column}" if (table or diag.table_name) else column
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
    if _is_busy(error):
        return DatabaseBusyError(f"{what}: the database is busy ({reason}); nothing was written, try again")
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
