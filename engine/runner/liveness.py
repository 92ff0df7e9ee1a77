"""Signs of life and the rule that reads them: the job runner's liveness policy.

A live run, diagnosis or worker stamps its row every ``HEARTBEAT_S`` seconds through a
``Heartbeat``. Storage only records owners and heartbeats (``RunStore.active_runs_heartbeats``)
and marks runs interrupted on request (``RunStore.mark_interrupted``, cause ``stale``); the
rule lives here, and ``sweep`` applies it. The sweep runs on the heartbeat of every job
manager (workers, ``run``/``sweep``, the dashboard's) and of the dashboard process itself
(``app.state.Lab``), never in a reader: a page render, ``list`` or ``show`` writes nothing.
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
from datetime import datetime, timedelta, timezone
from typing import Callable, Iterable, Optional

from engine.errors import TASK_FAILURES

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
ENV_HOST = "BASIS_LAB_HOST"

__all__ = ["HEARTBEAT_S", "STALE_AFTER_S", "Heartbeat", "host_name", "current_owner", "pid_alive", "stale_runs", "check_stale",
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

    def stop(self) -> None:
        """No beat starts after this returns (one in progress is waited for)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    def __enter__(self) -> Heartbeat:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _loop(self) -> None:
        while not self._stop.wait(self.period):
            try:
                self._beat()
            except TASK_FAILURES as e:  # reported, and the next beat is tried
                self.failures += 1
                self.last_error = e
                log.warning("%s: a beat failed (%s: %s); next try in %.1f s", self.name, type(e).__name__, e,
                            self.period)
            else:
                self.beats += 1


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
    stale = stale_runs(store.running_diagnoses_heartbeats(), datetime.now(timezone.utc), timeout_s)
    for diag_id, reason in stale.items():
        store.set_diagnostic_status(diag_id, "interrupted", error=f"{reason}; run the diagnosis again")
    return sorted(stale)


def mark_stale_interrupted(store, timeout_s: float = STALE_AFTER_S) -> list[int]:
    """Mark ``running`` runs whose worker died as ``interrupted``; return their ids."""
    now = datetime.now(timezone.utc)
    return store.mark_interrupted(stale_runs(store.active_runs_heartbeats(), now, timeout_s))


def release_orphans(store, timeout_s: float = STALE_AFTER_S) -> list[int]:
    """Hand queued runs whose queuing process is gone (same rule as ``stale_runs``) to any
    worker, so nothing stays queued forever; their ids."""
    now = datetime.now(timezone.utc)
    return store.release_queued(stale_runs(store.queued_owners(), now, timeout_s))


def worker_states(frame, timeout_s: float = STALE_AFTER_S, now: Optional[datetime] = None):
    """``RunStore.workers_frame()`` with ``state``: ``active``, ``stopped``, or ``gone``
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
    ids = [r.id for r in store.list_runs(statuses=["interrupted"]) if r.interruption_cause == "stale"]
    return store.requeue(ids) if ids else []
