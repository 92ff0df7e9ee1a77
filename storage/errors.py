"""The storage errors: every database failure reaches a caller as one line naming the fix."""

from __future__ import annotations

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


def storage_error(error: exc.SQLAlchemyError, what: str, hint: str = "") -> StorageError:
    """The :class:`StorageError` (or :class:`DatabaseBusyError`) for a SQLAlchemy ``error``."""
    reason = str(getattr(error, "orig", None) or error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    if _is_busy(error):
        return DatabaseBusyError(f"{what}: the database is busy ({reason}); nothing was written, try again")
    if "readonly database" in reason or "read-only" in reason.lower():
        return StorageError(f"{what}: the database is read-only ({reason}); make the file and its directory "
                            f"writable or {FIX_HINT}")
    return StorageError(f"{what} ({reason}){'; ' + hint if hint else ''}")


class RunNotFoundError(StorageError, KeyError):
    """No run with that id or name (also a KeyError)."""

    __str__ = BaseException.__str__  # KeyError would quote the message
