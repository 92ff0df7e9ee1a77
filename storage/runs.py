"""The run lifecycle and edits: create, status, heartbeat, notes, tags, cancel, read, rename, delete.

The repository ``store.runs`` of :class:`storage.store.RunStore`, over its :class:`storage.database.Database`."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence, Union

from sqlalchemy import delete, select, update

from .database import Repository
from .db import rowcount
from .errors import InvalidValueError, RunNotFoundError, StorageError
from .lease import hold, refused
from .limits import NAME_MAX, NOTES_MAX, as_utf8, check_int, check_text, check_utf8
from .models import EvalLosses, Metric, Run, new_uid, utcnow
from .records import (
    ENDED_STATUSES,
    STALE_CAUSE,
    RunRecord,
    check_cause,
    check_status,
    clean_tags,
    json_normal,
    run_not_found,
)


def _new_run(
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
) -> Run:
    """The row of a new run, every value checked against what the schema holds."""
    check_status(status)
    config = json_normal(dict(config), "run config")
    versions = json_normal(dict(versions or {}), "run versions")
    if sweep_id is not None and not (0 < len(str(sweep_id)) <= 64):
        raise InvalidValueError(f"a sweep id must be 1 to 64 characters (got {sweep_id!r})")
    check_utf8("sweep id", sweep_id)
    now = utcnow()
    return Run(
        uid=new_uid(),
        name=_name(name),
        status=status,
        created_at=now,
        started_at=now if status == "running" else None,
        finished_at=now if status in ENDED_STATUSES else None,
        config=config,
        estimator=estimator,
        rank=None if rank is None else check_int("rank", int(rank)),
        lam=float(lam),
        seed=check_int("seed", int(seed)),
        preset=preset,
        steps=check_int("steps", int(steps)),
        steps_done=0,
        notes="",
        versions=versions,
        git_commit=git_commit,
        device=device,
        cancel_requested=False,
        sweep_id=None if sweep_id is None else str(sweep_id),
        tags=clean_tags(tags),
        history_version=0,
        epoch=1 if status == "running" else 0,  # a run created running is claimed by its creator
        owner=owner,
        heartbeat_at=now if owner else None,
    )


def _name(name: Any) -> str:
    name = str(name).strip()
    if not name:
        raise InvalidValueError("name: a run name cannot be empty")
    return check_text("name", name, NAME_MAX)


def new_runs(runs: Sequence[Mapping[str, Any]]) -> list[Run]:
    """The ``Run`` rows of ``runs`` (``create_run``'s arguments each), every one checked
    before any is written: one the schema cannot hold is an ``InvalidValueError`` naming the
    run and the field."""
    rows = []
    for i, spec in enumerate(runs):
        try:
            rows.append(_new_run(**spec))
        except ValueError as e:
            raise InvalidValueError(f"run {i + 1} of {len(runs)} ({str(spec.get('name'))[:40]!r}): {e}"
                                    if len(runs) > 1 else str(e)) from None
    return rows


class RunsRepository(Repository):
    """The run lifecycle and edits: create, status, heartbeat, notes, tags, cancel, read, rename, delete."""

    def create_run(self, **fields: Any) -> int:
        """Add a run (``queued`` by default) from the fields :func:`_new_run` takes
        (name, config, estimator, rank, lam, seed, preset, steps; optionally versions,
        git_commit, device, status, sweep_id, tags, owner).  ``owner`` is the process that
        will train it (``host:pid``); None leaves a queued run to any worker
        (``claim_next``).  A value the schema cannot hold (see :mod:`storage.limits`) is a
        ValueError naming its field, and nothing is written."""
        return self.create_runs([fields])[0]

    def create_runs(self, runs: Sequence[Mapping[str, Any]]) -> list[int]:
        """Add many runs in one transaction, all of them or none (a sweep); each mapping
        holds :meth:`create_run`'s arguments.  Their ids, in order.  Every run is checked
        before anything is written: one that the schema cannot hold is a ValueError naming
        the run and the field."""
        rows = new_runs(runs)
        if not rows:
            return []
        with self.db.session(write=True) as s:
            s.add_all(rows)
            s.flush()
            return [int(run.id) for run in rows]

    def set_status(self, run_id: int, status: str, *, error: Optional[str] = None,
                   epoch: Optional[int] = None, cause: Optional[str] = None) -> None:
        """Set the run's status (and error); ``cause``, one of ``INTERRUPTION_CAUSES``, says
        why an ``interrupted`` run stopped (any other status clears it).  With ``epoch`` (an
        owner's write) it holds only while that is still the run's lease, else
        :class:`LeaseLostError` and nothing changes."""
        check_status(status)
        if cause is not None and status != "interrupted":
            raise ValueError(f"an interruption cause is for interrupted runs, not {status!r} ones")
        values: dict[str, Any] = {"status": status, "interruption_cause": check_cause(cause)}
        now = utcnow()
        if status in ENDED_STATUSES:
            values["finished_at"] = now
        if error is not None:
            values["error"] = as_utf8(str(error))
        with self.db.session(write=True) as s:
            hold(s, run_id, epoch)
            run = s.get_one(Run, run_id)
            if status == "running" and run.started_at is None:
                values["started_at"] = now
            for key, value in values.items():
                setattr(run, key, value)

    def heartbeat(self, run_id: int, steps_done: int, owner: Optional[str] = None,
                  epoch: Optional[int] = None) -> None:
        """Stamp a run's heartbeat and progress. With ``owner``, a run that a sweep marked
        ``interrupted`` while this owner was only slow (a busy database) is ``running`` again
        (until it is requeued, which takes a new lease).  With ``epoch`` it holds only while
        that is still the run's lease, else :class:`LeaseLostError` and nothing changes."""
        now = utcnow()
        fence = [] if epoch is None else [Run.epoch == int(epoch)]
        with self.db.session(write=True) as s:
            res = s.execute(
                update(Run)
                .where(Run.id == run_id, *fence)
                .values(heartbeat_at=now, steps_done=check_int("steps_done", int(steps_done)))
                .execution_options(synchronize_session=False)
            )
            if rowcount(res) != 1:
                raise refused(s, run_id, epoch)
            if owner is not None:
                s.execute(
                    update(Run)
                    .where(Run.id == run_id, Run.owner == owner, Run.status == "interrupted", *fence)
                    .values(status="running", finished_at=None, error=None, interruption_cause=None)
                    .execution_options(synchronize_session=False)
                )

    def append_notes(self, run_id: int, text: str, *, epoch: Optional[int] = None) -> None:
        """Add a line to a run's notes (what happened to it: resumed, restarted); fenced
        by ``epoch`` as :meth:`set_status`."""
        with self.db.session(write=True) as s:
            hold(s, run_id, epoch)
            run = s.get_one(Run, run_id)
            text = as_utf8(str(text))
            notes = f"{run.notes}\n{text}" if run.notes else text
            run.notes = notes if len(notes) <= NOTES_MAX else "…" + notes[len(notes) - NOTES_MAX + 1:]

    def set_checkpoint_step(self, run_id: int, step: Optional[int], *, epoch: Optional[int] = None) -> None:
        """Record the step of the run's newest checkpoint (None: it has none); fenced by
        ``epoch`` as :meth:`set_status`."""
        self._update_run(run_id, epoch=epoch,
                         checkpoint_step=None if step is None else check_int("checkpoint_step", int(step)))

    def run_lease(self, run_id: int) -> tuple[int, bool]:
        """``(epoch, cancel_requested)`` of the run: what its owner polls to learn whether it
        still holds the run and whether to stop."""
        with self.db.session() as s:
            row = s.execute(select(Run.epoch, Run.cancel_requested).where(Run.id == run_id)).first()
        if row is None:
            raise run_not_found(run_id)
        return int(row[0] or 0), bool(row[1])

    def set_device(self, run_id: int, device: str, *, epoch: Optional[int] = None) -> None:
        """What trains the run (``engine.runner.jobs.device_kind``: kind, and `` × N`` on N
        devices); fenced by ``epoch`` as :meth:`set_status`."""
        self._update_run(run_id, epoch=epoch, device=str(device)[:200])

    def set_tags(self, run_id: int, tags: Iterable[str]) -> None:
        """Replace the run's tags (stripped, without duplicates, in order). An edit of the
        tags a user sees goes through :meth:`edit_tags` instead, so none made meanwhile is lost."""
        self._update_run(run_id, tags=clean_tags(tags))

    def edit_tags(self, run_id: int, change: Callable[[list[str]], Iterable[str]]) -> list[str]:
        """Store ``change(tags)`` as the run's tags, ``tags`` being those stored now, read and
        written in one transaction that holds the run's row (``SELECT … FOR UPDATE`` on
        PostgreSQL; SQLite's write lock, ``BEGIN IMMEDIATE``), so concurrent edits apply one
        after the other and none is lost; the tags stored (cleaned as :meth:`set_tags` does).
        ``change`` may raise to refuse the edit: nothing is stored then."""
        with self.db.session(write=True) as s:
            row = s.execute(select(Run.tags).where(Run.id == run_id).with_for_update()).one_or_none()
            if row is None:
                raise run_not_found(run_id)
            tags = clean_tags(change(list(row[0] or [])))
            s.execute(update(Run).where(Run.id == run_id).values(tags=tags).execution_options(synchronize_session=False))
        return tags

    def request_cancel(self, run_id: int) -> bool:
        """Queued -> cancelled now; running -> flag for the worker; False if already ended."""
        now = utcnow()
        with self.db.session(write=True) as s:
            res = s.execute(
                update(Run)
                .where(Run.id == run_id, Run.status == "queued")
                .values(status="cancelled", finished_at=now, cancel_requested=True)
                .execution_options(synchronize_session=False)
            )
            if rowcount(res) == 1:
                return True
            res = s.execute(
                update(Run)
                .where(Run.id == run_id, Run.status == "running")
                .values(cancel_requested=True)
                .execution_options(synchronize_session=False)
            )
            if rowcount(res) == 1:
                return True
            if s.execute(select(Run.id).where(Run.id == run_id)).first() is None:
                raise run_not_found(run_id)
            return False

    def cancel_requested(self, run_id: int) -> bool:
        with self.db.session() as s:
            flag = s.execute(select(Run.cancel_requested).where(Run.id == run_id)).first()
        if flag is None:
            raise run_not_found(run_id)
        return bool(flag[0])

    def active_runs_heartbeats(self) -> list[tuple[int, Optional[str], Optional[datetime]]]:
        """``(run_id, owner, last sign of life)`` of every running run, by id; the last sign
        of life is the heartbeat, else the start, else the creation time."""
        with self.db.session() as s:
            rows = s.execute(
                select(Run.id, Run.owner, Run.heartbeat_at, Run.started_at, Run.created_at)
                .where(Run.status == "running")
                .order_by(Run.id)
            ).all()
        return [(int(rid), owner, beat or started or created) for rid, owner, beat, started, created in rows]

    def mark_interrupted(self, reasons: Mapping[int, str]) -> list[int]:
        """Set each run still ``running`` to ``interrupted``, cause ``stale`` (its worker
        died), with its reason as the error; return the ids changed (a run that ended
        meanwhile is left as it is).  No reasons: nothing is written."""
        if not reasons:
            return []
        now = utcnow()
        changed = []
        with self.db.session(write=True) as s:
            for run_id, reason in reasons.items():
                res = s.execute(
                    update(Run)
                    .where(Run.id == int(run_id), Run.status == "running")
                    .values(status="interrupted", finished_at=now, error=str(reason),
                            interruption_cause=STALE_CAUSE)
                    .execution_options(synchronize_session=False)
                )
                if rowcount(res) == 1:
                    changed.append(int(run_id))
        return sorted(changed)

    def get_run(self, run_id: int) -> RunRecord:
        with self.db.session() as s:
            run = s.get(Run, run_id)
            if run is None:
                raise run_not_found(run_id)
            return RunRecord.from_row(run)

    def list_runs(self, statuses: Optional[Sequence[str]] = None) -> list[RunRecord]:
        stmt = select(Run).order_by(Run.id)
        if statuses is not None:
            statuses = [statuses] if isinstance(statuses, str) else list(statuses)
            stmt = stmt.where(Run.status.in_([check_status(st) for st in statuses]))
        with self.db.session() as s:
            return [RunRecord.from_row(r) for r in s.scalars(stmt)]

    def rename_run(self, run_id: int, name: str) -> None:
        self._update_run(run_id, name=_name(name))

    def set_notes(self, run_id: int, notes: str) -> None:
        self._update_run(run_id, notes=check_text("notes", str(notes or ""), NOTES_MAX))

    def _update_run(self, run_id: int, *, epoch: Optional[int] = None, **values: Any) -> None:
        fence = [] if epoch is None else [Run.epoch == int(epoch)]
        with self.db.session(write=True) as s:
            res = s.execute(
                update(Run).where(Run.id == run_id, *fence).values(**values).execution_options(synchronize_session=False)
            )
            if rowcount(res) != 1:
                raise refused(s, run_id, epoch)

    def delete_run(self, run_id: int, *, force: bool = False) -> None:
        """Delete a run, its metrics, evaluation losses and diagnostics.  A running run must be
        cancelled first unless ``force``."""
        with self.db.session(write=True) as s:
            status = s.execute(select(Run.status).where(Run.id == run_id).with_for_update()).scalar()
            if status is None:
                raise run_not_found(run_id)
            if status == "running" and not force:
                raise StorageError(f"run {run_id} is running; cancel it first, then delete it once it stops")
            s.execute(delete(Metric.__table__).where(Metric.__table__.c.run_id == run_id))
            s.execute(delete(EvalLosses.__table__).where(EvalLosses.__table__.c.run_id == run_id))
            s.execute(delete(Run.__table__).where(Run.__table__.c.id == run_id))

    def resolve_runs(self, refs: Sequence[Union[str, int]]) -> list[int]:
        """Ids for run ids or exact run names, in order, without duplicates."""
        if isinstance(refs, (str, int)):
            refs = [refs]
        with self.db.session() as s:
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
