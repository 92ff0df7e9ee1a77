"""Workers: registration, heartbeats and their records.

The repository ``store.workers`` of :class:`storage.store.RunStore`, over its :class:`storage.database.Database`."""

from __future__ import annotations

from typing import Any, Optional

from sqlalchemy import select, update

from .database import Repository
from .db import rowcount
from .errors import InvalidValueError, StorageError
from .models import Worker, utcnow
from .records import WorkerRecord


class WorkersRepository(Repository):
    """Workers: registration, heartbeats and their records."""

    def register_worker(self, worker_id: str, host: str, pid: int, device: Optional[str] = None,
                        concurrent: int = 1) -> None:
        """Record a worker as ``active`` (again, if its id was seen before)."""
        worker_id = str(worker_id)
        if not (0 < len(worker_id) <= 64):
            raise InvalidValueError(f"a worker id must be 1 to 64 characters (got {worker_id!r})")
        now = utcnow()
        values = dict(host=str(host), pid=int(pid), device=device, started_at=now, heartbeat_at=now,
                      current_run_id=None, status="active", concurrent=int(concurrent))
        with self.db.session(write=True) as s:
            worker = s.get(Worker, worker_id, with_for_update=True)
            if worker is None:
                s.add(Worker(id=worker_id, **values))
            else:
                for key, value in values.items():
                    setattr(worker, key, value)

    def worker_heartbeat(self, worker_id: str, current_run_id: Optional[int] = None) -> None:
        """Stamp the worker's heartbeat and the run it trains now (None: idle)."""
        self._update_worker(worker_id, current_run_id=current_run_id, status="active")

    def end_worker(self, worker_id: str) -> None:
        """Mark the worker ``stopped`` (it exited cleanly)."""
        self._update_worker(worker_id, current_run_id=None, status="stopped")

    def _update_worker(self, worker_id: str, **values: Any) -> None:
        with self.db.session(write=True) as s:
            res = s.execute(
                update(Worker).where(Worker.id == str(worker_id))
                .values(heartbeat_at=utcnow(), **values)
                .execution_options(synchronize_session=False)
            )
            if rowcount(res) != 1:
                raise StorageError(f"no worker {worker_id!r}; register it first")

    def list_workers(self) -> list[WorkerRecord]:
        """Every registered worker, newest start first.  Whether a silent one is gone is the
        caller's policy (see ``engine/runner/liveness.py``)."""
        with self.db.session() as s:
            return [WorkerRecord.from_row(w) for w in s.scalars(select(Worker).order_by(Worker.started_at.desc(), Worker.id))]
