"""Background runs: a queue, worker threads, cancellation and heartbeats.

Every run is a row in the database first (status ``queued``); a worker claims
it (``running``), streams its metrics into the database and ends it as
``finished``, ``failed`` (with the error), or ``cancelled``. Cancelling works
from any process: ``RunStore.request_cancel`` sets a flag that the worker reads
between steps (the owning process also gets a local event, seen at once).
While a run trains, a heartbeat thread stamps it every ``HEARTBEAT_S`` seconds,
so a process that dies leaves a stale row that the next manager marks
``interrupted`` at start-up.
"""

from __future__ import annotations

import logging
import platform
import queue
import subprocess
import threading
import time
import traceback
from importlib import metadata
from pathlib import Path
from typing import Callable, Iterable

import jax

from engine.config import RunConfig
from engine.liveness import current_owner, mark_stale_interrupted
from engine.train import Record, TrainingDiverged, train
from storage import RunStore

log = logging.getLogger(__name__)

HEARTBEAT_S = 2.0
CANCEL_POLL_S = 0.25
STALE_AFTER_S = 120.0
_PACKAGES = ("jax", "jaxlib", "flax", "optax", "numpy", "tiktoken", "datasets", "SQLAlchemy", "streamlit")


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
    dev = jax.devices()[0]
    return {"versions": versions, "git_commit": commit, "device": f"{dev.platform}: {dev.device_kind}"}


def create_run(store: RunStore, config: RunConfig, env: dict) -> int:
    return store.create_run(
        name=config.label(),
        config=config.to_dict(),
        estimator="exact" if config.is_exact else config.estimator,
        rank=None if config.is_exact else config.effective_rank,
        lam=config.lam,
        seed=config.seed,
        preset=config.preset,
        steps=config.steps,
        **env,
    )


class JobManager:
    """Runs queued configs in background threads, at most ``max_concurrent`` at once.

    ``on_step(run_id, step, loss)`` and ``on_record(run_id, record)`` are optional
    hooks called from worker threads (the CLI draws progress bars with them).
    """

    def __init__(
        self,
        store: RunStore,
        *,
        max_concurrent: int = 1,
        on_step: Callable[[int, int, float], None] | None = None,
        on_record: Callable[[int, Record], None] | None = None,
    ):
        if isinstance(max_concurrent, bool) or not isinstance(max_concurrent, int) or max_concurrent < 1:
            raise ValueError(f"max_concurrent must be an integer >= 1 (got {max_concurrent!r})")
        self.store = store
        self.owner = current_owner()
        self.on_step = on_step
        self.on_record = on_record
        self.interrupted = mark_stale_interrupted(store, STALE_AFTER_S)
        self._queue: queue.Queue[int | None] = queue.Queue()
        self._cancel_events: dict[int, threading.Event] = {}
        self._pending: set[int] = set()
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._env: dict | None = None
        self._workers = [
            threading.Thread(target=self._work, name=f"basis-worker-{i}", daemon=True)
            for i in range(max_concurrent)
        ]
        for w in self._workers:
            w.start()

    def submit(self, configs: RunConfig | Iterable[RunConfig]) -> list[int]:
        """Queue runs; returns their ids in order."""
        configs = [configs] if isinstance(configs, RunConfig) else list(configs)
        if self._env is None:
            self._env = environment()
        ids = []
        for config in configs:
            run_id = create_run(self.store, config, self._env)
            with self._lock:
                self._pending.add(run_id)
                self._cancel_events[run_id] = threading.Event()
            self._queue.put(run_id)
            ids.append(run_id)
        return ids

    def cancel(self, run_id: int) -> bool:
        """Stop a run: at once if queued, within one step if running."""
        with self._lock:
            event = self._cancel_events.get(run_id)
        if event is not None:
            event.set()
        return self.store.request_cancel(run_id)

    def pending(self) -> set[int]:
        """Ids submitted here that have not ended yet."""
        with self._lock:
            return set(self._pending)

    def wait(self, run_ids: Iterable[int] | None = None, timeout: float | None = None) -> bool:
        """Block until the given runs (default: all submitted) have ended; False on timeout."""
        targets = set(run_ids) if run_ids is not None else None
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._idle:
            while self._pending & (targets if targets is not None else self._pending):
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._idle.wait(remaining)
        return True

    def shutdown(self, cancel_running: bool = True, timeout: float | None = 30.0) -> None:
        """Cancel what is left (if asked) and stop the workers."""
        if cancel_running:
            for run_id in self.pending():
                self.cancel(run_id)
        for _ in self._workers:
            self._queue.put(None)
        for w in self._workers:
            w.join(timeout)

    # ------------------------------------------------------------------ workers

    def _work(self) -> None:
        while (run_id := self._queue.get()) is not None:
            try:
                self._run(run_id)
            except Exception:  # a worker must survive any single run
                log.exception("run %s crashed the worker", run_id)
            finally:
                with self._idle:
                    self._pending.discard(run_id)
                    self._cancel_events.pop(run_id, None)
                    self._idle.notify_all()

    def _run(self, run_id: int) -> None:
        if not self.store.claim(run_id, self.owner):
            return  # cancelled (or deleted) while queued
        event = self._cancel_events.get(run_id) or threading.Event()
        steps_done = [0]
        stop_beat = threading.Event()
        beat = threading.Thread(target=self._beat, args=(run_id, steps_done, stop_beat), daemon=True)
        beat.start()
        last_poll = [time.monotonic()]

        def should_stop() -> bool:
            if event.is_set():
                return True
            if time.monotonic() - last_poll[0] >= CANCEL_POLL_S:
                last_poll[0] = time.monotonic()
                if self.store.cancel_requested(run_id):
                    event.set()
            return event.is_set()

        def on_step(step: int, loss: float | None) -> None:
            steps_done[0] = step
            if self.on_step:
                self.on_step(run_id, step, loss)

        try:
            config = RunConfig.from_dict(self.store.get_run(run_id).config)
            for record in train(config, should_stop=should_stop, on_step=on_step):
                rows = [(record.step, record.wall_time, k, v) for k, v in record.values.items()]
                self.store.add_metrics(run_id, rows)
                if self.on_record:
                    self.on_record(run_id, record)
            status, error = ("cancelled", None) if event.is_set() else ("finished", None)
        except TrainingDiverged as e:
            status, error = "failed", str(e)
        except Exception as e:
            status, error = "failed", f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=8)}"
        finally:
            stop_beat.set()
            beat.join()
        self.store.heartbeat(run_id, steps_done[0])
        self.store.set_status(run_id, status, error=error)

    def _beat(self, run_id: int, steps_done: list[int], stop: threading.Event) -> None:
        while not stop.wait(HEARTBEAT_S):
            try:
                self.store.heartbeat(run_id, steps_done[0])
            except Exception:
                log.exception("heartbeat of run %s failed", run_id)
