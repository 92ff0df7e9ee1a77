"""The run lifecycle and edits: create, status, heartbeat, notes, tags, cancel, read, rename, delete.

A part of :class:`storage.store.RunStore`; it uses the store's ``_session`` and ``_pg``."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

from sqlalchemy import delete, select, update

from .errors import RunNotFoundError, StorageError
from .models import Metric, Run, new_uid, utcnow
from .records import (
    ENDED_STATUSES,
    RunRecord,
    _check_status,
    _json_normal,
    _not_found,
    _tags,
)


class RunsMixin:
    """The run lifecycle and edits: create, status, heartbeat, notes, tags, cancel, read, rename, delete."""

    def create_run(
        self,
        *,
        name: str,
        config: dict,
        estimator: str,
        rank: Optional[int],
        lam: float,
        seed: int,
        preset: str,
        steps: int,
        versions: Optional[dict] = None,
        git_commit: Optional[str] = None,
        device: Optional[str] = None,
        status: str = "queued",
        sweep_id: Optional[str] = None,
        tags: Optional[Iterable[str]] = None,
        owner: Optional[str] = None,
    ) -> int:
        """Add a run (``queued`` by default). ``owner`` is the process that will train it
        (``host:pid``); None leaves a queued run to any worker (``claim_next``)."""
        _check_status(status)
        config = _json_normal(dict(config), "run config")
        versions = _json_normal(dict(versions or {}), "run versions")
        if sweep_id is not None and not (0 < len(str(sweep_id)) <= 64):
            raise ValueError(f"a sweep id must be 1 to 64 characters (got {sweep_id!r})")
        now = utcnow()
        run = Run(
            uid=new_uid(),
            name=str(name),
            status=status,
            created_at=now,
            started_at=now if status == "running" else None,
            finished_at=now if status in ENDED_STATUSES else None,
            config=config,
            estimator=estimator,
            rank=None if rank is None else int(rank),
            lam=float(lam),
            seed=int(seed),
            preset=preset,
            steps=int(steps),
            steps_done=0,
            notes="",
            versions=versions,
            git_commit=git_commit,
            device=device,
            cancel_requested=False,
            sweep_id=None if sweep_id is None else str(sweep_id),
            tags=_tags(tags),
            history_version=0,
            owner=owner,
            heartbeat_at=now if owner else None,
        )
        with self._session(write=True) as s:
            s.add(run)
            s.flush()
            return int(run.id)

    def set_status(self, run_id: int, status: str, *, error: Optional[str] = None) -> None:
        _check_status(status)
        values: dict[str, Any] = {"status": status}
        now = utcnow()
        if status in ENDED_STATUSES:
            values["finished_at"] = now
        if error is not None:
            values["error"] = str(error)
        with self._session(write=True) as s:
            run = s.get(Run, run_id)
            if run is None:
                raise _not_found(run_id)
            if status == "running" and run.started_at is None:
                values["started_at"] = now
            for key, value in values.items():
                setattr(run, key, value)

    def heartbeat(self, run_id: int, steps_done: int, owner: Optional[str] = None) -> None:
        """Stamp a run's heartbeat and progress. With ``owner``, a run that a reader marked
        ``interrupted`` while this owner was only slow (a busy database) is ``running`` again."""
        now = utcnow()
        with self._session(write=True) as s:
            res = s.execute(
                update(Run)
                .where(Run.id == run_id)
                .values(heartbeat_at=now, steps_done=int(steps_done))
                .execution_options(synchronize_session=False)
            )
            if res.rowcount != 1:
                raise _not_found(run_id)
            if owner is not None:
                s.execute(
                    update(Run)
                    .where(Run.id == run_id, Run.owner == owner, Run.status == "interrupted")
                    .values(status="running", finished_at=None, error=None)
                    .execution_options(synchronize_session=False)
                )

    def append_notes(self, run_id: int, text: str) -> None:
        """Add a line to a run's notes (what happened to it: resumed, restarted)."""
        with self._session(write=True) as s:
            run = s.get(Run, run_id)
            if run is None:
                raise _not_found(run_id)
            run.notes = f"{run.notes}\n{text}" if run.notes else str(text)

    def set_checkpoint_step(self, run_id: int, step: Optional[int]) -> None:
        """Record the step of the run's newest checkpoint (None: it has none)."""
        self._update_run(run_id, checkpoint_step=None if step is None else int(step))

    def set_device(self, run_id: int, device: str) -> None:
        """What trains the run (``engine.runner.jobs.device_kind``: kind, and `` × N`` on N devices)."""
        self._update_run(run_id, device=str(device)[:200])

    def set_tags(self, run_id: int, tags: Iterable[str]) -> None:
        """Replace the run's tags (stripped, without duplicates, in order)."""
        self._update_run(run_id, tags=_tags(tags))

    def request_cancel(self, run_id: int) -> bool:
        """Queued -> cancelled now; running -> flag for the worker; False if already ended."""
        now = utcnow()
        with self._session(write=True) as s:
            res = s.execute(
                update(Run)
                .where(Run.id == run_id, Run.status == "queued")
                .values(status="cancelled", finished_at=now, cancel_requested=True)
                .execution_options(synchronize_session=False)
            )
            if res.rowcount == 1:
                return True
            res = s.execute(
                update(Run)
                .where(Run.id == run_id, Run.status == "running")
                .values(cancel_requested=True)
                .execution_options(synchronize_session=False)
            )
            if res.rowcount == 1:
                return True
            if s.execute(select(Run.id).where(Run.id == run_id)).first() is None:
                raise _not_found(run_id)
            return False

    def cancel_requested(self, run_id: int) -> bool:
        with self._session() as s:
            flag = s.execute(select(Run.cancel_requested).where(Run.id == run_id)).first()
        if flag is None:
            raise _not_found(run_id)
        return bool(flag[0])

    def active_runs_heartbeats(self) -> list[tuple[int, Optional[str], Optional[datetime]]]:
        """``(run_id, owner, last sign of life)`` of every running run, by id; the last sign
        of life is the heartbeat, else the start, else the creation time."""
        with self._session() as s:
            rows = s.execute(
                select(Run.id, Run.owner, Run.heartbeat_at, Run.started_at, Run.created_at)
                .where(Run.status == "running")
                .order_by(Run.id)
            ).all()
        return [(int(rid), owner, beat or started or created) for rid, owner, beat, started, created in rows]

    def mark_interrupted(self, reasons: Mapping[int, str]) -> list[int]:
        """Set each run still ``running`` to ``interrupted`` with its reason as the error;
        return the ids changed (a run that ended meanwhile is left as it is)."""
        now = utcnow()
        changed = []
        with self._session(write=True) as s:
            for run_id, reason in reasons.items():
                res = s.execute(
                    update(Run)
                    .where(Run.id == int(run_id), Run.status == "running")
                    .values(status="interrupted", finished_at=now, error=str(reason))
                    .execution_options(synchronize_session=False)
                )
                if res.rowcount == 1:
                    changed.append(int(run_id))
        return sorted(changed)

    def get_run(self, run_id: int) -> RunRecord:
        with self._session() as s:
            run = s.get(Run, run_id)
            if run is None:
                raise _not_found(run_id)
            return RunRecord.from_row(run)

    def list_runs(self, statuses: Optional[Sequence[str]] = None) -> list[RunRecord]:
        stmt = select(Run).order_by(Run.id)
        if statuses is not None:
            statuses = [statuses] if isinstance(statuses, str) else list(statuses)
            stmt = stmt.where(Run.status.in_([_check_status(st) for st in statuses]))
        with self._session() as s:
            return [RunRecord.from_row(r) for r in s.scalars(stmt)]

    def rename_run(self, run_id: int, name: str) -> None:
        name = str(name).strip()
        if not name:
            raise ValueError("a run name cannot be empty")
        self._update_run(run_id, name=name)

    def set_notes(self, run_id: int, notes: str) -> None:
        self._update_run(run_id, notes=str(notes or ""))

    def _update_run(self, run_id: int, **values: Any) -> None:
        with self._session(write=True) as s:
            res = s.execute(
                update(Run).where(Run.id == run_id).values(**values).execution_options(synchronize_session=False)
            )
            if res.rowcount != 1:
                raise _not_found(run_id)

    def delete_run(self, run_id: int, *, force: bool = False) -> None:
        """Delete a run, its metrics and diagnostics.  A running run must be cancelled first
        unless ``force``."""
        with self._session(write=True) as s:
            status = s.execute(select(Run.status).where(Run.id == run_id).with_for_update()).scalar()
            if status is None:
                raise _not_found(run_id)
            if status == "running" and not force:
                raise StorageError(f"run {run_id} is running; cancel it first, then delete it once it stops")
            s.execute(delete(Metric.__table__).where(Metric.__table__.c.run_id == run_id))
            s.execute(delete(Run.__table__).where(Run.__table__.c.id == run_id))

    def resolve_runs(self, refs: Sequence[Union[str, int]]) -> list[int]:
        """Ids for run ids or exact run names, in order, without duplicates."""
        if isinstance(refs, (str, int)):
            refs = [refs]
        with self._session() as s:
            rows = s.execute(select(Run.id, Run.name)).all()
        ids = {rid for rid, _ in rows}
        by_name: dict[str, list[int]] = {}
        for rid, name in rows:
            by_name.setdefault(name, []).append(rid)
        out: list[int] = []
        for ref in refs:
            text = str(ref).strip()
            if text.isdigit() and int(text) in ids:
                found = int(text)
            elif text in by_name and len(by_name[text]) == 1:
                found = by_name[text][0]
            elif text in by_name:
                raise StorageError(
                    f"run name {text!r} is ambiguous (ids {', '.join(map(str, sorted(by_name[text])))}); use an id"
                )
            else:
                raise RunNotFoundError(f"no run with id or name {text!r}; list the runs to see their ids and names")
            if found not in out:
                out.append(found)
        return out
