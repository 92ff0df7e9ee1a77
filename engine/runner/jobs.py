"""Background runs: claiming, training, heartbeats, checkpoints, cancel, interrupt.

Every run is a row in the database first (status ``queued``). A ``JobManager``
trains runs in worker threads of this process:

- runs it queued itself (``submit``: the dashboard, ``run``/``sweep`` of the CLI),
  marked with this process as their owner, or runs it was asked to ``resume``;
- with ``pull=True`` (``python -m engine worker``) also any unowned queued run in
  the database, whoever queued it (``sweep --queue-only``, the dashboard's "queue for
  workers", another machine), and queued runs whose queuing process died.

Claiming is atomic across processes and hosts (``RunStore.claim`` / ``claim_next``:
``FOR UPDATE SKIP LOCKED`` on PostgreSQL, ``BEGIN IMMEDIATE`` on SQLite), so every run
is trained by exactly one process. A claimed run (``running``) streams its metrics
through a ``StoreWriter`` (writes outlast a busy database), is stamped by a
``liveness.Heartbeat`` every ``liveness.HEARTBEAT_S`` seconds, and checkpoints its state
in the run's folders under ``engine.runner.paths.checkpoint_root()``, named by the database's
identity (``engine.runner.paths.run_folders``; see ``engine.training.loop.train``). It ends as
``finished``, ``failed`` (with the error), ``cancelled`` (``RunStore.request_cancel``
from any process) or ``interrupted`` (``interrupt()``: a signal; resumable). A run
that was trained before continues from its newest checkpoint; without one (the
checkpoint directory is not shared with the machine that trained it) it restarts
from step 0 and its notes say why.

Liveness: a process that dies leaves ``running`` rows whose heartbeat stops; any
reader marks them ``interrupted`` by the rule ``engine.runner.liveness`` states.

Faults: a database that cannot be reached (PostgreSQL restarting) is waited for, the
run's writes buffered (``StoreWriter``). A full disk, the database's or the checkpoints',
ends the run ``interrupted`` with one line, ``disk full: free space on PATH and run
`python -m engine resume N```. Should the database refuse even that end (its disk still
full), or a run crash its thread, the manager keeps trying to store the end at every beat
of its heartbeat: a live process never holds the lease of a run it no longer trains.

Exactly once (``storage.lease``): every claim of a run takes a new lease, an epoch,
which ``execute`` carries into every write of the run (metrics, heartbeats, status,
notes, checkpoint step) and into the checkpoint folder (``epoch-<E>``). An owner that
stalled past the timeout and was replaced finds at its next write, heartbeat or poll
that its lease is gone (``LeaseLostError``): it stops at once without a checkpoint or
any other write, logs one line, and its process exits (``run``) or moves on (``worker``).
A resume continues from the newest valid checkpoint, of any epoch, at or before the
run's recorded ``checkpoint_step``: that record is written by the lease holder after
the metrics of every step before it, so the stored history never has a gap.
"""

from __future__ import annotations

import logging
import platform
import queue
import subprocess
import threading
import time
import traceback
import uuid
from importlib import metadata
from pathlib import Path
from typing import Callable, Iterable, NamedTuple

import jax

from engine.config import ConfigError, RunConfig
from engine.core import checks
from engine.runner import alerts, hosts, liveness
from engine.runner.paths import checkpoint_root, run_folders
from engine.runner.runlog import INFO, RunLog
from engine.runner.writer import StoreWriter
from engine.training import parallel
from engine.training.checkpoints import CheckpointDiskFull, CheckpointError, Recorded, RunCheckpoints
from engine.training.loop import Record, TrainingDiverged, train
from storage import (
    DatabaseBusyError,
    DatabaseFullError,
    Lease,
    LeaseLostError,
    RunNotFoundError,
    RunStore,
    StorageError,
)

log = logging.getLogger(__name__)

CANCEL_POLL_S = 0.25
PULL_POLL_S = 1.0
_PACKAGES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy", "tiktoken", "datasets", "SQLAlchemy",
             "streamlit")


def environment() -> dict:
    """Package versions, git commit and device, stored with every run."""
    versions = {"python": platform.python_version()}
    for name in _PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True, text=True, timeout=5
        ).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {"versions": versions, "git_commit": commit, "device": device_kind()}


def device_kind(count: int = 1) -> str:
    """``gpu: NVIDIA H200``, and ``gpu: NVIDIA H200 × 4`` for a run on 4 such devices
    (``app.tables.device_parts`` reads it back)."""
    dev = jax.devices()[0]
    return f"{dev.platform}: {dev.device_kind}" + (f" × {count}" if count > 1 else "")


def new_sweep_id() -> str:
    """A short id shared by the runs of one launch."""
    return time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]


def run_row(config: RunConfig, env: dict, *, owner: str | None = None, sweep_id: str | None = None,
            tags: Iterable[str] = ()) -> dict:
    """The ``RunStore.create_run`` arguments of one run of ``config``."""
    return dict(
        name=config.label(),
        config=config.to_dict(),
        estimator="exact" if config.is_exact else config.estimator,
        rank=None if config.is_exact else config.effective_rank,
        lam=config.lam,
        seed=config.seed,
        preset=config.preset,
        steps=config.steps,
        sweep_id=sweep_id,
        tags=list(tags),
        owner=owner,
        **env,
    )


def create_run(store: RunStore, config: RunConfig, env: dict, *, owner: str | None = None,
               sweep_id: str | None = None, tags: Iterable[str] = ()) -> int:
    """Queue one run; ``owner`` None leaves it to any worker."""
    return store.create_run(**run_row(config, env, owner=owner, sweep_id=sweep_id, tags=tags))


def queue_runs(store: RunStore, configs: Iterable[RunConfig], *, sweep_id: str | None = None,
               tags: Iterable[str] = (), owner: str | None = None, env: dict | None = None) -> list[int]:
    """Queue runs in one transaction, all or none (``owner`` None: for any worker, as
    ``--queue-only``); their ids in order."""
    env, sweep_id = env or environment(), sweep_id or new_sweep_id()
    tags = list(tags)
    return store.create_runs([run_row(c, env, owner=owner, sweep_id=sweep_id, tags=tags) for c in configs])


def delete_runs(store: RunStore, run_ids: Iterable[int], checkpoints: str | Path | None = None) -> list[str]:
    """Delete runs, their metrics, diagnostics and checkpoints; running runs are refused
    (stop them first). Only this database's own checkpoint folder of a run is deleted,
    never those of the database it was copied from (``engine.runner.paths``). Returns one
    message per run that was not deleted."""
    root = Path(checkpoints) if checkpoints else checkpoint_root(store.url)
    problems = []
    for run_id in run_ids:
        try:
            folders = run_folders(store, store.get_run(run_id).uid, root)
            store.delete_run(run_id)
        except StorageError as e:
            problems.append(str(e))
            continue
        try:
            RunCheckpoints(folders.own, keep=1).delete_all()
        except (CheckpointError, OSError) as e:
            problems.append(f"run {run_id} was deleted but its checkpoints were not ({e}); remove {folders.own}")
    return problems


def report_if_sweep_ended(store: RunStore, run_id: int) -> int | None:
    """After ``run_id`` ended: when it belongs to a sweep that asks for a report (tagged
    ``engine.runner.reports.AUTO_REPORT_TAGS``) and no run of that sweep is still queued,
    running or interrupted, build the sweep's report and store it with the sweep
    (replacing its earlier one); the report's id, else None. A failure is logged, never
    raised: the runs are what matters."""
    try:
        from engine.runner import reports

        return reports.report_if_sweep_ended(store, run_id)
    except Exception:  # noqa: BLE001 — a report must never take a worker down
        log.warning("the report of run %s's sweep could not be built", run_id, exc_info=True)
        return None


class _Checkpoints(Recorded):
    """A run's ``RunCheckpoints`` under its owner's lease: saves go to the lease's epoch
    folder and only while the lease holds, each saved step is recorded in the database
    (fenced), and a resume trusts only checkpoints at or before the recorded step."""

    def __init__(self, inner: RunCheckpoints, store: RunStore, writer: StoreWriter, run_id: int, epoch: int,
                 recorded: int | None):
        super().__init__(inner, recorded)
        self.store, self.writer, self.run_id, self.epoch = store, writer, run_id, epoch

    def save(self, step, state, extra, *, final=False):
        lost = self.writer.lost(self.run_id, self.epoch)
        if lost is not None:
            raise lost
        try:
            current, _ = self.store.run_lease(self.run_id)
        except DatabaseBusyError:
            current = self.epoch  # cannot tell now; the save goes to this lease's own folder anyway
        if current != self.epoch:
            raise LeaseLostError(self.run_id, self.epoch, current)
        self.inner.save(step, state, extra, final=final)
        self.writer.call(self.run_id, self.writer.store.set_checkpoint_step, self.run_id, step, epoch=self.epoch)


class JobManager:
    """Trains runs in background threads, at most ``max_concurrent`` at once.

    ``on_step(run_id, step, loss)`` (loss None between reads) and
    ``on_record(run_id, record)`` are optional hooks called from worker threads.
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
        pull: bool = False,
        max_runs: int | None = None,
        checkpoints: str | Path | None = None,
    ):
        checks.whole("max_concurrent", max_concurrent, 1)
        self.store = store
        self.owner = liveness.current_owner()
        self.worker_id = f"{self.owner}:{uuid.uuid4().hex[:6]}"
        self.on_step, self.on_record = on_step, on_record
        self.pull, self.max_runs = pull, max_runs
        self.checkpoint_root = Path(checkpoints) if checkpoints else checkpoint_root(store.url)
        self.writer = StoreWriter(store)
        self.interrupted = liveness.check_stale(store)
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
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._last_busy = time.monotonic()
        self._env: dict | None = None
        self._diagnoses: dict[int, tuple[int, int]] = {}  # diagnosis id → progress, while it computes
        self._diagnosis_stops: dict[int, threading.Event] = {}  # diagnosis id → its cancel event
        host, pid = self.owner.rsplit(":", 1)
        store.register_worker(self.worker_id, host, int(pid), device=device_kind(), concurrent=max_concurrent)
        self._heartbeat = liveness.Heartbeat(self._beat, name="basis-manager-heartbeat").start()
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

    def resume(self, run_ids: Iterable[int]) -> list[int]:
        """Queue ended runs (interrupted, cancelled, failed) again here, to continue from
        their newest checkpoint; returns the ids that were moved (others are left as they are)."""
        moved = self.store.requeue(list(run_ids), owner=self.owner)
        self._enqueue(moved)
        return moved

    def adopt_orphans(self) -> list[int]:
        """Take every queued run whose queuing process is gone (or that no process owns)
        to train here; their ids."""
        liveness.check_stale(self.store)
        ids = self.store.adopt_queued(self.owner)
        self._enqueue(ids)
        return ids

    def diagnose(self, run_id: int, **settings) -> int:
        """Start a diagnosis of ``run_id`` (``engine.runner.diagnosis.plan_diagnosis``'s settings) on a
        thread of its own; its id, once the settings are validated and its row stored.
        ``diagnosis_progress(id)`` follows it while it computes."""
        from engine.runner import diagnosis

        plan = diagnosis.plan_diagnosis(self.store, run_id, checkpoints=self.checkpoint_root, **settings)
        return self.start_diagnosis(plan)

    def rerun_diagnosis(self, diag_id: int) -> int:
        """Run stored diagnosis ``diag_id`` again with its settings, as a new diagnosis; its id."""
        from engine.runner import diagnosis

        return self.start_diagnosis(diagnosis.replan(self.store, diag_id, self.checkpoint_root))

    def cancel_diagnosis(self, diag_id: int) -> bool:
        """Stop a diagnosis (computed here or by any process): at once when queued, after
        its current step when running; it keeps the results of the work done."""
        event = self._diagnosis_stops.get(diag_id)
        if event is not None:
            event.set()
        return self.store.request_cancel_diagnostic(diag_id)

    def start_diagnosis(self, plan) -> int:
        """Store and start ``plan`` (``engine.runner.diagnosis.Plan``) on a thread of its own; its id."""
        from engine.runner import diagnosis

        diag_id = diagnosis.start(self.store, plan)
        self._diagnoses[diag_id] = (0, plan.work)
        stop = self._diagnosis_stops[diag_id] = threading.Event()

        def progress(done: int, total: int) -> None:
            self._diagnoses[diag_id] = (done, total)

        def job() -> None:
            try:
                diagnosis.execute(self.store, diag_id, plan, owner=self.owner, on_progress=progress, cancel=stop)
            except Exception:  # noqa: BLE001 — recorded on the diagnosis by execute
                log.warning("diagnosis %s failed", diag_id, exc_info=True)
            finally:
                self._diagnoses.pop(diag_id, None)
                self._diagnosis_stops.pop(diag_id, None)

        threading.Thread(target=job, name=f"basis-diagnosis-{diag_id}", daemon=True).start()
        return diag_id

    def diagnosis_progress(self, diag_id: int) -> tuple[int, int] | None:
        """``(settings done, total)`` of a diagnosis this manager is computing, else None."""
        return self._diagnoses.get(diag_id)

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
        return self.store.request_cancel(run_id)

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
        self._heartbeat.stop()
        for _ in self._workers:
            self._queue.put(None)
        for w in self._workers:
            w.join(timeout)
        self.writer.flush(timeout)
        self._release()
        try:
            self.store.end_worker(self.worker_id)
        except StorageError:
            log.warning("could not mark worker %s stopped", self.worker_id)

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
            try:
                liveness.check_stale(self.store)
                liveness.requeue_orphaned_runs(self.store)
                lease = self.store.claim_next(self.owner, self.worker_id)
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
            try:
                with self._lock:
                    self._current[name] = run_id
                self._run(run_id, epoch)
            except Exception:  # a worker must survive any single run
                log.exception("run %s crashed the worker", run_id)
            finally:
                with self._idle:
                    self._current.pop(name, None)
                    self._pending.discard(run_id)
                    self._events.pop(run_id, None)
                    self._last_busy = time.monotonic()
                    self._idle.notify_all()

    def _run(self, run_id: int, epoch: int | None) -> None:
        """Train ``run_id``: under ``epoch`` when ``_next`` claimed it, else claim it first."""
        event = self._events.get(run_id) or threading.Event()
        if epoch is None:
            if self._interrupt.is_set():
                self.writer.call(run_id, self.store.set_status, run_id, "interrupted",
                                 error="interrupted before it started; resume it to train it")
                self.writer.flush()
                return
            epoch = self.store.claim(run_id, self.owner, self.worker_id)
            if epoch is None:
                return  # cancelled (or deleted, or claimed elsewhere) while queued
            with self._lock:
                if self.pull:
                    self.started_runs += 1
        with RunLog(self.store, self.writer, run_id, epoch) as run_log:
            run_log.add(INFO, f"claimed by {self.owner} (lease {epoch})")
            try:
                outcome = execute(
                    self.store, self.writer, run_id, epoch=epoch, owner=self.owner, stop=event,
                    interrupted=self._interrupt, checkpoints=self.checkpoint_root,
                    on_step=(lambda step, loss: self.on_step(run_id, step, loss)) if self.on_step else None,
                    on_record=(lambda record: self.on_record(run_id, record)) if self.on_record else None,
                )
            except Exception as e:  # noqa: BLE001 — never keep a lease on a run this process no longer trains
                log.exception("run %s crashed the worker", run_id)
                outcome = Outcome("interrupted", f"the worker {self.owner} stopped training it ({type(e).__name__}: "
                                                 f"{str(e).splitlines()[0] if str(e) else ''}); resume it", False)
        self.outcomes[run_id] = outcome
        if outcome.status == LOST:
            with self._lock:
                self.lost.add(run_id)
            return
        run_log.end(outcome.status, outcome.error)
        self.writer.flush()
        line = f"run {run_id} {outcome.status}" + (f": {outcome.error.splitlines()[0]}" if outcome.error else "")
        (log.warning if outcome.status in ("failed", "interrupted") else log.info)("%s", line)
        if not outcome.released:
            with self._lock:
                self._unreleased[run_id] = (epoch, outcome)
            self._release()
            return
        alerts.notify_end(self.store, run_id, outcome.status, outcome.error)
        if not self._interrupt.is_set():
            report_if_sweep_ended(self.store, run_id)

    def _release(self) -> None:
        """Store the end of every run whose end the database refused so far (its disk was
        full, it crashed): until then the run reads ``running`` under this live process,
        which no reader would ever mark interrupted. Tried at every beat of the manager."""
        with self._lock:
            waiting = dict(self._unreleased)
        for run_id, (epoch, outcome) in waiting.items():
            try:
                self.store.set_status(run_id, outcome.status, error=outcome.error, epoch=epoch)
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

    def _beat(self) -> None:
        """The worker's sign of life, and its queued runs' (so no reader releases them);
        the ends of runs not stored yet are tried again."""
        if self._unreleased:
            self._release()
        with self._lock:
            current = next(iter(self._current.values()), None)
            queued = sorted(self._pending - set(self._current.values()))
        self.writer.call(None, self.store.worker_heartbeat, self.worker_id, current)
        if queued:
            self.writer.call(None, self.store.touch_queued, queued, self.owner)


LOST = "lost"  # what ``execute`` returns for a run whose lease another claim took


def execute(
    store: RunStore,
    writer: StoreWriter,
    run_id: int,
    *,
    epoch: int,
    owner: str,
    stop: threading.Event,
    interrupted: threading.Event,
    checkpoints: Path,
    on_step: Callable[[int, float | None], None] | None = None,
    on_record: Callable[[Record], None] | None = None,
) -> Outcome:
    """Train the claimed run ``run_id`` to its end under the lease ``epoch``; return its
    ``Outcome``: (status, error) as written, or (``LOST``, the reason) when another claim
    took the run: then nothing more was written to it, not even a checkpoint.

    A database that cannot be reached is waited for (the writer retries). A full disk, of
    the database or of the checkpoints, ends the run ``interrupted`` with the one-line reason
    ``disk full: … resume N``; should the database refuse even that status, the outcome
    says it is not ``released`` (the caller writes it later)."""
    writer.forget(run_id)  # a failure of an earlier training of this run is not this one's
    run = store.get_run(run_id)
    steps_done = [run.steps_done]
    notes: list[str] = []
    lost: list[LeaseLostError] = []

    def lease_lost() -> bool:
        refusal = writer.lost(run_id, epoch)
        if refusal is not None and not lost:
            lost.append(refusal)
        return bool(lost)

    last_poll = [time.monotonic()]

    def should_stop() -> bool:
        if stop.is_set() or interrupted.is_set() or lease_lost():
            return True
        if writer.failure(run_id) is not None:
            return True  # deleted meanwhile, or the database refuses writes
        if time.monotonic() - last_poll[0] >= CANCEL_POLL_S:
            last_poll[0] = time.monotonic()
            try:
                current, cancel = store.run_lease(run_id)
                if current != epoch:
                    lost.append(LeaseLostError(run_id, epoch, current))
                    return True
                if cancel:
                    stop.set()
            except RunNotFoundError:
                stop.set()
            except StorageError:
                pass  # busy: look again at the next poll
        return stop.is_set()

    def stepped(step: int, loss: float | None) -> None:
        steps_done[0] = step
        if on_step:
            on_step(step, loss)

    def resumed(step: int, skipped: list[str]) -> None:
        steps_done[0] = step
        had_history = run.steps_done > 0 or run.checkpoint_step is not None
        if step:
            notes.append(f"resumed from the checkpoint at step {step}")
        elif had_history:
            notes.append(f"restarted from step 0: no readable checkpoint in {ckpt_dir} (is the checkpoint "
                         "directory shared with the machine that trained it?)")
        notes.extend(f"skipped: {s}" for s in skipped)
        # always: an owner killed before its first heartbeat or checkpoint left rows (step 0's)
        # that neither records; what this claim recomputes is deleted before it is written
        writer.call(run_id, store.delete_metrics_after, run_id, step if step else -1, epoch=epoch)
        writer.heartbeat(run_id, step, owner=owner, epoch=epoch)

    heartbeat = liveness.Heartbeat(lambda: writer.heartbeat(run_id, steps_done[0], owner=owner, epoch=epoch),
                                   name=f"basis-heartbeat-{run_id}").start()
    try:
        folders = run_folders(store, run.uid, checkpoints)
        ckpt_dir = folders.own
        config = RunConfig.from_dict(run.config)
        writer.call(run_id, store.set_device, run_id, device_kind(parallel.device_count(config)), epoch=epoch)
        # the followers of a multi-host run train it too; first, as opening checkpoints is collective there
        hosts.announce({"uid": run.uid, "config": run.config, "checkpoints": str(ckpt_dir),
                        "borrowed": [str(p) for p in folders.borrowed], "keep": config.checkpoint_keep,
                        "epoch": epoch, "recorded": run.checkpoint_step})
        ckpt = _Checkpoints(folders.open(keep=config.checkpoint_keep, name=f"run {run_id}", epoch=epoch),
                            store, writer, run_id, epoch, run.checkpoint_step)
        for record in train(config, should_stop=should_stop, on_step=stepped, checkpoints=ckpt, resume=True,
                            on_resume=resumed):
            if lease_lost():
                break
            writer.metrics(run_id, [(record.step, record.wall_time, k, v) for k, v in record.values.items()],
                           epoch=epoch)
            if on_record:
                on_record(record)
        if lease_lost():
            raise lost[0]
        failure = writer.failure(run_id)
        if failure is not None:
            status, error = _ended_by(failure, run_id, store)
        elif interrupted.is_set():
            status, error = "interrupted", "interrupted by a signal; resume it to continue from its checkpoint"
        elif stop.is_set():
            status, error = "cancelled", None
        else:
            status, error = "finished", None
    except LeaseLostError as e:
        lost[:] = [e]
    except TrainingDiverged as e:
        status, error = "failed", str(e)
        steps_done[0] = e.step  # the steps run past it before the loss was read are not progress
    except CheckpointDiskFull as e:
        status, error = "interrupted", disk_full(run_id, e.path, str(e))
    except (ConfigError, CheckpointError) as e:
        status, error = "failed", str(e)
    except Exception as e:  # noqa: BLE001 — recorded on the run, never raised into the worker
        status, error = "failed", f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=8)}"
    finally:
        heartbeat.stop()
    released = threading.Event()
    if not lost:
        if notes:
            writer.final(run_id, store.append_notes, run_id, "; ".join(notes), epoch=epoch)
        writer.heartbeat(run_id, steps_done[0], owner=owner, epoch=epoch)

        def end() -> None:
            store.set_status(run_id, status, error=error, epoch=epoch)
            released.set()

        writer.final(run_id, end)
        writer.flush()
        lease_lost()  # the final writes themselves may find the lease gone
    if lost:  # what it still queued under this lease is dropped by the writer, not written
        message = str(lost[0])
        log.warning("%s", message)
        return Outcome(LOST, message)
    return Outcome(status, error, released.is_set())


class Outcome(NamedTuple):
    """How ``execute`` left a run: its ``status`` and ``error``, and whether that status is
    stored (``released``: False when the database refused it, e.g. its disk is full, so
    the run still reads ``running`` under this lease)."""

    status: str
    error: str | None
    released: bool = True


def disk_full(run_id: int, where, detail: str) -> str:
    """The one-line reason of a run stopped by a full disk, naming the disk and the resume."""
    return (f"disk full: free space on {where} and run `python -m engine resume {run_id}` "
            f"(it continues from its last checkpoint); {detail}")


def _ended_by(failure: StorageError, run_id: int, store: RunStore) -> tuple[str, str | None]:
    """(status, error) of a run whose writes the database refused for good: ``interrupted``
    (resumable) when its disk is full, ``cancelled`` when the run was deleted, else ``failed``."""
    if isinstance(failure, DatabaseFullError):
        url = store.engine.url
        where = (Path(url.database).parent if url.get_backend_name() == "sqlite" and url.database
                 else f"the disk of the database server ({store.url})")
        return "interrupted", disk_full(run_id, where, f"the database refused a write: {failure.reason}")
    if isinstance(failure, RunNotFoundError):
        return "cancelled", None
    return "failed", f"the database refused a write of the run: {failure}"
