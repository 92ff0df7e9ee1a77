"""Cohorts in the runner: queued runs of one sweep that differ only by seed and learning rate (a
setup's seeds, a campaign's trials of one method), claimed together and trained as one program (``engine.training.cohort``), each still a run of its own.

Whether a ``JobManager`` forms cohorts is its ``cohorts`` setting (``$BASIS_LAB_COHORTS``):
``on``, ``off`` or ``auto`` (the default: on where they pay, ``cohorts_pay``: a GPU, not a CPU).
When a worker thread of a manager that forms them takes a run (claimed by ``_next``, or one of
its own queue), ``Cohorts.run`` looks for the queued runs of the same sweep and the same
``RunConfig.cohort()`` that this manager may train (unowned ones when it pulls, its own queued
ones otherwise) and claims them together, with that run too unless ``_next`` claimed it already,
in one transaction (``QueueRepository.claim_many``) before any trains: every member takes a new
lease as a single run's does, so exactly-once holds per member, and a cohort whose lead could not
be claimed claims nothing; a run claimed elsewhere (or, on PostgreSQL, held by another
transaction at that moment) is simply not a member. Up to ``MAX_MEMBERS`` members train together.

Each member runs through ``JobManager._run`` on a thread of its own, exactly as a single run:
its ``RunExecution`` (lease, the manager's liveness channel, fenced writes, checkpoints in its own folders, pruning,
end, log), with one difference: where it would call ``engine.training.loop.train`` it joins the
cohort (``_Feed``). The worker thread drives the cohort's one training and hands each member
its records and its end; a member's stop (cancel, a lost lease, a pruner), divergence or failed
save ends it alone, and a member whose thread stops listening is dropped. Its stored phases
(``time/*``) are the cohort's. What the driving thread logs (JAX's own warnings) is in no
member's log.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from typing import Any, Callable

from engine.config import ConfigError, RunConfig
from engine.core.choices import COHORT_SETTINGS
from engine.errors import TASK_FAILURES, SharedFailure
from engine.runner import runlog
from engine.training.cohort import Cohort, Ended, cohorts_pay
from engine.training.phases import PHASES, WALL, Phases, metric
from storage import RunRecord, StorageError

log = logging.getLogger(__name__)

ENV = "BASIS_LAB_COHORTS"
SETTINGS = COHORT_SETTINGS
MAX_MEMBERS = 16  # most runs one cohort trains (its memory grows with them: the paper grid has 16 seeds)


def resolve(setting: str | None = None) -> str:
    """``setting``, else ``$BASIS_LAB_COHORTS``, else ``auto``; a ``ConfigError`` naming the choices."""
    value = (setting or os.environ.get(ENV) or "auto").strip().lower()
    if value not in SETTINGS:
        raise ConfigError(f"cohorts must be one of {', '.join(SETTINGS)} (got {value!r}): fix {ENV} or the setting")
    return value


class _Feed:
    """One cohort's training (the thread that ``drive``s it) and its members' executions (a
    thread each, which ``join`` it instead of calling ``train``)."""

    def __init__(self, run_ids: list[int]):
        self.run_ids, self.n = run_ids, len(run_ids)
        self.joined: dict[int, dict[str, Any]] = {}
        self.left: set[int] = set()
        self.queues: list[queue.Queue] = [queue.Queue() for _ in range(self.n)]
        self.cond = threading.Condition()
        self.cohort: Cohort | None = None

    def source(self, i: int) -> Callable:
        """What member ``i``'s ``RunExecution`` calls instead of ``train``: it joins the cohort and
        yields the member's records; its end returns, or raises what ended it."""
        def join(config: RunConfig, **hooks: Any):
            others = ", ".join(str(r) for r in self.run_ids if r != self.run_ids[i])
            runlog.note(runlog.INFO, f"trains in a cohort of {self.n} runs, as one program (with {others})")
            with self.cond:
                self.joined[i] = dict(hooks, config=config)
                self.cond.notify_all()
            return self.member(i, hooks.get("on_resume"), hooks.get("phases"))
        return join

    def member(self, i: int, on_resume: Callable | None, phases: Phases | None):
        """Member ``i``'s records, in its own thread; its ``on_resume`` is heard there too."""
        try:
            while True:
                kind, payload = self.queues[i].get()
                if kind == "resume" and on_resume is not None:
                    on_resume(*payload)
                elif kind == "record":
                    yield payload
                elif kind == "end":
                    ended, seconds = payload
                    if phases is not None:
                        _mirror(phases, seconds)
                    if ended.error is not None:
                        raise ended.error
                    return
                elif kind == "abort":
                    raise SharedFailure(f"the cohort that trained this run failed: {payload}") from payload
        finally:
            self.leave(i)

    def leave(self, i: int) -> None:
        """Member ``i`` stops listening (it ended, or its execution stopped): dropped if still training."""
        with self.cond:
            self.left.add(i)
            self.cond.notify_all()
            if self.cohort is not None and i in self.joined:
                self.cohort.drop(sorted(self.joined).index(i))

    def drive(self) -> None:
        """Wait until every member joined or left, then train those that joined as one cohort."""
        with self.cond:
            self.cond.wait_for(lambda: all(i in self.joined or i in self.left for i in range(self.n)))
            members = sorted(self.joined)
            hooks = [self.joined[i] for i in members]
        if not members:
            return
        ended: set[int] = set()
        failure: BaseException = RuntimeError("its training ended before this run's")
        try:
            phases = Phases()
            cohort = Cohort([h["config"] for h in hooks], should_stop_each=[h["should_stop"] for h in hooks],
                            on_step_each=[h["on_step"] for h in hooks], checkpoints_each=[h["checkpoints"] for h in hooks],
                            phases=phases)
            with self.cond:
                self.cohort = cohort
                for k, i in enumerate(members):
                    if i in self.left:
                        cohort.drop(k)
            resumes = [self._resumer(i) for i in members]
            for k, item in cohort.records(resume=bool(hooks[0].get("resume")), on_resume_each=resumes):
                if isinstance(item, Ended):
                    ended.add(members[k])
                    self.queues[members[k]].put(("end", (item, phases.metrics())))
                else:
                    self.queues[members[k]].put(("record", item))
        except TASK_FAILURES as e:  # the shared training failed: every member still in it fails with it
            log.exception("a cohort of %d runs failed", len(members))
            failure = e
        finally:  # whatever ended it (a bug too), no member waits for more
            for i in set(members) - ended:
                self.queues[i].put(("abort", failure))

    def _resumer(self, i: int) -> Callable[[int, list[str]], None]:
        return lambda step, notes: self.queues[i].put(("resume", (step, notes)))


def _mirror(phases: Phases, seconds: dict[str, float]) -> None:
    """Make ``phases`` (a member's, read in its thread) say the cohort's ``seconds`` (its ``metrics()``)."""
    phases.seconds = {p: seconds[metric(p)] for p in PHASES}
    phases.started = time.perf_counter() - seconds[WALL]


class Cohorts:
    """The cohorts of one ``JobManager`` (``manager``): its setting, and the runs its cohorts
    took from its own queue (its worker threads skip them)."""

    def __init__(self, manager: Any, setting: str | None = None):
        self.manager = manager
        self.setting = resolve(setting)
        self.taken: set[int] = set()
        self._on: bool | None = None

    @property
    def on(self) -> bool:
        if self._on is None:
            self._on = self.setting == "on" or (self.setting == "auto" and cohorts_pay())
        return self._on

    def skip(self, run_id: int) -> bool:
        """Whether a worker thread leaves ``run_id`` alone: a cohort of this manager claimed it."""
        with self.manager._lock:
            if run_id in self.taken:
                self.taken.discard(run_id)
                return True
        return False

    def run(self, run_id: int, epoch: int | None) -> bool:
        """Train ``run_id`` (claimed under ``epoch``, else not yet) in a cohort with its queued
        siblings, if cohorts are on and it has any; whether it was trained here."""
        if not self.on:
            return False
        members = self.gather(run_id, epoch)
        if members is None:
            return False
        if len(members) == 1:
            self.manager._run(*members[0])
            return True
        feed = _Feed([rid for rid, _ in members])
        threads = [threading.Thread(target=self._member, args=(feed, i, rid, e), daemon=True,
                                    name=f"basis-cohort-{members[0][0]}-{rid}") for i, (rid, e) in enumerate(members)]
        for t in threads:
            t.start()
        feed.drive()
        for t in threads:
            t.join()
        return True

    def _member(self, feed: _Feed, i: int, run_id: int, epoch: int) -> None:
        manager, name = self.manager, threading.current_thread().name
        try:
            with manager._lock:
                manager._current[name] = run_id
            manager._run(run_id, epoch, source=feed.source(i))
        except TASK_FAILURES:
            log.exception("run %s crashed its cohort thread", run_id)
        finally:
            feed.leave(i)
            manager._done(name, run_id)

    # ------------------------------------------------------------------ claims

    def gather(self, run_id: int, epoch: int | None) -> list[tuple[int, int]] | None:
        """``[(run, lease)]``: ``run_id`` and the siblings claimed with it, all under new leases
        taken in one transaction (``QueueRepository.claim_many``; ``run_id`` too unless the caller
        claimed it under ``epoch``); None when it has none, when ``run_id`` could not be claimed
        with them, or when the claim failed: then no sibling was taken and the caller trains
        ``run_id`` alone (claiming it first when ``epoch`` is None)."""
        manager, store = self.manager, self.manager.store
        if manager._interrupt.is_set():
            return None
        try:
            row = store.runs.get_run(run_id)
            config = RunConfig.from_dict(row.config)
            siblings = self.siblings(row, config)
        except (StorageError, ConfigError, TypeError):
            return None
        if not siblings:
            return None
        lead = epoch is None
        marked = self.mark(run_id if lead else None, siblings)
        ids = ([run_id] if lead else []) + [rid for rid, _ in marked]
        try:
            leases = store.queue.claim_many(ids, manager.owner, manager.worker_id, lead=run_id if lead else None)
        except StorageError as e:
            log.warning("runs %s not claimed for a cohort: %s", ", ".join(map(str, ids)), e)
            leases = None
        epoch = leases.get(run_id) if lead and leases is not None else epoch
        if leases is None or epoch is None:
            self._unclaimed(run_id if lead else None, marked)
            return None
        members = [(run_id, epoch)] + [(rid, leases[rid]) for rid, _ in marked if rid in leases]
        self._unclaimed(None, [(rid, local) for rid, local in marked if rid not in leases])
        return members

    def siblings(self, row: RunRecord, config: RunConfig) -> list[RunRecord]:
        """The queued runs that may train in ``row``'s cohort here: its sweep's, of its
        ``RunConfig.cohort()``, not cancelled, unowned (when the manager pulls) or queued here."""
        if row.sweep_id is None or config.devices != 1:
            return []
        manager = self.manager
        with manager._lock:
            mine = set(manager._pending)
        out = []
        for r in manager.store.runs.list_runs(["queued"]):
            if r.id == row.id or r.sweep_id != row.sweep_id or r.cancel_requested:
                continue
            if not ((r.owner is None and manager.pull) or (r.owner == manager.owner and r.id in mine)):
                continue
            try:
                if RunConfig.from_dict(r.config).cohort() == config.cohort():
                    out.append(r)
            except (ConfigError, TypeError):
                continue
        return out[:MAX_MEMBERS - 1]

    def mark(self, lead: int | None, siblings: list[RunRecord]) -> list[tuple[int, bool]]:
        """Count the claims to come as ``JobManager._run`` counts one, before any is made; the
        ``(sibling, local)`` to claim with ``lead`` (the worker thread's run when it claims it
        too, else None). A claim counts toward ``max_runs`` when the manager pulls (a sibling it
        pulls is left out once ``max_runs`` are counted); each sibling is ``_pending`` here, and
        one of this manager's own queue (``local``) is ``taken`` first: no worker thread trains it."""
        manager, marked = self.manager, []
        with manager._lock:
            if lead is not None:
                manager.started_runs += int(manager.pull)
                manager._pending.add(lead)
                manager._events.setdefault(lead, threading.Event())
            for sibling in siblings:
                local = sibling.owner is not None
                if not local and manager.max_runs is not None and manager.started_runs >= manager.max_runs:
                    continue
                manager.started_runs += int(manager.pull)
                manager._pending.add(sibling.id)
                manager._events.setdefault(sibling.id, threading.Event())
                if local:
                    self.taken.add(sibling.id)
                marked.append((sibling.id, local))
        return marked

    def _unclaimed(self, lead: int | None, siblings: list[tuple[int, bool]]) -> None:
        """Undo ``mark``'s marks of the runs not claimed: the ``lead``'s count (its worker thread
        goes on with it); a sibling of the queue is left to its worker thread, a pulled one
        forgotten. One whose worker thread skipped it already is handed back to the queue (a
        single claim decides: ``claim_many`` skips a row another transaction holds for a moment,
        a beat stamping it, where ``claim`` waits), or forgotten once the manager is interrupted."""
        manager, forget, back = self.manager, [], []
        stopping = manager._interrupt.is_set() or manager._closing.is_set()
        with manager._lock:
            manager.started_runs -= int(manager.pull) * (len(siblings) + (lead is not None))
            for run_id, local in siblings:
                if local and run_id not in self.taken and not stopping:
                    back.append(run_id)
                elif not (local and run_id in self.taken):
                    forget.append(run_id)
                self.taken.discard(run_id)
        for run_id in forget:
            manager._done(None, run_id)
        for run_id in back:
            manager._queue.put(run_id)
