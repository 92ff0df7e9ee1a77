"""Orbax kept quiet while it reads or writes a checkpoint: what it logs and leaves behind
while a read of a damaged checkpoint fails goes to DEBUG, and what it logs while a save
fails (a full disk: a hundred lines of traceback from its writer threads) is kept for the
run's log (``CheckpointError.details``), so the failure is the one line of ours on the
console. What a save that succeeds logged is passed on as orbax logged it."""

from __future__ import annotations

import logging
import os
import sys
import threading

from engine.training.checkpoints.errors import brief

log = logging.getLogger("engine.training.checkpoints")  # one logger for the package, as before its split


class _Held(logging.Filter):
    """Keeps the records of the loggers it is put on (orbax logs through absl's) while
    a checkpoint is read, and passes them on at DEBUG: a damaged checkpoint is reported
    as one line of ours, not as orbax's tracebacks and warnings."""

    def __init__(self):
        super().__init__()
        self.depth = 0
        self.lock = threading.Lock()
        self.keepers: list[list[logging.LogRecord]] = []  # of the saves in progress (``orbax_held``)

    def filter(self, record: logging.LogRecord) -> bool:
        if self.depth <= 0 or record.levelno >= logging.CRITICAL:
            return True
        with self.lock:  # from any thread: orbax writes from threads of its own
            for keeper in self.keepers:
                keeper.append(record)
        log.debug("orbax while reading or writing a checkpoint: %s", (record.getMessage().splitlines() or [""])[0])
        return False


_HELD = _Held()
_QUIET_LOGGERS = ("absl", "orbax", "tensorstore")


def _orbax_leftover(unraisable) -> bool:
    """Whether an unraisable exception is what orbax leaves behind when reading a damaged
    checkpoint fails: its other reads still in flight, as coroutines dropped unfinished
    or as tensorstore callbacks into the event loop it has closed."""
    if isinstance(unraisable.exc_value, RuntimeError) and str(unraisable.exc_value) == "Event loop is closed":
        return True
    code = getattr(unraisable.object, "cr_code", None)
    return code is not None and f"{os.sep}orbax{os.sep}" in code.co_filename


def _hold_orbax_leftovers() -> None:
    """Install (once) a ``sys.unraisablehook`` that logs ``_orbax_leftover`` exceptions at
    DEBUG instead of printing their tracebacks (a hundred lines or more, after the read
    has already failed and been reported); any other goes to the hook it replaces."""
    previous = sys.unraisablehook
    if getattr(previous, "_basis_lab", False):
        return

    def hook(unraisable) -> None:
        if _orbax_leftover(unraisable):
            log.debug("orbax after a failed checkpoint read: %s", brief(unraisable.exc_value))
        else:
            previous(unraisable)

    setattr(hook, "_basis_lab", True)  # a function attribute: the mark of our hook
    sys.unraisablehook = hook


class orbax_quiet:
    """Context manager: orbax's log records are held back (see ``_Held``) inside it, and
    what its failed reads leave behind is never printed (``_hold_orbax_leftovers``)."""

    def __enter__(self):
        _hold_orbax_leftovers()
        with _HELD.lock:
            if _HELD.depth == 0:
                for name in _QUIET_LOGGERS:
                    logging.getLogger(name).addFilter(_HELD)
            _HELD.depth += 1

    def __exit__(self, *exc):
        with _HELD.lock:
            _HELD.depth -= 1
            if _HELD.depth == 0:
                for name in _QUIET_LOGGERS:
                    logging.getLogger(name).removeFilter(_HELD)


class orbax_held(orbax_quiet):
    """Context manager for a save: as ``orbax_quiet``, and orbax's records meanwhile are
    appended to ``records``. A save that succeeds passes them on as logged (nothing
    changes); one that raises leaves them in ``records`` for ``details``."""

    def __init__(self, records: list[logging.LogRecord]):
        self.records = records

    def __enter__(self):
        super().__enter__()
        with _HELD.lock:
            _HELD.keepers.append(self.records)

    def __exit__(self, *exc):
        with _HELD.lock:  # by identity: two saves' lists may be equal
            _HELD.keepers = [keeper for keeper in _HELD.keepers if keeper is not self.records]
        super().__exit__(*exc)
        if exc[0] is None:
            for record in self.records:
                logging.getLogger(record.name).handle(record)


_DETAIL = logging.Formatter("%(levelname)s %(name)s [%(threadName)s]: %(message)s")


def details(records: list[logging.LogRecord]) -> tuple[str, ...]:
    """The text of each record, with its traceback: what a failed save logged, for the run's log."""
    return tuple(_DETAIL.format(record) for record in records)
