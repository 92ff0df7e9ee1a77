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
through a ``StoreWriter`` (writes outlast a busy database), is stamped by a heartbeat
thread every ``HEARTBEAT_S`` seconds, and checkpoints its state under
``engine.checkpoints.checkpoint_root()`` (see ``train.train``). It ends as
``finished``, ``failed`` (with the error), ``cancelled`` (``RunStore.request_cancel``
from any process) or ``interrupted`` (``interrupt()``: a signal; resumable). A run
that was trained before continues from its newest checkpoint; without one (the
checkpoint directory is not shared with the machine that trained it) it restarts
from step 0 and its notes say why.

Liveness (``engine.liveness``): a process that dies leaves ``running`` rows whose
heartbeat stops; any reader marks them ``interrupted`` within ``STALE_AFTER_S``
(at once on the same host, where a dead pid is seen).
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
from typing import Callable, Iterable

import jax

from engine.config import ConfigError, RunConfig
from engine.core import checks
from engine.runner import liveness
from engine.runner.paths import checkpoint_root
from engine.runner.writer import StoreWriter
from engine.training.checkpoints import CheckpointError, RunCheckpoints, run_dir
from engine.training.loop import Record, TrainingDiverged, train
from storage import RunNotFoundError, RunStore, StorageError

log = logging.getLogger(__name__)

HEARTBEAT_S = 2.0
CANCEL_POLL_S = 0.25
STALE_AFTER_S = 60.0
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


def device_kind() -> str:
    dev = jax.devices()[0]
    return f"{dev.platform}: {dev.device_kind}"


def new_sweep_id() -> str:
    """A short id shared by the runs of one launch."""
    return time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]


def create_run(store: RunStore, config: RunConfig, env: dict, *, owner: str | None = None,
               sweep_id: str | None = None, tags: Iterable[str] = ()) -> int:
    """Queue one run; ``owner`` None leaves it to any worker."""
    return store.create_run(
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


def queue_runs(store: RunStore, configs: Iterable[RunConfig], *, sweep_id: str | None = None,
               tags: Iterable[str] = ()) -> list[int]:
    """Queue runs for any worker (``--queue-only``); their ids in order."""
    env, sweep_id = environment(), sweep_id or new_sweep_id()
    return [create_run(store, c, env, sweep_id=sweep_id, tags=tags) for c in configs]


def check_stale(store: RunStore) -> list[int]:
    """Mark runs whose worker died ``interrupted`` and release queued runs whose queuing
    process died to any worker; the ids marked interrupted. Called on every read that
    shows statuses (``list``, ``show``, the dashboard's pages)."""
    liveness.release_orphans(store, STALE_AFTER_S)
    return liveness.mark_stale_interrupted(store, STALE_AFTER_S)


def delete_runs(store: RunStore, run_ids: Iterable[int], checkpoints: str | Path | None = None) -> list[str]:
    """Delete runs, their metrics, diagnostics and checkpoints; running runs are refused
    (stop them first). Returns one message per run that was not deleted."""
    root = Path(checkpoints) if checkpoints else checkpoint_root(store.url)
    problems = []
    for run_id in run_ids:
        try:
            uid = store.get_run(run_id).uid
            store.delete_run(run_id)
        except StorageError as e:
            problems.append(str(e))
            continue
        try:
            RunCheckpoints(run_dir(root, uid), keep=1).delete_all()
        except (CheckpointError, OSError) as e:
            problems.append(f"run {run_id} was deleted but its checkpoints were not ({e}); remove {run_dir(root, uid)}")
    return problems


class _Checkpoints:
    """A run's ``RunCheckpoints`` that also records each saved step in the database."""

    def __init__(self, inner: RunCheckpoints, writer: StoreWriter, run_id: int):
        self.inner, self.writer, self.run_id = inner, writer, run_id

    def latest_step(self):
        return self.inner.latest_step()

    def restore_latest_valid(self, target):
        return self.inner.restore_latest_valid(target)

    def save(self, step, state, extra, *, final=False):
        self.inner.save(step, state, extra, final=final)
        self.writer.call(self.run_id, "set_checkpoint_step", self.run_id, step)


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
        self.interrupted = check_stale(store)
        self.started_runs = 0
        self._claiming = 0  # threads between reserving a run slot and holding the claimed run
        self._queue: queue.Queue[int | None] = queue.Queue()
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
        self._beat = threading.Thread(target=self._beat_loop, name="basis-manager-heartbeat", daemon=True)
        self._beat.start()
        self._workers = [
            threading.Thread(target=self._work, name=f"basis-worker-{i}", daemon=True) for i in range(max_concurrent)
        ]
        for w in self._workers:
            w.start()

    # ------------------------------------------------------------------ requests

    def submit(self, configs: RunConfig | Iterable[RunConfig], *, sweep_id: str | None = None,
               tags: Iterable[str] = ()) -> list[int]:
        """Queue runs owned by this process; returns their ids in order."""
        configs = [configs] if isinstance(configs, RunConfig) else list(configs)
        if self._env is None:
            self._env = environment()
        sweep_id = sweep_id or new_sweep_id()
        ids = [create_run(self.store, c, self._env, owner=self.owner, sweep_id=sweep_id, tags=tags) for c in configs]
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
        check_stale(self.store)
        ids = self.store.adopt_queued(self.owner)
        self._enqueue(ids)
        return ids

    def diagnose(self, run_id: int, **settings) -> int:
        """Start a diagnosis of ``run_id`` (``engine.diagnosis.plan_diagnosis``'s settings) on a
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
        for _ in self._workers:
            self._queue.put(None)
        for w in self._workers:
            w.join(timeout)
        self.writer.flush(timeout)
        try:
            self.store.end_worker(self.worker_id)
        except StorageError:
            log.warning("could not mark worker %s stopped", self.worker_id)

    # ------------------------------------------------------------------ workers

    def _next(self) -> int | None:
        """The next run id for a worker thread: a queued one of ours, else (pull) one
        claimed from the database, else wait."""
        while True:
            try:
                return self._queue.get(timeout=PULL_POLL_S if self.pull else None)
            except queue.Empty:
                pass
            if self._closing.is_set() or self._interrupt.is_set():
                return None
            with self._lock:
                if self.max_runs is not None and self.started_runs >= self.max_runs:
                    continue
                self.started_runs += 1  # reserve a slot before claiming
                self._claiming += 1
            run_id = None
            try:
                check_stale(self.store)
                liveness.requeue_orphaned_runs(self.store)
                run_id = self.store.claim_next(self.owner, self.worker_id)
            except StorageError as e:
                log.warning("claiming failed: %s", e)
            with self._lock:
                self._claiming -= 1
                if run_id is None:
                    self.started_runs -= 1
                    continue
                self._pending.add(run_id)
                self._events.setdefault(run_id, threading.Event())
            return -run_id  # negative: already claimed

    def _work(self) -> None:
        name = threading.current_thread().name
        while (item := self._next()) is not None:
            claimed, run_id = item < 0, abs(item)
            try:
                with self._lock:
                    self._current[name] = run_id
                self._run(run_id, claimed)
            except Exception:  # a worker must survive any single run
                log.exception("run %s crashed the worker", run_id)
            finally:
                with self._idle:
                    self._current.pop(name, None)
                    self._pending.discard(run_id)
                    self._events.pop(run_id, None)
                    self._last_busy = time.monotonic()
                    self._idle.notify_all()

    def _run(self, run_id: int, claimed: bool) -> None:
        event = self._events.get(run_id) or threading.Event()
        if not claimed:
            if self._interrupt.is_set():
                self.writer.call(run_id, "set_status", run_id, "interrupted",
                                 error="interrupted before it started; resume it to train it")
                self.writer.flush()
                return
            if not self.store.claim(run_id, self.owner, self.worker_id):
                return  # cancelled (or deleted) while queued
            with self._lock:
                if self.pull:
                    self.started_runs += 1
        status, error = execute(
            self.store, self.writer, run_id, owner=self.owner, stop=event, interrupted=self._interrupt,
            checkpoints=self.checkpoint_root,
            on_step=(lambda step, loss: self.on_step(run_id, step, loss)) if self.on_step else None,
            on_record=(lambda record: self.on_record(run_id, record)) if self.on_record else None,
        )
        log.info("run %s %s%s", run_id, status, f": {error.splitlines()[0]}" if error else "")

    def _beat_loop(self) -> None:
        while not self._closing.wait(HEARTBEAT_S):
            with self._lock:
                current = next(iter(self._current.values()), None)
                queued = sorted(self._pending - set(self._current.values()))
            self.writer.call(None, "worker_heartbeat", self.worker_id, current)
            if queued:
                self.writer.call(None, "touch_queued", queued, self.owner)


def execute(
    store: RunStore,
    writer: StoreWriter,
    run_id: int,
    *,
    owner: str,
    stop: threading.Event,
    interrupted: threading.Event,
    checkpoints: Path,
    on_step: Callable[[int, float | None], None] | None = None,
    on_record: Callable[[Record], None] | None = None,
) -> tuple[str, str | None]:
    """Train the claimed run ``run_id`` to its end; return (status, error) as written."""
    run = store.get_run(run_id)
    steps_done = [run.steps_done]
    notes: list[str] = []
    stop_beat = threading.Event()

    def beat() -> None:
        while not stop_beat.wait(HEARTBEAT_S):
            writer.heartbeat(run_id, steps_done[0], owner=owner)

    last_poll = [time.monotonic()]

    def should_stop() -> bool:
        if stop.is_set() or interrupted.is_set():
            return True
        if writer.failure(run_id) is not None:
            return True  # deleted meanwhile, or the database refuses writes
        if time.monotonic() - last_poll[0] >= CANCEL_POLL_S:
            last_poll[0] = time.monotonic()
            try:
                if store.cancel_requested(run_id):
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
        if had_history:
            writer.call(run_id, "delete_metrics_after", run_id, step if step else -1)
        writer.heartbeat(run_id, step, owner=owner)

    beat_thread = threading.Thread(target=beat, name=f"basis-heartbeat-{run_id}", daemon=True)
    beat_thread.start()
    ckpt_dir = run_dir(checkpoints, run.uid)
    try:
        config = RunConfig.from_dict(run.config)
        ckpt = _Checkpoints(RunCheckpoints(ckpt_dir, keep=config.checkpoint_keep, name=f"run {run_id}"), writer, run_id)
        for record in train(config, should_stop=should_stop, on_step=stepped, checkpoints=ckpt, resume=True,
                            on_resume=resumed):
            writer.metrics(run_id, [(record.step, record.wall_time, k, v) for k, v in record.values.items()])
            if on_record:
                on_record(record)
        if interrupted.is_set():
            status, error = "interrupted", "interrupted by a signal; resume it to continue from its checkpoint"
        elif stop.is_set() or writer.failure(run_id) is not None:
            status, error = "cancelled", None
        else:
            status, error = "finished", None
    except TrainingDiverged as e:
        status, error = "failed", str(e)
    except (ConfigError, CheckpointError) as e:
        status, error = "failed", str(e)
    except Exception as e:  # noqa: BLE001 — recorded on the run, never raised into the worker
        status, error = "failed", f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=8)}"
    finally:
        stop_beat.set()
        beat_thread.join()
    if notes:
        writer.call(run_id, "append_notes", run_id, "; ".join(notes))
    writer.heartbeat(run_id, steps_done[0], owner=owner)
    writer.call(run_id, "set_status", run_id, status, error=error)
    writer.flush()
    return status, error
