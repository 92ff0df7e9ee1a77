"""A run's log, captured while it trains and stored with the run (``storage.logs``).

``RunLog`` is a ``logging.Handler`` on the root logger for as long as its run trains in
this process. It keeps what the run's own thread logs at the level its loggers let through
(warnings and errors, unless logging was configured lower) and every Python warning that
thread raises (``warnings.showwarning`` is wrapped while a run trains; the original still
prints it), plus the lines ``execute`` adds (claimed, resumed, skipped, the end). Each line
keeps the time it was logged. Lines go to the database through the run's ``StoreWriter``
(retried while the database is busy, fenced by the run's lease) in batches of
``FLUSH_LINES``, at every ``flush`` (the worker's heartbeat calls it, so a training run's
log shows within seconds), and all that is left at the end.

What a one-line error leaves out (orbax's tracebacks behind a full checkpoint disk) is
added with ``keep``: to the run's log only, never to the console.

A run that ends ``failed`` (an error, or a loss that went NaN) also gets one ``ALERT`` line,
"failed: <the error's first line>": what the dashboard shows as an alert on every page.
Other threads' records (the heartbeat, another run) are not the run's and are left out.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import warnings
from typing import Any, Callable, Iterator

from storage import ALERT
from storage.logs import ERROR, INFO, WARNING

FLUSH_LINES = 50  # lines held before they are queued for the database

_active: dict[int, "RunLog"] = {}  # thread id → the log of the run that thread trains
_active_lock = threading.Lock()
_original_showwarning: Callable[..., Any] | None = None


def level_name(levelno: int) -> str:
    """The stored level of a ``logging`` level number: error (≥ ERROR), warning (≥ WARNING), else info."""
    return ERROR if levelno >= logging.ERROR else WARNING if levelno >= logging.WARNING else INFO


def _showwarning(message, category, filename, lineno, file=None, line=None) -> None:
    """``warnings.showwarning`` that also hands the warning to the run its thread trains."""
    run_log = _active.get(threading.get_ident())
    if run_log is not None:
        run_log.add(WARNING, f"{category.__name__}: {message} ({filename}:{lineno})")
    if _original_showwarning is not None:
        _original_showwarning(message, category, filename, lineno, file, line)


def _hook_warnings() -> None:
    global _original_showwarning
    with _active_lock:
        if warnings.showwarning is not _showwarning:  # first use, or replaced since (``catch_warnings`` restores)
            _original_showwarning = warnings.showwarning
            warnings.showwarning = _showwarning


def keep(lines, level: str = WARNING) -> None:
    """Add ``lines`` to the log of the run this thread trains (none: they are dropped), and
    to nothing else: not the console, which has the one line that named the failure."""
    run_log = _active.get(threading.get_ident())
    if run_log is not None:
        for line in lines:
            run_log.add(level, line)


class RunLog(logging.Handler):
    """The log of run ``run_id`` under lease ``epoch``, kept from the thread that enters it."""

    def __init__(self, store: Any, writer: Any, run_id: int, epoch: int):
        super().__init__(logging.NOTSET)
        self.store, self.writer, self.run_id, self.epoch = store, writer, run_id, epoch
        self._thread: int | None = None
        self._lines: list[tuple[float, str, str]] = []
        self._lines_lock = threading.Lock()
        self._queue_lock = threading.Lock()  # a flush (the heartbeat's) and the end queue their lines in order
        self.setFormatter(logging.Formatter("%(name)s: %(message)s"))

    def __enter__(self) -> "RunLog":
        self._thread = threading.get_ident()
        _hook_warnings()
        with _active_lock:
            _active[self._thread] = self
        logging.getLogger().addHandler(self)
        return self

    def __exit__(self, *exc) -> None:
        logging.getLogger().removeHandler(self)
        with _active_lock:
            if self._thread is not None and _active.get(self._thread) is self:
                del _active[self._thread]

    def filter(self, record: logging.LogRecord) -> bool:
        return record.thread == self._thread

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
        except (TypeError, ValueError):  # a bad %-format in someone's log call: keep the raw message
            text = f"{record.name}: {record.msg!r} {record.args!r}"
        self.add(level_name(record.levelno), text, record.created)

    def add(self, level: str, text: str, when: float | None = None) -> None:
        """Keep a line (``when``: seconds since the epoch; None: now)."""
        with self._lines_lock:
            self._lines.append((time.time() if when is None else when, level, text))
            full = len(self._lines) >= FLUSH_LINES
        if full:
            self.flush()

    def _take(self) -> list[tuple[float, str, str]]:
        with self._lines_lock:
            lines, self._lines = self._lines, []
        return lines

    def flush(self) -> None:
        """Queue the lines held so far for the database."""
        with self._queue_lock:
            lines = self._take()
            if lines:
                self.writer.call(self.run_id, self.store.add_run_logs, self.run_id, lines, epoch=self.epoch)

    def end(self, status: str, error: str | None) -> None:
        """Queue what is left and the run's end as the run's final writes (tried even after
        an earlier write failed): its status, and for ``failed`` the ``ALERT`` line with the
        error's first line, then the whole error."""
        first = error.splitlines()[0] if error else ""
        if status == "failed":
            self.add(ALERT, f"failed: {first}" if first else "failed")
            if error and error != first:
                self.add(ERROR, error)
        else:
            self.add(WARNING if status == "interrupted" else INFO, status + (f": {first}" if first else ""))
        with self._queue_lock:
            lines = self._take()
            self.writer.final(self.run_id, self.store.add_run_logs, self.run_id, lines, epoch=self.epoch)


@contextlib.contextmanager
def held_below(name: str, level: int) -> Iterator[None]:
    """Logger ``name`` passes only records at ``level`` or above while the block runs; its own
    level is restored after."""
    logger = logging.getLogger(name)
    before = logger.level
    logger.setLevel(level)
    try:
        yield
    finally:
        logger.setLevel(before)
