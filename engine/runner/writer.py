"""Database writes that outlast a busy database.

Training must never fail, nor lose a record, because another connection holds the
database's write lock longer than the busy timeout (a database browser, a backup,
slow shared storage). ``StoreWriter`` runs every write of the runs it serves on one
background thread, in order: a write that finds the database busy
(``storage.DatabaseBusyError``) is retried with exponential backoff (``BACKOFF_S``
up to ``MAX_BACKOFF_S``) for as long as the process lives. The queue is bounded
(``MAX_PENDING`` writes): when it is full the training thread waits, so memory stays
bounded and nothing is dropped. A database that cannot be reached (the PostgreSQL server
restarts or is down, a lost connection: ``storage.DatabaseUnreachableError``, a kind of
busy) is waited for the same way, the writes buffered meanwhile. Heartbeats are coalesced:
only the newest pending one of a run is written.

A write is a callable and its arguments (``writer.call(run_id, store.runs.set_status, run_id,
"finished")``), run as given on the writer's thread.

A write that fails for good (the run was deleted meanwhile, the disk is full or read-only) is
not retried: ``failure(run_id)`` returns it, and the trainer stops that run. The run's
later writes are dropped, as they would leave a hole in its history, except those queued
with ``final`` (its end: notes and status), which are still tried. Such a failure is
logged as an error, except a full disk (``storage.DatabaseFullError``), logged at DEBUG
only: the run it stops says so in the one line of its end (``disk full: … resume N``), so
the console does not fill with an error for every write (and every beat) that meets it
meanwhile. An owner's
write refused because another claim took the run's lease (``storage.LeaseLostError``)
is not an error of the database: ``lost(run_id, epoch)`` returns it, and every later
write of that run under that epoch is dropped unwritten.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any, Callable

from engine.errors import TASK_FAILURES
from storage import DatabaseBusyError, DatabaseFullError, LeaseLostError, StorageError

log = logging.getLogger(__name__)

MAX_PENDING = 10_000
BACKOFF_S = 0.05
MAX_BACKOFF_S = 5.0


class _Write:
    """One queued write: ``fn(*args, **kwargs)``, on behalf of ``run_id`` (None: no run)."""

    __slots__ = ("run_id", "fn", "args", "kwargs", "final")

    def __init__(self, run_id: int | None, fn: Callable[..., Any], args: tuple, kwargs: dict, final: bool = False):
        self.run_id, self.fn, self.args, self.kwargs, self.final = run_id, fn, args, kwargs, final

    def __call__(self) -> Any:
        return self.fn(*self.args, **self.kwargs)

    def __str__(self) -> str:
        return f"{getattr(self.fn, '__name__', self.fn)} of run {self.run_id}"


class StoreWriter:
    """An ordered, retrying, bounded write queue in front of a ``RunStore``."""

    def __init__(self, store, *, sleep: Callable[[float], None] = time.sleep):
        self.store = store
        self._sleep = sleep
        self._queue: queue.Queue[_Write] = queue.Queue(maxsize=MAX_PENDING)
        self._beats: dict[int, _Write] = {}  # run id → its heartbeat waiting in the queue
        self._failures: dict[int, Exception] = {}  # a StorageError, or a bug in a write (kept whole)
        self._lost: dict[int, LeaseLostError] = {}  # run id → the refusal of its newest lost lease
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._pending = 0
        self.retries = 0  # writes retried because the database was busy (for tests and logs)
        self._thread = threading.Thread(target=self._loop, name="basis-store-writer", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ producers

    def call(self, run_id: int | None, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """Queue ``fn(*args, **kwargs)`` (a ``RunStore`` method) on behalf of ``run_id``;
        blocks while the queue is full."""
        self._put(_Write(run_id, fn, args, kwargs))

    def final(self, run_id: int, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """Queue a write of the run's end (its notes, its status): tried even after an
        earlier write of ``run_id`` failed for good."""
        self._put(_Write(run_id, fn, args, kwargs, final=True))

    def metrics(self, run_id: int, rows: list, *, eval_losses: list | None = None, **kwargs: Any) -> None:
        """Queue ``store.metrics.add_metrics(run_id, rows, **kwargs)``, with the records' per-batch
        evaluation losses ``(step, split, losses)`` in the same write when there are any."""
        if eval_losses:
            kwargs["eval_losses"] = eval_losses
        if rows or eval_losses:
            self.call(run_id, self.store.metrics.add_metrics, run_id, rows, **kwargs)

    def heartbeat(self, run_id: int, *args: Any, **kwargs: Any) -> None:
        """Queue ``store.runs.heartbeat(run_id, *args, **kwargs)``; an older heartbeat of the
        same run still waiting in the queue takes these arguments instead."""
        with self._lock:
            waiting = self._beats.get(run_id)
            if waiting is not None:
                waiting.args, waiting.kwargs = (run_id, *args), kwargs
                return
            write = self._beats[run_id] = _Write(run_id, self.store.runs.heartbeat, (run_id, *args), kwargs)
        self._put(write)

    def _put(self, write: _Write) -> None:
        with self._lock:
            self._pending += 1
        self._queue.put(write)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued write is done (or failed for good); False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._idle:
            while self._pending:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._idle.wait(remaining)
        return True

    def failure(self, run_id: int) -> Exception | None:
        """The error that made a write of ``run_id`` fail for good, if any (a lost lease
        is not one: see ``lost``)."""
        with self._lock:
            return self._failures.get(run_id)

    def forget(self, run_id: int) -> None:
        """Clear the failure of ``run_id`` (its next training starts afresh); call it when
        no write of the run's last training is queued any more."""
        with self._lock:
            self._failures.pop(run_id, None)

    def lost(self, run_id: int, epoch: int) -> LeaseLostError | None:
        """The refusal of a write of ``run_id`` under lease ``epoch``, if another claim took it."""
        with self._lock:
            refusal = self._lost.get(run_id)
        return refusal if refusal is not None and refusal.epoch == epoch else None

    # ------------------------------------------------------------------ the thread

    def _loop(self) -> None:
        while True:
            write = self._queue.get()
            with self._lock:
                if write.run_id is not None and self._beats.get(write.run_id) is write:
                    del self._beats[write.run_id]  # taken: from now on a newer beat queues anew
            try:
                self._write(write)
            finally:
                with self._idle:
                    self._pending -= 1
                    self._idle.notify_all()

    def _write(self, write: _Write) -> None:
        delay = BACKOFF_S
        run_id, epoch = write.run_id, write.kwargs.get("epoch")
        if epoch is not None and run_id is not None and self.lost(run_id, epoch) is not None:
            return  # the lease is gone: nothing more is written under it
        if run_id is not None and not write.final and self.failure(run_id) is not None:
            return  # written after a lost write, it would leave a hole in the run's history
        while True:
            try:
                write()
                return
            except LeaseLostError as e:
                log.debug("%s refused: %s", write, e)
                with self._lock:
                    self._lost[e.run_id] = e
                return
            except DatabaseBusyError as e:  # a lost connection too: waited for as long as the process lives
                self.retries += 1
                log.warning("%s; retrying %s in %.2f s", e, write, delay)
                self._sleep(delay)
                delay = min(2 * delay, MAX_BACKOFF_S)
            except StorageError as e:  # a full disk: said once, by the end of the run it stops
                (log.debug if isinstance(e, DatabaseFullError) else log.error)("%s failed: %s", write, e)
                self._fail(write.run_id, e)
                return
            except TASK_FAILURES as e:  # the writer thread survives a write that fails
                log.exception("%s crashed", write)
                self._fail(write.run_id, e)
                return

    def _fail(self, run_id: int | None, error: Exception) -> None:
        if run_id is not None:
            with self._lock:
                self._failures.setdefault(run_id, error)
