"""Signs of life and the rule that reads them: the job runner's liveness policy and its one channel.

The channel
-----------
A process that holds leases (a ``JobManager``: a worker, ``run``/``sweep``, the dashboard's; or
a diagnosis computed alone by the CLI) has ONE ``Channel``: one heartbeat thread that every
``HEARTBEAT_S`` seconds makes one transaction (``storage.lease.LeasesRepository.beat``): it
stamps the worker, the queued runs it will train, every run it holds (its progress, fenced by
its lease) and every diagnosis it computes, and reads back in the same round trip each run's
lease and cancel flag and which diagnoses were asked to stop. It publishes that to the
training threads in memory, one ``LeaseState`` per run (``lost``, ``cancelled``): the training
loop and the checkpoint guard read it for free, never the database. What guards correctness
is still the fence of every owner write (``storage.lease``): a write under a lease that moved
on changes nothing and raises ``LeaseLostError``, whatever the channel has read so far; the
channel only tells a stalled owner sooner. A beat that fails (a busy or unreachable
database) is logged and tried again a period later; PostgreSQL connections time out after
``storage.db.CONNECT_TIMEOUT_S``, so a dead server cannot hang the beat.

The sweep
---------
A live run, diagnosis or worker is stamped by its channel. Storage only records owners and
heartbeats (``RunsRepository.runs.active_runs_heartbeats``) and marks runs interrupted on request
(``RunsRepository.runs.mark_interrupted``, cause ``stale``); the rule lives here, and ``sweep`` applies
it. The sweep runs in one place: the channel of every job manager, once when it opens and then
at most every ``SWEEP_S`` seconds (a pulling worker's also queues the runs it found stale
again, ``requeue_orphaned_runs``), and the dashboard process's own heartbeat
(``app.state.Lab``) until its job manager starts, never in a reader: a page render, ``list`` or ``show`` writes nothing.
A running run whose owner is ``this-host:pid`` is stale exactly when that process is gone: a
live process on this host is never declared dead by the timeout alone (it may be stopped,
swapping or waiting on a hung disk, and would wake to find its run trained by another).
A run owned on another host is stale when its last sign of life (heartbeat, else start,
else creation) is older than ``STALE_AFTER_S`` (``$BASIS_LAB_STALE_AFTER_S``, default 60 s).
Should such an owner wake after all, its lease (``storage.lease``) is gone and its writes
are refused. Pure Python.

The host name is ``$BASIS_LAB_HOST`` when set (machines or containers that share a
database but not a process table and a host name), else ``socket.gethostname()``.
"""
from __future__ import annotations

import logging
import os
import socket
import threading
import time
from datetime import datetime, timedelta, timezone
from typing import Callable, Iterable, Optional

from engine.errors import TASK_FAILURES, is_bug
from storage import DatabaseFullError, LeaseLostError, StorageError

log = logging.getLogger(__name__)

ENV_STALE = "BASIS_LAB_STALE_AFTER_S"


def _stale_after(default: float = 60.0) -> float:
    """``$BASIS_LAB_STALE_AFTER_S`` (seconds of silence after which an owner on another
    host counts as dead), else ``default``; an unreadable value is warned about and ignored."""
    text = os.environ.get(ENV_STALE, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0:
        log.warning("ignoring %s=%r: not a positive number of seconds; using %g s", ENV_STALE, text, default)
        return default
    return value


STALE_AFTER_S = _stale_after()  # silent this long (on another host): its worker is dead
HEARTBEAT_S = min(2.0, STALE_AFTER_S / 3)  # period of every heartbeat (several within the timeout)
SWEEP_S = max(HEARTBEAT_S, STALE_AFTER_S / 6)  # the least time between two sweeps of one channel
ENV_HOST = "BASIS_LAB_HOST"

__all__ = ["HEARTBEAT_S", "STALE_AFTER_S", "SWEEP_S", "Channel", "Heartbeat", "LeaseState", "host_name", "current_owner", "pid_alive", "stale_runs", "check_stale",
           "sweep", "mark_stale_interrupted", "release_orphans", "requeue_orphaned_runs", "worker_states"]


class Heartbeat:
    """Calls ``beat()`` every ``period`` seconds on a daemon thread, from ``start()`` (or
    entering a ``with`` block) until ``stop()`` (or leaving it), which waits for the
    thread to end; the first beat comes one period after the start.

    A beat that raises does not end the heartbeat (a busy database must not end a
    run): it is logged, counted in ``failures`` with the exception in ``last_error``,
    and the next beat is tried a period later. ``beats`` counts the beats that returned.
    """

    def __init__(self, beat: Callable[[], object], *, period: float = HEARTBEAT_S, name: str = "basis-heartbeat"):
        if not period > 0:
            raise ValueError(f"a heartbeat period must be > 0 seconds (got {period!r})")
        self.period, self.name = float(period), name
        self.beats = 0
        self.failures = 0
        self.last_error: BaseException | None = None
        self._beat = beat
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Heartbeat:
        if self._thread is not None:
            raise RuntimeError(f"{self.name} was started already")
        self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float | None = None) -> None:
        """No beat starts after this returns (one in progress is waited for, up to ``timeout``
        seconds: a beat stuck on a dead connection is left to its daemon thread)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def __enter__(self) -> Heartbeat:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _loop(self) -> None:
        while not self._stop.wait(self.period):
            try:
                self._beat()
            except TASK_FAILURES as e:  # reported (a bug with its traceback), and the next beat is tried
                self.failures += 1
                self.last_error = e
                log.warning("%s: a beat failed (%s: %s); next try in %.1f s", self.name, type(e).__name__, e,
                            self.period, exc_info=is_bug(e))
            else:
                self.beats += 1


class LeaseState:
    """What the channel last read back of run ``run_id`` held under lease ``epoch``, for its
    training thread to read at no cost: ``lost`` (the ``LeaseLostError`` once the run's lease
    moved on), ``cancelled`` (set on a cancel request, or when the run was deleted) and
    ``steps_done`` (the progress that thread reports, which the next beat stores)."""

    def __init__(self, run_id: int, epoch: int, steps_done: int = 0):
        self.run_id, self.epoch, self.steps_done = run_id, epoch, steps_done
        self.lost: LeaseLostError | None = None
        self.cancelled = threading.Event()

    def publish(self, held) -> None:
        """Take in a beat's read-back of the run (``storage.lease.Held``; None: it was deleted)."""
        if held is None:
            self.cancelled.set()
        elif held.epoch != self.epoch:
            self.lost = LeaseLostError(self.run_id, self.epoch, held.epoch)
        elif held.cancel:
            self.cancelled.set()


class Channel:
    """The one liveness channel of a process (see the module's docstring): ``hold`` a run's
    lease or ``watch`` a diagnosis while it trains or computes, ``release``/``unwatch`` it at
    its end. ``start()`` begins beating every ``period`` seconds on a thread named
    ``basis-liveness``; ``beat()`` is one beat, ``stop()`` ends them.

    ``worker``: the registered worker id this process stamps; ``status()``: (the run it trains
    now, the queued runs it will train), stamped with it; ``before()``: what the owner does
    first at every beat (flush its runs' logs, store ends refused so far). With ``sweep`` it
    applies the staleness rule (``sweep``) at most every ``SWEEP_S`` seconds, and with
    ``requeue`` queues the runs it found stale again for any worker."""

    def __init__(self, store, owner: str, *, worker: str | None = None, status: Callable[[], tuple] | None = None,
                 before: Callable[[], None] | None = None, sweep: bool = False, requeue: bool = False,
                 period: float = HEARTBEAT_S):
        self.store, self.owner, self.worker = store, owner, worker
        self._status, self._before, self._sweeps, self._requeue = status, before, sweep, requeue
        self._runs: dict[int, LeaseState] = {}
        self._diagnoses: dict[int, threading.Event] = {}
        self._lock = threading.Lock()
        self._swept = float("-inf")
        self.heartbeat = Heartbeat(self.beat, period=period, name="basis-liveness")

    def start(self) -> Channel:
        self.heartbeat.start()
        return self

    def stop(self, timeout: float | None = None) -> None:
        self.heartbeat.stop(timeout)

    def hold(self, run_id: int, epoch: int, steps_done: int = 0) -> LeaseState:
        """Beat for run ``run_id`` under lease ``epoch`` from now on; its ``LeaseState``."""
        state = LeaseState(run_id, epoch, steps_done)
        with self._lock:
            self._runs[run_id] = state
        return state

    def release(self, run_id: int) -> None:
        with self._lock:
            self._runs.pop(run_id, None)

    def watch(self, diag_id: int, cancel: threading.Event) -> None:
        """Beat for running diagnosis ``diag_id``; ``cancel`` is set once it is asked to stop."""
        with self._lock:
            self._diagnoses[diag_id] = cancel

    def unwatch(self, diag_id: int) -> None:
        with self._lock:
            self._diagnoses.pop(diag_id, None)

    def beat(self) -> None:
        """One beat: ``before()``, one transaction that stamps and reads back every run and
        diagnosis held (``RunStore.leases.beat``), its publication, then the sweep when due."""
        if self._before is not None:
            self._before()
        current, queued = self._status() if self._status is not None else (None, ())
        with self._lock:
            runs, diagnoses = dict(self._runs), dict(self._diagnoses)
        try:
            back = self.store.leases.beat({r: (s.epoch, s.steps_done) for r, s in runs.items()}, owner=self.owner,
                                          worker=self.worker, current=current, queued=queued, diagnoses=diagnoses)
        except DatabaseFullError as e:  # said once, by the end of each run it stops (not at every beat)
            log.debug("%s: a beat was refused: %s", self.heartbeat.name, e)
            return
        for run_id, state in runs.items():
            state.publish(back.runs.get(run_id))
        for diag_id in back.cancelled:
            diagnoses[diag_id].set()
        if self._sweeps and time.monotonic() - self._swept >= SWEEP_S:
            self.sweep()

    def sweep(self) -> list[int]:
        """Apply the staleness rule now (``sweep``; with ``requeue``, ``requeue_orphaned_runs``);
        the run ids it marked interrupted. A busy database is swept at a later beat."""
        self._swept = time.monotonic()
        try:
            interrupted = sweep(self.store)
            if self._requeue:
                requeue_orphaned_runs(self.store)
        except StorageError as e:
            log.debug("the staleness sweep failed: %s", e)
            self._swept = float("-inf")
            return []
        return interrupted


def host_name() -> str:
    """``$BASIS_LAB_HOST``, else this machine's host name: the host part of an owner."""
    return os.environ.get(ENV_HOST, "").strip() or socket.gethostname()


def current_owner() -> str:
    """``hostname:pid`` of this process, the owner recorded when it claims a run."""
    return f"{host_name()}:{os.getpid()}"


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this host (zombies count as dead)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    except OSError:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return True


def stale_runs(
    rows: Iterable[tuple[int, Optional[str], Optional[datetime]]],
    now: datetime,
    timeout_s: float,
    host: Optional[str] = None,
) -> dict[int, str]:
    """``{run_id: reason}`` for the stale ones among ``(run_id, owner, last sign of life)``:
    on this host, those whose process is gone (whatever the time); elsewhere, those silent
    for longer than ``timeout_s``."""
    host = host_name() if host is None else host
    cutoff = now - timedelta(seconds=timeout_s)
    stale: dict[int, str] = {}
    for run_id, owner, last in rows:
        o_host, _, o_pid = (owner or "").rpartition(":")
        if o_host == host and o_pid.isdigit():
            if not pid_alive(int(o_pid)):
                stale[run_id] = f"worker {owner} is no longer running"
        elif last is None or last < cutoff:
            stale[run_id] = f"no heartbeat from {owner or 'its worker'} since {last}"
    return stale


def check_stale(store) -> list[int]:
    """Mark runs whose worker died ``interrupted`` (cause ``stale``) and release queued runs
    whose queuing process died to any worker; the ids marked interrupted."""
    release_orphans(store)
    return mark_stale_interrupted(store)


def sweep(store) -> list[int]:
    """The sweep a heartbeat makes: ``check_stale``, then running diagnoses whose process
    died marked ``interrupted``; the run ids marked interrupted. Writes only what is stale."""
    interrupted = check_stale(store)
    mark_stale_diagnoses(store)
    return interrupted


def mark_stale_diagnoses(store, timeout_s: float = STALE_AFTER_S) -> list[int]:
    """Mark ``running`` diagnoses whose process died (the runs' rule) ``interrupted``; their ids."""
    stale = stale_runs(store.diagnostics.running_diagnoses_heartbeats(), datetime.now(timezone.utc), timeout_s)
    for diag_id, reason in stale.items():
        store.diagnostics.set_diagnostic_status(diag_id, "interrupted", error=f"{reason}; run the diagnosis again")
    return sorted(stale)


def mark_stale_interrupted(store, timeout_s: float = STALE_AFTER_S) -> list[int]:
    """Mark ``running`` runs whose worker died as ``interrupted``; return their ids."""
    now = datetime.now(timezone.utc)
    return store.runs.mark_interrupted(stale_runs(store.runs.active_runs_heartbeats(), now, timeout_s))


def release_orphans(store, timeout_s: float = STALE_AFTER_S) -> list[int]:
    """Hand queued runs whose queuing process is gone (same rule as ``stale_runs``) to any
    worker, so nothing stays queued forever; their ids."""
    now = datetime.now(timezone.utc)
    return store.queue.release_queued(stale_runs(store.queue.queued_owners(), now, timeout_s))


def worker_states(frame, timeout_s: float = STALE_AFTER_S, now: Optional[datetime] = None):
    """``FramesRepository.frames.workers_frame()`` with ``state``: ``active``, ``stopped``, or ``gone``
    (silent for longer than ``timeout_s``, or its process is dead on this host)."""
    now = now or datetime.now(timezone.utc)
    frame = frame.copy()
    rows = [(i, f"{h}:{p}", beat) for i, h, p, beat in zip(frame["id"], frame["host"], frame["pid"], frame["heartbeat_at"])]
    gone = stale_runs([(i, o, None if b is None or b != b else b.to_pydatetime()) for i, o, b in rows], now, timeout_s)
    frame["state"] = [
        "stopped" if status == "stopped" else ("gone" if i in gone else "active")
        for i, status in zip(frame["id"], frame["status"])
    ]
    return frame


def requeue_orphaned_runs(store) -> list[int]:
    """Queue again, for any worker, the interrupted runs whose worker died (not those a
    signal or a user stopped on purpose); they resume from their newest checkpoint."""
    ids = [r.id for r in store.runs.list_runs(statuses=["interrupted"]) if r.interruption_cause == "stale"]
    return store.queue.requeue(ids) if ids else []
