"""What goes wrong with checkpoints: the one-line user errors (``CheckpointError``,
``CheckpointDiskFull``) and how orbax's failures are recognised and shortened to a line."""

from __future__ import annotations

import errno
from pathlib import Path

from engine.errors import UserError

# What orbax and tensorstore raise for a directory, file or step they cannot read or write:
# the OS's errors, tensorstore's failed statuses and orbax's refusals (ValueError), a tree or
# metadata that does not match (KeyError, TypeError), a failed asynchronous save or XLA
# transfer (RuntimeError).
ORBAX_ERRORS = (OSError, ValueError, KeyError, TypeError, RuntimeError)


def orbax_error(error: BaseException) -> bool:
    """Whether ``error`` is one of orbax's I/O failures: :data:`ORBAX_ERRORS`, or the bare
    ``Exception`` orbax raises for an array tensorstore cannot read or write (a deleted or
    truncated file: "Encountered error while reading array index")."""
    return isinstance(error, ORBAX_ERRORS) or type(error) is Exception


class CheckpointError(UserError, ValueError):
    """A checkpoint cannot be written or read; the message names the fix. ``details``: what
    orbax logged while it failed (its tracebacks), for the run's log and not the console."""

    details: tuple[str, ...] = ()


class CheckpointDiskFull(CheckpointError):
    """A checkpoint cannot be written because the disk (or the user's quota) under ``path``
    is full; nothing of it was kept."""

    def __init__(self, message: str, path: Path, details: tuple[str, ...] = ()):
        super().__init__(message)
        self.path, self.details = path, details


def disk_full(error: BaseException | None) -> bool:
    """Whether ``error`` (or what caused it) says the disk or the quota is full."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if any(s in str(error) for s in ("No space left on device", "Disk quota exceeded", "ENOSPC")):
            return True
        error = error.__cause__ or error.__context__
    return False


def brief(error: BaseException) -> str:
    """The first line of ``error``'s message, at most 160 characters."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    text = f"{type(error).__name__}: {text}" if text else type(error).__name__
    return text if len(text) <= 160 else text[:157] + "..."
