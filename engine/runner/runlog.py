"""A run's log, captured while it trains and stored with the run (``storage.logs``).

``RunLog`` keeps, for as long as its run trains in this process, what the run's own thread
(the one that entered it) says, each line with its time, level and source:

- its ``logging`` records (``RunLog`` is a handler on the root logger): the lab's own loggers
  (``engine.*``) at the level they let through, any other library's (jax, orbax, absl) at
  ``WARNING`` and above. Source: the logger's name.
- every Python warning it raises (``warnings.showwarning`` is wrapped while a run trains; the
  original still prints it). Source ``warning``.
- what it prints to ``sys.stdout`` and ``sys.stderr`` (``engine.runner.console``: a proxy in
  front of each stream, installed once per process, that hands a line to the run whose thread
  wrote it and passes everything through). Source ``stdout`` or ``stderr``; level ``info``
  unless the line says otherwise (``console_level``: "Traceback", "ValueError: …", "WARNING …";
  a traceback's indented frames take the level of the line above them).
- the lab's own lines (source ``lab``): claimed, resumed, a progress line at every evaluation
  (``note``, from ``engine.runner.execution``), and the end.

Several runs training in threads of one process each keep their own lines: records, warnings
and writes are routed by the thread that made them. Threads a training starts itself (a
checkpoint library's) and C-level output (XLA writing to file descriptor 2) are not a run's.

Bounded: a training keeps its first ``LINES_MAX`` lines (then one line says the cap was hit,
and its end says how many more were dropped), each of at most ``storage.logs.LOG_TEXT_MAX``
characters. Lines go to the database through the run's ``StoreWriter`` (retried while the
database is busy, fenced by the run's lease) in batches of ``FLUSH_LINES``, at every ``flush``
(the worker's heartbeat calls it, so a training run's log shows within seconds), and all that
is left at the end. A log write the database refuses for good is dropped, never the run's
failure; nothing a run prints or logs raises into its training.

What a one-line error leaves out (orbax's tracebacks behind a full checkpoint disk) is
added with ``keep``: to the run's log only, never to the console.

A run that ends ``failed`` (an error, or a loss that went NaN) also gets one ``ALERT`` line,
"failed: <the error's first line>": what the dashboard shows as an alert on every page.
Other threads' records (the heartbeat, another run) are not the run's and are left out.
"""

from __future__ import annotations

import logging
import re
import threading
import time
import warnings
from typing import Any, Callable, Optional

from engine.runner import console
from storage import ALERT, DatabaseBusyError, LeaseLostError, StorageError
from storage.logs import DEBUG, ERROR, INFO, LOG_TEXT_MAX, WARNING

log = logging.getLogger(__name__)

FLUSH_LINES = 50  # lines held before they are queued for the database
LINES_MAX = 10_000  # lines one training of a run keeps (its first); its end line is always kept
LEVEL_PREFIX = 200  # characters of a printed line read for its level
LAB, WARNING_SOURCE = "lab", "warning"  # the sources of the lab's own lines and of Python warnings

_active: dict[int, "RunLog"] = {}  # thread id → the log of the run that thread trains
_active_lock = threading.Lock()
_original_showwarning: Callable[..., Any] | None = None
_CONSOLE_LEVELS = (  # a console line's level, from how it starts (else info)
    (ERROR, re.compile(r"(?i:error|fatal|critical|exception)\b|Traceback \(most recent call last\)|[EF]\d{4} "
                       r"|[A-Z]\w*(Error|Exception)\b")),
    (WARNING, re.compile(r"(?i:warn|warning)\b|W\d{4} |[A-Z]\w*Warning\b|.*\b[A-Z]\w*Warning: ")),
    (DEBUG, re.compile(r"(?i:debug)\b")),
)


def level_name(levelno: int) -> str:
    """The stored level of a ``logging`` level number: error (≥ ERROR), warning (≥ WARNING),
    info (≥ INFO), else debug."""
    if levelno >= logging.ERROR:
        return ERROR
    return WARNING if levelno >= logging.WARNING else INFO if levelno >= logging.INFO else DEBUG


def console_level(line: str) -> str:
    """The level of a line printed to stdout or stderr: what its start (its first
    ``LEVEL_PREFIX`` characters) says, else info."""
    text = line.lstrip()[:LEVEL_PREFIX]
    return next((level for level, pattern in _CONSOLE_LEVELS if pattern.match(text)), INFO)


def _showwarning(message, category, filename, lineno, file=None, line=None) -> None:
    """``warnings.showwarning`` that also hands the warning to the run its thread trains."""
    run_log = _active.get(threading.get_ident())
    if run_log is not None and not console.busy():
        run_log.add(WARNING, f"{category.__name__}: {message} ({filename}:{lineno})", source=WARNING_SOURCE)
    if _original_showwarning is not None:
        with console.quiet():  # what it prints (or logs, under logging.captureWarnings) is kept already
            _original_showwarning(message, category, filename, lineno, file, line)


def _hook_warnings() -> None:
    global _original_showwarning
    with _active_lock:
        if warnings.showwarning is not _showwarning:  # first use, or replaced since (``catch_warnings`` restores)
            _original_showwarning = warnings.showwarning
            warnings.showwarning = _showwarning


def keep(lines, level: str = WARNING, source: str = LAB) -> None:
    """Add ``lines`` to the log of the run this thread trains (none: they are dropped), and
    to nothing else: not the console, which has the one line that named the failure."""
    run_log = _active.get(threading.get_ident())
    if run_log is not None:
        for line in lines:
            run_log.add(level, line, source=source)


def note(level: str, text: str) -> None:
    """One line of the lab's own (progress, a resume) in the log of the run this thread trains."""
    keep([text], level)


def _console_sink() -> Optional[Callable[[str, str], None]]:
    """Where ``engine.runner.console`` sends what this thread prints: its run's log, if any."""
    run_log = _active.get(threading.get_ident())
    return None if run_log is None else run_log.printed


def _store_lines(store: Any, run_id: int, lines: list, *, epoch: int | None) -> None:
    """Store a batch of a run's log lines; a busy database is waited for and a lost lease
    stops the run (as any write of it), anything else is dropped: a log never fails its run."""
    try:
        store.logs.add_run_logs(run_id, lines, epoch=epoch)
    except (DatabaseBusyError, LeaseLostError):
        raise
    except (StorageError, ValueError, TypeError) as e:
        log.debug("run %s: %d log lines not stored: %s", run_id, len(lines), e)


class RunLog(logging.Handler):
    """The log of run ``run_id`` under lease ``epoch``, kept from the thread that enters it."""

    def __init__(self, store: Any, writer: Any, run_id: int, epoch: int):
        super().__init__(logging.NOTSET)
        self.store, self.writer, self.run_id, self.epoch = store, writer, run_id, epoch
        self._thread: int | None = None
        self._lines: list[tuple[float, str, str, str]] = []
        self._kept = self.dropped = 0  # lines of this training kept so far, and dropped past LINES_MAX
        self._streams = {name: console.Lines(LOG_TEXT_MAX) for name in ("stdout", "stderr")}
        self._last: dict[str, str] = {}  # stream → the level of its last line
        self._lines_lock = threading.Lock()
        self._queue_lock = threading.Lock()  # a flush (the heartbeat's) and the end queue their lines in order
        self.setFormatter(logging.Formatter("%(name)s: %(message)s"))

    def __enter__(self) -> "RunLog":
        self._thread = threading.get_ident()
        _hook_warnings()
        console.install(_console_sink)
        with _active_lock:
            _active[self._thread] = self
        logging.getLogger().addHandler(self)
        return self

    def __exit__(self, *exc) -> None:
        logging.getLogger().removeHandler(self)
        with _active_lock:
            if self._thread is not None and _active.get(self._thread) is self:
                del _active[self._thread]
        for name, stream in self._streams.items():  # a last line printed without its newline
            for line in stream.rest():
                self.add(self._level_of(name, line), line, source=name)

    def filter(self, record: logging.LogRecord) -> bool:
        """The run's thread's records: the lab's at any level its loggers let through, others
        from ``WARNING`` up; none that a warning's own printing logs (kept as the warning)."""
        if record.thread != self._thread or console.busy():
            return False
        return record.levelno >= logging.WARNING or record.name == "engine" or record.name.startswith("engine.")

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
        except (TypeError, ValueError):  # a bad %-format in someone's log call: keep the raw message
            text = f"{record.name}: {record.msg!r} {record.args!r}"
        self.add(level_name(record.levelno), text, record.created, source=record.name)

    def printed(self, source: str, text: str) -> None:
        """What the run's thread wrote to ``source`` (stdout, stderr): its complete lines are kept."""
        with self._lines_lock:
            lines = self._streams[source].feed(text)
        for line in lines:
            self.add(self._level_of(source, line), line, source=source)

    def _level_of(self, source: str, line: str) -> str:
        """``console_level``, except that an indented line after a warning or an error (a
        traceback's frames) is of that level too."""
        level = console_level(line)
        if level == INFO and line[:1] in (" ", "\t") and self._last.get(source) in (WARNING, ERROR):
            level = self._last[source]
        self._last[source] = level
        return level

    def add(self, level: str, text: str, when: float | None = None, *, source: str = LAB) -> None:
        """Keep a line (``when``: seconds since the epoch; None: now) unless this training kept
        ``LINES_MAX`` already (then it is counted in ``dropped``)."""
        line = (time.time() if when is None else when, level, str(text)[:LOG_TEXT_MAX + 1], source)
        with self._lines_lock:
            if self._kept >= LINES_MAX:
                self.dropped += 1
                return
            self._kept += 1
            self._lines.append(line)
            if self._kept == LINES_MAX:
                self._lines.append((line[0], WARNING, f"this run's log keeps {LINES_MAX:,} lines a training: "
                                                      "later lines are counted, not kept", LAB))
            full = len(self._lines) >= FLUSH_LINES
        if full:
            self.flush()

    def _take(self) -> list[tuple[float, str, str, str]]:
        with self._lines_lock:
            lines, self._lines = self._lines, []
        return lines

    def flush(self) -> None:
        """Queue the lines held so far for the database."""
        with self._queue_lock:
            lines = self._take()
            if lines:
                self.writer.call(self.run_id, _store_lines, self.store, self.run_id, lines, epoch=self.epoch)

    def end(self, status: str, error: str | None) -> None:
        """Queue what is left and the run's end as the run's final writes (tried even after
        an earlier write failed; never dropped by the cap): how many lines the cap dropped, its
        status, and for ``failed`` the ``ALERT`` line with the error's first line, then the
        whole error."""
        first = error.splitlines()[0] if error else ""
        ending = []
        if self.dropped:
            ending.append((WARNING, f"{self.dropped:,} more lines dropped (a training keeps its first {LINES_MAX:,})"))
        if status == "failed":
            ending.append((ALERT, f"failed: {first}" if first else "failed"))
            if error and error != first:
                ending.append((ERROR, error))
        else:
            ending.append((WARNING if status == "interrupted" else INFO, status + (f": {first}" if first else "")))
        now = time.time()
        with self._queue_lock:
            lines = self._take() + [(now, level, text[:LOG_TEXT_MAX + 1], LAB) for level, text in ending]
            self.writer.final(self.run_id, _store_lines, self.store, self.run_id, lines, epoch=self.epoch)
