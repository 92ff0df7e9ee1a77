"""Background runs: claiming, training, heartbeats, checkpoints, cancel, interrupt.

Every run is a row in the database first (status ``queued``). A ``JobManager``
trains runs in worker threads of this process:

- runs it queued itself (``submit``: the dashboard, ``run``/``sweep`` of the CLI),
  marked with this process as their owner, or runs it was asked to ``resume``;
- with ``pull=True`` (``python -m engine worker``) also any unowned queued run in
  the database, whoever queued it (``sweep --queue-only``, the dashboard's "queue for
  workers", another machine), and queued runs whose queuing process died.

Claiming is atomic across processes and hosts (``QueueRepository.claim`` / ``claim_next``:
``FOR UPDATE SKIP LOCKED`` on PostgreSQL, ``BEGIN IMMEDIATE`` on SQLite), so every run
is trained by exactly one process. A claimed run (``running``) streams its metrics
through a ``StoreWriter`` (writes outlast a busy database), is stamped by the manager's one
``liveness.Channel`` every ``liveness.HEARTBEAT_S`` seconds (which reads back its lease and
cancel flag in the same transaction), and checkpoints its state
in the run's folders under ``engine.runner.paths.checkpoint_root()``, named by the database's
identity (``engine.runner.paths.run_folders``; see ``engine.training.loop.train``). It ends as
``finished``, ``failed`` (with the error: ``engine.errors.failure_text``, a bug as ``bug: …`` with its
whole traceback; the worker goes on to its next run), ``cancelled`` (``RunsRepository.runs.request_cancel``
from any process) or ``interrupted`` (``interrupt()``: a signal; resumable). A run
that was trained before continues from its newest checkpoint; without one (the
checkpoint directory is not shared with the machine that trained it) it restarts
from step 0 and its notes say why.

Liveness: a process that dies leaves ``running`` rows whose heartbeat stops; the channel
of every job manager sweeps them (``liveness.Channel.sweep``, rate-limited): they end
``interrupted``, cause ``stale``, by the rule ``engine.runner.liveness`` states, and a pulling
worker's channel queues them again. Readers write nothing.

Faults: a database that cannot be reached (PostgreSQL restarting) is waited for, the
run's writes buffered (``StoreWriter``). A full disk, the database's or the checkpoints',
ends the run ``interrupted`` with one line, ``disk full: free space on PATH and run
`python -m engine resume N```. Should the database refuse even that end (its disk still
full), or a run crash its thread, the manager keeps trying to store the end at every beat
of its channel: a live process never holds the lease of a run it no longer trains.

Exactly once (``storage.lease``): every claim of a run takes a new lease, an epoch,
which its ``engine.runner.execution.RunExecution`` carries into every write of the run (metrics, heartbeats, status,
notes, checkpoint step) and into the checkpoint folder (``epoch-<E>``). An owner that
stalled past the timeout and was replaced learns that its lease is gone (``LeaseLostError``)
from its channel's next read-back or its next fenced write's refusal: it stops at once without
a checkpoint or any other write, logs one line, and its process exits (``run``) or moves on (``worker``).
A resume continues from the newest valid checkpoint, of any epoch, at or before the
run's recorded ``checkpoint_step``: that record is written by the lease holder after
the metrics of every step before it, so the stored history never has a gap.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from pathlib import Path
from typing import Callable, Iterable

from engine.config import RunConfig
from engine.core import checks
from engine.errors import TASK_FAILURES
from engine.runner import alerts, liveness
from engine.runner.cohorts import Cohorts
from engine.runner.diagnosis_jobs import DiagnosisJobs
from engine.runner.ends import after_end
from engine.runner.execution import LOST, Outcome, RunExecution, device_kind
from engine.runner.paths import checked_root, run_folders
from engine.runner.queueing import create_run, environment, new_sweep_id, queue_runs, run_row  # noqa: F401
from engine.runner.runlog import INFO, RunLog
from engine.runner.writer import StoreWriter
from engine.training.checkpoints import CheckpointError
from engine.training.loop import Record
from storage import DatabaseFullError, Lease, LeaseLostError, RunNotFoundError, RunStore, StorageError

log = logging.getLogger(__name__)
ENDS = logging.getLogger(f"{__name__}.ends")  # each run's end in one line (the CLI's foreground prints its own)

PULL_POLL_S = 1.0
def delete_runs(store: RunStore, run_ids: Iterable[int], checkpoints: str | Path | None = None) -> list[str]:
    """Delete runs, their metrics, diagnostics and checkpoints; running runs are refused
    (stop them first). Only this database's own checkpoint folder of a run is deleted,
    never those of the database it was copied from (``engine.runner.paths``), and a copy's
    ``db-<uid>`` folder once it is left empty. A database whose identity does not name
    folders inside the checkpoint root (``paths.checked_root``) is refused with a
    ``CheckpointError`` before anything is deleted; a run whose uid does not is left, with
    its problem. Returns one message per run that was not deleted."""
    root = checked_root(store, checkpoints)
    problems = []
    for run_id in run_ids:
        try:
            folders = run_folders(store, store.runs.get_run(run_id).uid, root)
            store.runs.delete_run(run_id)
        except (StorageError, CheckpointError) as e:
            problems.append(str(e))
            continue
        try:
            folders.delete_own()
        except (CheckpointError, OSError) as e:
            problems.append(f"run {run_id} was deleted but its checkpoints were not ({e}); remove {folders.own}")
    return problems


class JobManager:
    """Trains runs in background threads, at most ``max_concurrent`` at once.

    ``on_step(run_id, step, loss)`` (loss None between reads) and
    ``on_record(run_id, record)`` and ``on_resume(run_id, note, skipped)`` (how a run trained
    before continues: ``RunExecution``) are optional hooks called from worker threads.
    With ``pull`` it also claims unowned queued runs from the database; ``max_runs``
    stops claiming after that many runs.
    """

    def __init__(
        self,
        store: RunStore,
        *,
        max_concurrent: int = 1,
        on_step: Callable[[int, int, float | None], None] | None = None,
        on_record: Callable[[int, Record], None] | None = None,
        on_resume: Callable[[int, str, list[str]], None] | None = None,
        pull: bool = False,
        max_runs: int | None = None,
        checkpoints: str | Path | None = None,
        cohorts: str | None = None,
    ):
        checks.whole("max_concurrent", max_concurrent, 1)
        self.store = store
        self.owner = liveness.current_owner()
        self.worker_id = f"{self.owner}:{uuid.uuid4().hex[:6]}"
        self.on_step, self.on_record, self.on_resume = on_step, on_record, on_resume
        self.pull, self.max_runs = pull, max_runs
        self.checkpoint_root = checked_root(store, checkpoints)  # a crafted identity: refused, nothing written
        self.writer = StoreWriter(store)
        self.started_runs = 0
        self.lost: set[int] = set()  # runs whose lease another claim took while this process trained them
        self.outcomes: dict[int, Outcome] = {}  # run id → how its last training here ended
        self._unreleased: dict[int, tuple[int, Outcome]] = {}  # run id → (lease, end) the database refused so far
        self._claiming = 0  # threads between reserving a run slot and holding the claimed run
        self._queue: queue.Queue[int | Lease | None] = queue.Queue()
        self._events: dict[int, threading.Event] = {}  # run id → its stop event
        self._interrupt = threading.Event()
        self._closing = threading.Event()
        self._pending: set[int] = set()
        self._current: dict[str, int] = {}  # thread name → run it trains
        self._logs: dict[int, RunLog] = {}  # run id → the log of the run training here, flushed by each beat
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._last_busy = time.monotonic()
        self._env: dict | None = None
        self.channel = liveness.Channel(store, self.owner, worker=self.worker_id, status=self._status,
                                        before=self._before_beat, sweep=True, requeue=pull)
        self.interrupted = self.channel.sweep()
        self.diagnoses = DiagnosisJobs(store, self.owner, self.checkpoint_root, self.channel)
        self.cohorts = Cohorts(self, cohorts)  # runs of a sweep that differ by seed, as one program
        host, pid = self.owner.rsplit(":", 1)
        store.workers.register_worker(self.worker_id, host, int(pid), device=device_kind(), concurrent=max_concurrent)
        self.channel.start()
        self._workers = [
            threading.Thread(target=self._work, name=f"basis-worker-{i}", daemon=True) for i in range(max_concurrent)
        ]
        for w in self._workers:
            w.start()

    # ------------------------------------------------------------------ requests

    def submit(self, configs: RunConfig | Iterable[RunConfig], *, sweep_id: str | None = None,
               tags: Iterable[str] = ()) -> list[int]:
        """Queue runs owned by this process, in one transaction (all or none); returns their
        ids in order."""
        configs = [configs] if isinstance(configs, RunConfig) else list(configs)
        if self._env is None:
            self._env = environment()
        ids = queue_runs(self.store, configs, sweep_id=sweep_id, tags=tags, owner=self.owner, env=self._env)
        self._enqueue(ids)
        return ids

    def train(self, run_ids: Iterable[int]) -> None:
        """Train here the queued runs ``run_ids`` that this process queued (owned by ``owner``)."""
        self._enqueue(list(run_ids))

    def resume(self, run_ids: Iterable[int]) -> list[int]:
        """Queue ended runs (interrupted, cancelled, failed) again here, to continue from
        their newest checkpoint; returns the ids that were moved (others are left as they are)."""
        moved = self.store.queue.requeue(list(run_ids), owner=self.owner)
        self._enqueue(moved)
        return moved

    def adopt_orphans(self) -> list[int]:
        """Take every queued run whose queuing process is gone (or that no process owns)
        to train here; their ids."""
        liveness.check_stale(self.store)
        ids = self.store.queue.adopt_queued(self.owner)
        self._enqueue(ids)
        return ids

    # diagnoses, on threads of their own (``engine.runner.diagnosis_jobs``)

    def diagnose(self, run_id: int, **settings) -> int:
        return self.diagnoses.diagnose(run_id, **settings)

    def rerun_diagnosis(self, diag_id: int) -> int:
        return self.diagnoses.rerun(diag_id)

    def cancel_diagnosis(self, diag_id: int) -> bool:
        return self.diagnoses.cancel(diag_id)

    def start_diagnosis(self, plan) -> int:
        return self.diagnoses.start(plan)

    def diagnosis_progress(self, diag_id: int) -> tuple[int, int] | None:
        return self.diagnoses.progress_of(diag_id)

    def _enqueue(self, ids: list[int]) -> None:
        for run_id in ids:
            with self._lock:
                self._pending.add(run_id)
                self._events.setdefault(run_id, threading.Event())
            self._queue.put(run_id)

    def cancel(self, run_id: int) -> bool:
        """Stop a run: at once if queued, within one step if running (it checkpoints)."""
        with self._lock:
            event = self._events.get(run_id)
        if event is not None:
            event.set()
        return self.store.runs.request_cancel(run_id)

    def interrupt(self) -> None:
        """Stop every run of this process, resumable: running runs checkpoint and end
        ``interrupted``; runs still queued here are marked ``interrupted`` too."""
        self._interrupt.set()
        with self._lock:
            events = list(self._events.values())
        for event in events:
            event.set()

    def pending(self) -> set[int]:
        """Ids queued here that have not ended yet."""
        with self._lock:
            return set(self._pending)

    def busy(self) -> bool:
        with self._lock:
            return bool(self._pending or self._current or self._claiming)

    def idle_seconds(self) -> float:
        with self._lock:
            busy = self._pending or self._current or self._claiming
            return 0.0 if busy else time.monotonic() - self._last_busy

    def wait(self, run_ids: Iterable[int] | None = None, timeout: float | None = None) -> bool:
        """Block until the given runs (default: all queued here) have ended; False on timeout."""
        targets = set(run_ids) if run_ids is not None else None
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._idle:
            while self._pending & (targets if targets is not None else self._pending):
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._idle.wait(remaining if remaining is not None else 1.0)
        return True

    @property
    def closed(self) -> bool:
        """Whether ``shutdown`` has been called."""
        return self._closing.is_set()

    def shutdown(self, cancel_running: bool = False, timeout: float | None = 60.0) -> None:
        """Stop the workers: running runs are interrupted (checkpointed, resumable), or
        cancelled when ``cancel_running``; every write is flushed."""
        if cancel_running:
            for run_id in self.pending():
                self.cancel(run_id)
        else:
            self.interrupt()
        self._closing.set()
        for _ in self._workers:
            self._queue.put(None)
        for w in self._workers:
            w.join(timeout)
        self.writer.flush(timeout)
        self.channel.stop(timeout)  # last: runs still saving their final checkpoint keep beating until they end
        self._release()
        try:
            self.store.workers.end_worker(self.worker_id)
        except StorageError as e:  # a full disk is said by the runs it stopped
            (log.debug if isinstance(e, DatabaseFullError) else log.warning)("could not mark worker %s stopped",
                                                                             self.worker_id)

    # ------------------------------------------------------------------ workers

    def _next(self) -> int | Lease | None:
        """The next run for a worker thread: the id of a queued one of ours (not claimed
        yet), else (pull) the lease of one claimed from the database, else wait; None
        when the manager closes."""
        while True:
            try:
                return self._queue.get(timeout=PULL_POLL_S if self.pull else None)  # an id, or None: close
            except queue.Empty:
                pass
            if self._closing.is_set() or self._interrupt.is_set():
                return None
            with self._lock:
                if self.max_runs is not None and self.started_runs >= self.max_runs:
                    continue
                self.started_runs += 1  # reserve a slot before claiming
                self._claiming += 1
            lease = None
            try:  # what is stale was queued again by the channel's sweep
                lease = self.store.queue.claim_next(self.owner, self.worker_id)
            except StorageError as e:
                log.warning("claiming failed: %s", e)
            with self._lock:
                self._claiming -= 1
                if lease is None:
                    self.started_runs -= 1
                    continue
                self._pending.add(lease.run_id)
                self._events.setdefault(lease.run_id, threading.Event())
            return lease

    def _work(self) -> None:
        name = threading.current_thread().name
        while (item := self._next()) is not None:
            run_id, epoch = (item.run_id, item.epoch) if isinstance(item, Lease) else (item, None)
            if self.cohorts.skip(run_id):
                continue  # a cohort of this manager claimed it: it ends there
            try:
                with self._lock:
                    self._current[name] = run_id
                if not self.cohorts.run(run_id, epoch):
                    self._run(run_id, epoch)
            except TASK_FAILURES:  # a worker survives a run that fails
                log.exception("run %s crashed the worker", run_id)
            finally:
                self._done(name, run_id)

    def _done(self, thread: str | None, run_id: int) -> None:
        """``run_id`` has ended here (trained by ``thread``)."""
        with self._idle:
            if thread is not None:
                self._current.pop(thread, None)
            self._pending.discard(run_id)
            self._events.pop(run_id, None)
            self._last_busy = time.monotonic()
            self._idle.notify_all()

    def _run(self, run_id: int, epoch: int | None, source: Callable | None = None) -> None:
        """Train ``run_id``: under ``epoch`` when ``_next`` claimed it, else claim it first;
        ``source`` stands for ``train`` (a cohort's member: ``engine.runner.cohorts``)."""
        on_step, on_record, on_resume = self.on_step, self.on_record, self.on_resume
        run = RunExecution(
            self.store, self.writer, run_id, owner=self.owner, epoch=epoch,
            stop=self._events.get(run_id) or threading.Event(), interrupted=self._interrupt,
            checkpoints=self.checkpoint_root, channel=self.channel,
            on_step=(lambda step, loss: on_step(run_id, step, loss)) if on_step else None,
            on_record=(lambda record: on_record(run_id, record)) if on_record else None,
            on_resume=(lambda note, skipped: on_resume(run_id, note, skipped)) if on_resume else None,
            source=source,
        )
        if epoch is None:
            if not run.claim(self.worker_id):
                return  # interrupted before it started, or cancelled (deleted, claimed elsewhere) while queued
            with self._lock:
                if self.pull:
                    self.started_runs += 1
        with RunLog(self.store, self.writer, run_id, run.lease) as run_log:
            run_log.add(INFO, f"claimed by {self.owner} (lease {run.lease})")
            with self._lock:
                self._logs[run_id] = run_log
            try:
                outcome = run.execute()
            except TASK_FAILURES as e:  # never keep a lease on a run this process no longer trains
                log.exception("run %s crashed the worker", run_id)
                outcome = Outcome("interrupted", f"the worker {self.owner} stopped training it ({type(e).__name__}: "
                                                 f"{str(e).splitlines()[0] if str(e) else ''}); resume it", False, "crash")
            finally:
                with self._lock:
                    self._logs.pop(run_id, None)
        self.outcomes[run_id] = outcome
        if outcome.status == LOST:
            with self._lock:
                self.lost.add(run_id)
            return
        run_log.end(outcome.status, outcome.error)
        self.writer.flush()
        line = f"run {run_id} {outcome.status}" + (f": {outcome.error.splitlines()[0]}" if outcome.error else "")
        (ENDS.warning if outcome.status in ("failed", "interrupted") else ENDS.info)("%s", line)
        if not outcome.released:
            with self._lock:
                self._unreleased[run_id] = (run.lease, outcome)
            self._release()
            return
        alerts.notify_end(self.store, run_id, outcome.status, outcome.error)
        if not self._interrupt.is_set():
            queued = after_end(self.store, run_id, owner=None if self.pull else self.owner)
            if queued and not self.pull:
                self._enqueue(queued)

    def _release(self) -> None:
        """Store the end of every run whose end the database refused so far (its disk was
        full, it crashed): until then the run reads ``running`` under this live process,
        which no reader would ever mark interrupted. Tried at every beat of the manager."""
        with self._lock:
            waiting = dict(self._unreleased)
        for run_id, (epoch, outcome) in waiting.items():
            try:
                self.store.runs.set_status(run_id, outcome.status, error=outcome.error, epoch=epoch, cause=outcome.cause)
            except (LeaseLostError, RunNotFoundError):
                pass  # another claim took it, or it was deleted: not ours to release any more
            except StorageError as e:
                log.debug("run %s: its end is not stored yet (%s)", run_id, e)
                continue
            with self._lock:
                self._unreleased.pop(run_id, None)
            alerts.notify_end(self.store, run_id, outcome.status, outcome.error)

    def unreleased(self) -> set[int]:
        """Runs whose end this process could not store yet (see ``_release``)."""
        with self._lock:
            return set(self._unreleased)

    def _status(self) -> tuple[int | None, list[int]]:
        """What the channel stamps for the worker: the run it trains now (one of them), and its
        queued runs (so no sweep releases them)."""
        with self._lock:
            current = next(iter(self._current.values()), None)
            return current, sorted(self._pending - set(self._current.values()))

    def _before_beat(self) -> None:
        """What the manager does first at every beat of its channel: the ends of runs not stored
        yet are tried again, and the lines its training runs logged are queued for the database."""
        if self._unreleased:
            self._release()
        with self._lock:
            logs = list(self._logs.values())
        for run_log in logs:  # what the training runs logged since the last beat
            run_log.flush()
