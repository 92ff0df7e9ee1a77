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
"""

from __future__ import annotations

from typing import Optional

from sqlalchemy import select
from sqlalchemy.orm import Session

from .errors import LeaseLostError
from .models import Run
from .records import run_not_found


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
