"""The queue of runs: claims (``FOR UPDATE SKIP LOCKED`` on PostgreSQL), requeue, queued-run ownership.

The repository ``store.queue`` of :class:`storage.store.RunStore`, over its :class:`storage.database.Database`."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Iterable, NamedTuple, Optional, Union

from sqlalchemy import select, update

from .database import Repository
from .db import rowcount
from .limits import as_utf8
from .models import Run, utcnow
from .records import RESUMABLE_STATUSES, as_ids, check_cause, run_not_found


class Lease(NamedTuple):
    """A claimed run and the epoch its owner's writes must name (see :mod:`storage.lease`)."""

    run_id: int
    epoch: int


_CLAIMABLE = (Run.status == "queued", Run.cancel_requested.is_not(True))  # what a claim may take


def _running(owner: str, worker_id: Optional[str], now: Optional[datetime] = None) -> dict[str, Any]:
    """The values a claim writes: running under a new lease (epoch + 1) of ``owner``, started
    and alive now, and nothing left of an earlier end (finish time, error, interruption cause)."""
    now = now or utcnow()
    return dict(status="running", started_at=now, heartbeat_at=now, owner=owner, worker_id=worker_id,
                finished_at=None, error=None, interruption_cause=None, epoch=Run.epoch + 1)


class QueueRepository(Repository):
    """The queue of runs: claims (``FOR UPDATE SKIP LOCKED`` on PostgreSQL), requeue, queued-run ownership."""

    def claim(self, run_id: int, owner: str, worker_id: Optional[str] = None) -> Optional[int]:
        """Atomically move a queued run to running under a new lease; the lease's epoch, or
        None if the run is no longer queued (or a cancel was requested).

        Unlike :meth:`claim_many` it waits for a row another transaction holds (a liveness
        beat stamping it, a concurrent claim) and then decides: its None means "not to be
        trained here", never "busy right now"."""
        with self.db.session(write=True) as s:
            res = s.execute(
                update(Run)
                .where(Run.id == run_id, *_CLAIMABLE)
                .values(**_running(owner, worker_id))
                .execution_options(synchronize_session=False)
            )
            if rowcount(res) != 1:
                return None
            return int(s.execute(select(Run.epoch).where(Run.id == run_id)).scalar_one())

    def claim_many(self, run_ids: Iterable[int], owner: str, worker_id: Optional[str] = None, *,
                   lead: Optional[int] = None) -> dict[int, int]:
        """Claim several runs in ONE transaction, each as :meth:`claim` does (running under a
        new lease: epoch + 1, ``owner``, ``worker_id``, started and heartbeat now, no finish
        time, error or interruption cause); ``{run_id: its new epoch}`` of those claimed.

        A run is claimed when it is still ``queued`` and no cancel was requested; any other
        (running, ended, cancelled, unknown) is absent from the result, and so is one that
        another open transaction holds on PostgreSQL: the candidates are locked first with
        ``SELECT … FOR UPDATE SKIP LOCKED``, so a concurrent claimer never makes this one
        wait (SQLite: ``BEGIN IMMEDIATE`` makes the transaction one step).  With ``lead`` (one
        of ``run_ids``) it is all or nothing on that run: when ``lead`` is not claimable,
        nothing is claimed and the result is empty.  The epochs are read back in the same
        transaction; nothing is written when nothing is claimed."""
        ids = as_ids(run_ids)
        if not ids:
            return {}
        with self.db.session(write=True) as s:
            taken = s.execute(
                select(Run.id).where(Run.id.in_(ids), *_CLAIMABLE).order_by(Run.id).with_for_update(skip_locked=True)
            ).scalars().all()
            if not taken or (lead is not None and int(lead) not in taken):
                return {}
            s.execute(
                update(Run)
                .where(Run.id.in_(taken), *_CLAIMABLE)
                .values(**_running(owner, worker_id))
                .execution_options(synchronize_session=False)
            )
            rows = s.execute(
                select(Run.id, Run.epoch).where(Run.id.in_(taken), Run.status == "running", Run.owner == owner)
            ).all()
        return {int(i): int(e) for i, e in rows}

    def interrupt_queued(self, run_id: int, error: str, cause: str) -> bool:
        """Mark run ``run_id`` ``interrupted`` (its ``error`` and ``cause``), as a process that
        stops before claiming it does, only while it is still ``queued``: a run cancelled,
        deleted or claimed elsewhere meanwhile keeps what it is. Whether it was marked."""
        with self.db.session(write=True) as s:
            res = s.execute(
                update(Run)
                .where(Run.id == run_id, Run.status == "queued")
                .values(status="interrupted", error=as_utf8(error), interruption_cause=check_cause(cause),
                        finished_at=utcnow())
                .execution_options(synchronize_session=False)
            )
            return rowcount(res) == 1

    def claim_next(self, owner: str, worker_id: Optional[str] = None) -> Optional[Lease]:
        """Atomically take the oldest queued, non-cancelled run that no process owns and mark
        it running under a new lease; its :class:`Lease`, or None when there is none.

        PostgreSQL: ``SELECT … FOR UPDATE SKIP LOCKED`` then the update, in one transaction,
        so concurrent claimers take different runs without waiting on each other.  SQLite:
        the transaction starts with ``BEGIN IMMEDIATE``, so select and update are one step.
        """
        while True:
            now = utcnow()
            with self.db.session(write=True) as s:
                stmt = (
                    select(Run.id)
                    .where(Run.status == "queued", Run.cancel_requested.is_not(True), Run.owner.is_(None))
                    .order_by(Run.id)
                    .limit(1)
                    .with_for_update(skip_locked=True)
                )
                run_id = s.execute(stmt).scalar()
                if run_id is None:
                    return None
                res = s.execute(
                    update(Run)
                    .where(Run.id == run_id, Run.status == "queued")
                    .values(**_running(owner, worker_id, now))
                    .execution_options(synchronize_session=False)
                )
                if rowcount(res) == 1:
                    return Lease(int(run_id), int(s.execute(select(Run.epoch).where(Run.id == run_id)).scalar_one()))

    def requeue(self, run_ids: Union[int, Iterable[int]], owner: Optional[str] = None) -> list[int]:
        """Move ended runs (interrupted, cancelled, failed) back to ``queued`` so a worker
        can claim them again (to resume from ``checkpoint_step``); return the ids moved.

        Clears the error, finish time, cancel flag and worker, and sets the owner (None: any
        worker may claim them); keeps ``steps_done``, ``checkpoint_step`` and the metrics.
        Bumps the epoch: whoever trained the run before has lost it from here on.  Runs in any other status are left alone;
        an unknown id raises :class:`RunNotFoundError` and moves nothing.
        """
        ids = as_ids(run_ids)
        with self.db.session(write=True) as s:
            found = set(s.execute(select(Run.id).where(Run.id.in_(ids))).scalars())
            missing = [i for i in ids if i not in found]
            if missing:
                raise run_not_found(missing[0])
            moved = s.execute(
                select(Run.id).where(Run.id.in_(ids), Run.status.in_(RESUMABLE_STATUSES)).with_for_update()
            ).scalars().all()
            if moved:
                s.execute(
                    update(Run)
                    .where(Run.id.in_(moved), Run.status.in_(RESUMABLE_STATUSES))
                    .values(status="queued", error=None, interruption_cause=None, finished_at=None,
                            cancel_requested=False,
                            owner=owner, worker_id=None, heartbeat_at=utcnow() if owner else None,
                            epoch=Run.epoch + 1)
                    .execution_options(synchronize_session=False)
                )
        return sorted(int(i) for i in moved)

    def touch_queued(self, run_ids: Iterable[int], owner: str) -> None:
        """Stamp the heartbeat of queued runs that ``owner`` will train (they are not orphans)."""
        ids = as_ids(run_ids)
        if not ids:
            return
        with self.db.session(write=True) as s:
            s.execute(
                update(Run)
                .where(Run.id.in_(ids), Run.status == "queued", Run.owner == owner)
                .values(heartbeat_at=utcnow())
                .execution_options(synchronize_session=False)
            )

    def queued_owners(self) -> list[tuple[int, str, Optional[datetime]]]:
        """``(run_id, owner, last sign of life)`` of queued runs that a process owns."""
        with self.db.session() as s:
            rows = s.execute(
                select(Run.id, Run.owner, Run.heartbeat_at, Run.created_at)
                .where(Run.status == "queued", Run.owner.is_not(None))
            ).all()
        return [(int(i), str(o), beat or created) for i, o, beat, created in rows]

    def release_queued(self, run_ids: Iterable[int]) -> list[int]:
        """Hand queued runs to any worker (owner None); the ids changed."""
        ids = as_ids(run_ids)
        if not ids:
            return []
        with self.db.session(write=True) as s:
            changed = s.execute(
                select(Run.id).where(Run.id.in_(ids), Run.status == "queued").with_for_update()
            ).scalars().all()
            if changed:
                s.execute(
                    update(Run).where(Run.id.in_(changed), Run.status == "queued").values(owner=None)
                    .execution_options(synchronize_session=False)
                )
        return sorted(int(i) for i in changed)

    def adopt_queued(self, owner: str) -> list[int]:
        """Make ``owner`` the owner of every queued run no process owns; their ids."""
        with self.db.session(write=True) as s:
            ids = s.execute(
                select(Run.id).where(Run.status == "queued", Run.owner.is_(None), Run.cancel_requested.is_not(True))
                .order_by(Run.id).with_for_update(skip_locked=True)
            ).scalars().all()
            if ids:
                s.execute(
                    update(Run).where(Run.id.in_(ids)).values(owner=owner, heartbeat_at=utcnow())
                    .execution_options(synchronize_session=False)
                )
        return [int(i) for i in ids]
