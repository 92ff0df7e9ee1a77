"""Database writes that outlast a busy database.

Training must never fail, nor lose a record, because another connection holds the
database's write lock longer than the busy timeout (a database browser, a backup,
slow shared storage). ``StoreWriter`` runs every write of the runs it serves on one
background thread, in order: a write that finds the database busy
(``storage.DatabaseBusyError``) is retried with exponential backoff (``BACKOFF_S``
up to ``MAX_BACKOFF_S``) for as long as the process lives. The queue is bounded
(``MAX_PENDING`` writes): when it is full the training thread waits, so memory stays
bounded and nothing is dropped. Heartbeats are coalesced: only the newest pending one
of a run is written.

A write that fails for good (the run was deleted meanwhile, the disk is read-only) is
not retried: ``failure(run_id)`` returns it, and the trainer stops that run. An owner's
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

from storage import DatabaseBusyError, LeaseLostError, StorageError

log = logging.getLogger(__name__)

MAX_PENDING = 10_000
BACKOFF_S = 0.05
MAX_BACKOFF_S = 5.0


class StoreWriter:
    """An ordered, retrying, bounded write queue in front of a ``RunStore``."""

    def __init__(self, store, *, sleep: Callable[[float], None] = time.sleep):
        self.store = store
        self._sleep = sleep
        self._queue: queue.Queue = queue.Queue(maxsize=MAX_PENDING)
        self._beats: dict[int, tuple] = {}  # run id → newest pending heartbeat arguments
        self._failures: dict[int, StorageError] = {}
        self._lost: dict[int, LeaseLostError] = {}  # run id → the refusal of its newest lost lease
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._pending = 0
        self.retries = 0  # writes retried because the database was busy (for tests and logs)
        self._thread = threading.Thread(target=self._loop, name="basis-store-writer", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ producers

    def call(self, run_id: int | None, method: str, *args: Any, **kwargs: Any) -> None:
        """Queue ``store.<method>(*args, **kwargs)``; blocks while the queue is full."""
        with self._lock:
            self._pending += 1
        self._queue.put((run_id, method, args, kwargs))

    def metrics(self, run_id: int, rows: list, **kwargs: Any) -> None:
        if rows:
            self.call(run_id, "add_metrics", run_id, rows, **kwargs)

    def heartbeat(self, run_id: int, *args: Any, **kwargs: Any) -> None:
        """Queue a heartbeat; an older one of the same run still waiting is replaced."""
        with self._lock:
            waiting = run_id in self._beats
            self._beats[run_id] = (args, kwargs)
        if not waiting:
            self.call(run_id, "heartbeat")

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

    def failure(self, run_id: int) -> StorageError | None:
        """The error that made a write of ``run_id`` fail for good, if any (a lost lease
        is not one: see ``lost``)."""
        with self._lock:
            return self._failures.get(run_id)

    def lost(self, run_id: int, epoch: int) -> LeaseLostError | None:
        """The refusal of a write of ``run_id`` under lease ``epoch``, if another claim took it."""
        with self._lock:
            refusal = self._lost.get(run_id)
        return refusal if refusal is not None and refusal.epoch == epoch else None

    # ------------------------------------------------------------------ the thread

    def _loop(self) -> None:
        while True:
            run_id, method, args, kwargs = self._queue.get()
            if method == "heartbeat":
                with self._lock:
                    args, kwargs = self._beats.pop(run_id, ((), {}))
                args = (run_id, *args)
            try:
                self._write(run_id, method, args, kwargs)
            finally:
                with self._idle:
                    self._pending -= 1
                    self._idle.notify_all()

    def _write(self, run_id, method, args, kwargs) -> None:
        delay = BACKOFF_S
        epoch = kwargs.get("epoch")
        if epoch is not None and self.lost(run_id, epoch) is not None:
            return  # the lease is gone: nothing more is written under it
        while True:
            try:
                getattr(self.store, method)(*args, **kwargs)
                return
            except LeaseLostError as e:
                log.debug("%s of run %s refused: %s", method, run_id, e)
                with self._lock:
                    self._lost[run_id] = e
                return
            except DatabaseBusyError as e:
                self.retries += 1
                log.warning("database busy (%s); retrying %s of run %s in %.2f s", e, method, run_id, delay)
                self._sleep(delay)
                delay = min(2 * delay, MAX_BACKOFF_S)
            except StorageError as e:
                log.error("%s of run %s failed: %s", method, run_id, e)
                if run_id is not None:
                    with self._lock:
                        self._failures.setdefault(run_id, e)
                return
            except Exception as e:  # noqa: BLE001 — the writer thread must survive any one write
                log.exception("%s of run %s crashed", method, run_id)
                if run_id is not None:
                    with self._lock:
                        self._failures.setdefault(run_id, StorageError(f"{type(e).__name__}: {e}"))
                return
