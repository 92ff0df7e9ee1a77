"""Fencing: the lease (``runs.epoch``) that every owner write of a run must still hold.

Every claim of a run (its first start, a resume, a worker's claim, and a requeue that
hands it back to the queue) bumps the run's ``epoch`` and hands the new value to its
claimer, the run's owner.  Each write an owner makes (metrics, heartbeat, status, steps,
checkpoint step, notes, the metrics a resume replaces) names that epoch and holds only
while it is still the run's: the row is locked (``SELECT … FOR UPDATE`` on PostgreSQL;
SQLite's write lock, taken at ``BEGIN IMMEDIATE``, serialises every writer) and compared,
or the ``UPDATE`` itself says ``WHERE epoch = :mine``.  A write of an owner that lost its
lease (stalled, then declared dead and replaced) changes nothing and raises
:class:`storage.errors.LeaseLostError`, so the owner learns it at its next write.

Writes with ``epoch=None`` are not fenced: a user's edits (rename, notes, tags, cancel)
and tools that act on a run without owning it.

:class:`LeasesRepository` (``store.leases``) is the other half: the one beat of a worker
(:meth:`LeasesRepository.beat`), which stamps in one transaction the worker, the queued runs it
will train, every run it holds (fenced as above) and every diagnosis it computes, and reads
back in the same transaction each held run's ``(epoch, cancel_requested)`` and which
diagnoses were asked to stop: what ``engine.runner.liveness.Channel`` publishes to the
training threads, so that they never query the database to learn it.
"""

from __future__ import annotations

from typing import Iterable, Mapping, NamedTuple, Optional

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from .database import Repository
from .errors import LeaseLostError
from .limits import check_int
from .models import Diagnostic, Run, Worker, utcnow
from .records import STALE_CAUSE, run_not_found


def hold(s: Session, run_id: int, epoch: Optional[int]) -> int:
    """Lock the run's row in ``s``'s transaction and return its epoch; raise
    :class:`RunNotFoundError` if it is gone, :class:`LeaseLostError` if ``epoch`` (not
    None) is no longer the run's."""
    current = s.execute(select(Run.epoch).where(Run.id == run_id).with_for_update()).scalar()
    if current is None:
        raise run_not_found(run_id)
    if epoch is not None and int(current) != int(epoch):
        raise LeaseLostError(run_id, epoch, current)
    return int(current)


def refused(s: Session, run_id: int, epoch: Optional[int]) -> Exception:
    """Why a fenced ``UPDATE … WHERE id = :run AND epoch = :mine`` changed no row: the
    run is gone, or its lease moved on."""
    current = s.execute(select(Run.epoch).where(Run.id == run_id)).scalar()
    if current is None:
        return run_not_found(run_id)
    return LeaseLostError(run_id, -1 if epoch is None else epoch, current)


class Held(NamedTuple):
    """What a beat read back of one run: its lease now and whether a stop was asked."""

    epoch: int
    cancel: bool


class BeatResult(NamedTuple):
    """A beat's read-back: ``runs`` (run id → ``Held``; a run missing from it was deleted)
    and ``cancelled`` (the diagnoses asked to stop; a deleted one among them)."""

    runs: dict[int, Held]
    cancelled: set[int]


class LeasesRepository(Repository):
    """The beat of a worker (a process holding leases): one transaction, written and read back."""

    def beat(self, runs: Mapping[int, tuple[int, int]], *, owner: str, worker: Optional[str] = None,
             current: Optional[int] = None, queued: Iterable[int] = (), diagnoses: Iterable[int] = ()) -> BeatResult:
        """Stamp, in one transaction: worker ``worker`` (training ``current``), the ``queued``
        runs ``owner`` will train, each held run ``{run_id: (epoch, steps_done)}`` (its
        heartbeat and progress, only while ``epoch`` is still its lease and the run is ``running``;
        one that a sweep marked ``interrupted`` as stale while its owner was only slow is
        ``running`` again, never a run its owner ended meanwhile, in the gap between this beat's
        copy of the held runs and its write) and each
        running ``diagnoses``; then read back what the holder must act on (``BeatResult``).
        A run whose lease moved on is left as it is: its ``Held.epoch`` says so."""
        now, held, diags = utcnow(), dict(runs), sorted({int(d) for d in diagnoses})
        with self.db.session(write=True) as s:
            if worker is not None:
                s.execute(update(Worker).where(Worker.id == str(worker))
                          .values(heartbeat_at=now, current_run_id=current, status="active"))
            queued_ids = sorted({int(r) for r in queued})
            if queued_ids:
                s.execute(update(Run).where(Run.id.in_(queued_ids), Run.status == "queued", Run.owner == owner)
                          .values(heartbeat_at=now).execution_options(synchronize_session=False))
            for run_id, (epoch, steps) in held.items():
                mine = (Run.id == int(run_id), Run.epoch == int(epoch))
                s.execute(update(Run).where(*mine, Run.owner == owner, Run.status == "interrupted",
                                            Run.interruption_cause == STALE_CAUSE)
                          .values(status="running", finished_at=None, error=None, interruption_cause=None)
                          .execution_options(synchronize_session=False))
                s.execute(update(Run).where(*mine, Run.status == "running")
                          .values(heartbeat_at=now, steps_done=check_int("steps_done", steps))
                          .execution_options(synchronize_session=False))
            if diags:
                s.execute(update(Diagnostic).where(Diagnostic.id.in_(diags),
                                                   Diagnostic.status.in_(("running", "interrupted")))
                          .values(status="running", heartbeat_at=now).execution_options(synchronize_session=False))
            rows = s.execute(select(Run.id, Run.epoch, Run.cancel_requested).where(Run.id.in_(list(held)))).all() \
                if held else []
            alive = dict(s.execute(select(Diagnostic.id, Diagnostic.cancel_requested)
                                   .where(Diagnostic.id.in_(diags))).all()) if diags else {}
        return BeatResult({int(i): Held(int(e or 0), bool(c)) for i, e, c in rows},
                          {d for d in diags if alive.get(d, True)})
