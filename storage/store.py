"""RunStore: every read and write of runs, metrics, workers and diagnostics goes through here.

Each method uses its own short session (``with Session(engine) as s, s.begin():``); write
methods run on :func:`storage.db.write_engine`, so on SQLite they take the write lock at
BEGIN and wait up to the busy timeout for it.  A database error becomes a one-line
:class:`StorageError`; a transient one (locked, busy, serialization failure, dropped
connection) a :class:`DatabaseBusyError` that the caller may retry.

Metric ids only grow (AUTOINCREMENT on SQLite, a sequence on PostgreSQL), and
:meth:`RunStore.add_metrics` locks its run's row first, so the writers of one run commit
their rows in id order on every backend (SQLite commits all writers one at a time anyway).
Writers of different runs may commit out of order on PostgreSQL, so an incremental reader
keeps one high-water mark per run: :class:`storage.feed.MetricsFeed`.

Liveness policy (which worker is dead, when a heartbeat is stale) is not decided here:
storage offers the rows (:meth:`RunStore.active_runs_heartbeats`) and the primitive
(:meth:`RunStore.mark_interrupted`), and ``engine/liveness.py`` decides.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any, Iterable, Iterator, Mapping, Optional, Sequence, Union

import pandas as pd
from sqlalchemy import Engine, and_, delete, exc, insert, or_, select, update
from sqlalchemy.orm import Session

from .db import StorageError, ensure_schema, json_dumps, make_engine, storage_error, write_engine
from .models import Diagnostic, DiagnosticResult, Metric, Run, Worker, new_uid, utcnow

__all__ = [
    "RUN_STATUSES",
    "ACTIVE_STATUSES",
    "ENDED_STATUSES",
    "RESUMABLE_STATUSES",
    "WORKER_STATUSES",
    "RunRecord",
    "WorkerRecord",
    "RunStore",
    "RunNotFoundError",
]

RUN_STATUSES = ("queued", "running", "finished", "failed", "cancelled", "interrupted")
ACTIVE_STATUSES = ("queued", "running")
ENDED_STATUSES = ("finished", "failed", "cancelled", "interrupted")
RESUMABLE_STATUSES = ("failed", "cancelled", "interrupted")  # what requeue() moves back to queued
WORKER_STATUSES = ("active", "stopped")
LAST_METRICS = {"last_train_loss": "train_loss", "last_val_loss": "val_loss", "last_mean_cos": "cos_mean"}
METRIC_COLUMNS = ("id", "run_id", "step", "wall_time", "name", "value")
DIAGNOSTIC_RESULT_COLUMNS = ("layer", "estimator", "rank", "lam", "bias2", "bias2_se", "variance", "mse",
                             "cos_mean", "keys", "batches")


class RunNotFoundError(StorageError, KeyError):
    """No run with that id or name (also a KeyError)."""

    __str__ = BaseException.__str__  # KeyError would quote the message


@dataclass(frozen=True)
class RunRecord:
    id: int
    uid: str
    name: str
    status: str
    created_at: Optional[datetime]
    started_at: Optional[datetime]
    finished_at: Optional[datetime]
    heartbeat_at: Optional[datetime]
    config: dict
    estimator: Optional[str]
    rank: Optional[int]
    lam: Optional[float]
    seed: Optional[int]
    preset: Optional[str]
    steps: Optional[int]
    steps_done: int
    error: Optional[str]
    notes: str
    versions: dict
    git_commit: Optional[str]
    device: Optional[str]
    owner: Optional[str]
    cancel_requested: bool
    sweep_id: Optional[str]
    tags: list
    worker_id: Optional[str]
    checkpoint_step: Optional[int]
    history_version: int

    @property
    def is_active(self) -> bool:
        return self.status in ACTIVE_STATUSES

    @classmethod
    def from_row(cls, run: Run) -> "RunRecord":
        return cls(
            id=run.id,
            uid=run.uid,
            name=run.name if run.name is not None else f"run-{run.id}",
            status=run.status or "finished",
            created_at=run.created_at,
            started_at=run.started_at,
            finished_at=run.finished_at,
            heartbeat_at=run.heartbeat_at,
            config=dict(run.config or {}),
            estimator=run.estimator,
            rank=run.rank,
            lam=run.lam,
            seed=run.seed,
            preset=run.preset,
            steps=run.steps,
            steps_done=run.steps_done or 0,
            error=run.error,
            notes=run.notes or "",
            versions=dict(run.versions or {}),
            git_commit=run.git_commit,
            device=run.device,
            owner=run.owner,
            cancel_requested=bool(run.cancel_requested),
            sweep_id=run.sweep_id,
            tags=list(run.tags or []),
            worker_id=run.worker_id,
            checkpoint_step=run.checkpoint_step,
            history_version=run.history_version or 0,
        )


@dataclass(frozen=True)
class WorkerRecord:
    id: str
    host: Optional[str]
    pid: Optional[int]
    device: Optional[str]
    started_at: Optional[datetime]
    heartbeat_at: Optional[datetime]
    current_run_id: Optional[int]
    status: str
    concurrent: Optional[int]

    @classmethod
    def from_row(cls, w: Worker) -> "WorkerRecord":
        return cls(**{f.name: getattr(w, f.name) for f in fields(cls)})


SCALAR_FIELDS = tuple(f.name for f in fields(RunRecord) if f.name not in ("config", "versions"))
_TIME_FIELDS = ("created_at", "started_at", "finished_at", "heartbeat_at")
_INT_FIELDS = ("rank", "seed", "steps", "steps_done", "checkpoint_step")
_DIAGNOSTIC_FIELDS = ("id", "uid", "run_id", "step", "status", "settings", "created_at", "started_at",
                      "finished_at", "heartbeat_at", "owner", "error", "notes")


def _check_status(status: str) -> str:
    if status not in RUN_STATUSES:
        raise ValueError(f"unknown run status {status!r}; expected one of {', '.join(RUN_STATUSES)}")
    return status


def _not_found(ref: Any) -> RunNotFoundError:
    return RunNotFoundError(f"no run {ref}; list the runs to see their ids")


def _ids(run_ids: Union[int, Iterable[int]]) -> list[int]:
    if isinstance(run_ids, int) or hasattr(run_ids, "__index__"):  # one id (also numpy ints)
        return [int(run_ids)]  # type: ignore[arg-type]
    return [int(r) for r in dict.fromkeys(run_ids)]


def _json_normal(value: Any, what: str) -> Any:
    """``value`` as JSON gives it back (tuples -> lists, numpy scalars -> numbers)."""
    try:
        return json.loads(json_dumps(value))
    except (TypeError, ValueError) as e:
        raise ValueError(f"{what} must be JSON serialisable: {e}") from e


def _tags(tags: Optional[Iterable[str]]) -> list[str]:
    if tags is None:
        return []
    if isinstance(tags, str):
        tags = [tags]
    out = [str(t).strip() for t in tags]
    if any(not t for t in out):
        raise ValueError("a tag cannot be empty")
    return list(dict.fromkeys(out))


def empty_metrics_frame() -> pd.DataFrame:
    return _metrics_frame([])


def _metrics_frame(rows: list) -> pd.DataFrame:
    frame = pd.DataFrame.from_records(rows, columns=list(METRIC_COLUMNS))
    return frame.astype(
        {"id": "int64", "run_id": "int64", "step": "int64", "wall_time": "float64", "value": "float64"}
    )


class RunStore:
    """Runs, metrics, workers and diagnostics in the BASIS Lab database (see :mod:`storage.db`).

    ``create=False`` refuses to make a new SQLite file (for commands that only read).
    """

    def __init__(self, url: Optional[str] = None, engine: Optional[Engine] = None, *, create: bool = True):
        if engine is None:
            engine = make_engine(url, create=create)
        else:
            try:
                ensure_schema(engine)
            except exc.SQLAlchemyError as e:
                raise storage_error(e, f"cannot open database {engine.url.render_as_string(hide_password=True)}") from e
        self._engine = engine
        self._write = write_engine(engine)
        self._pg = engine.dialect.name == "postgresql"

    @property
    def engine(self) -> Engine:
        return self._engine

    @property
    def url(self) -> str:
        return self._engine.url.render_as_string(hide_password=True)

    def __repr__(self) -> str:
        return f"RunStore({self.url!r})"

    def close(self) -> None:
        self._engine.dispose()

    @contextmanager
    def _session(self, write: bool = False) -> Iterator[Session]:
        try:
            with Session(self._write if write else self._engine, expire_on_commit=False) as s, s.begin():
                yield s
        except exc.SQLAlchemyError as e:
            raise storage_error(e, f"database error on {self.url}") from e

    # ------------------------------------------------------------------ runs

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

    def claim(self, run_id: int, owner: str, worker_id: Optional[str] = None) -> bool:
        """Atomically move a queued run to running; False if it is no longer queued."""
        now = utcnow()
        with self._session(write=True) as s:
            res = s.execute(
                update(Run)
                .where(Run.id == run_id, Run.status == "queued", Run.cancel_requested.is_not(True))
                .values(status="running", started_at=now, heartbeat_at=now, owner=owner, worker_id=worker_id)
                .execution_options(synchronize_session=False)
            )
            return res.rowcount == 1

    def claim_next(self, owner: str, worker_id: Optional[str] = None) -> Optional[int]:
        """Atomically take the oldest queued, non-cancelled run that no process owns and mark
        it running; its id, or None when there is none.

        PostgreSQL: ``SELECT … FOR UPDATE SKIP LOCKED`` then the update, in one transaction,
        so concurrent claimers take different runs without waiting on each other.  SQLite:
        the transaction starts with ``BEGIN IMMEDIATE``, so select and update are one step.
        """
        while True:
            now = utcnow()
            with self._session(write=True) as s:
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
                    .values(status="running", started_at=now, heartbeat_at=now, owner=owner, worker_id=worker_id,
                            finished_at=None, error=None)
                    .execution_options(synchronize_session=False)
                )
                if res.rowcount == 1:
                    return int(run_id)
            # taken by another claimer between our select and update (not possible with the
            # row lock / write lock held, kept as a guard): look again

    def requeue(self, run_ids: Union[int, Iterable[int]], owner: Optional[str] = None) -> list[int]:
        """Move ended runs (interrupted, cancelled, failed) back to ``queued`` so a worker
        can claim them again (to resume from ``checkpoint_step``); return the ids moved.

        Clears the error, finish time, cancel flag and worker, and sets the owner (None: any
        worker may claim them); keeps ``steps_done``,
        ``checkpoint_step`` and the metrics.  Runs in any other status are left alone;
        an unknown id raises :class:`RunNotFoundError` and moves nothing.
        """
        ids = _ids(run_ids)
        with self._session(write=True) as s:
            found = set(s.execute(select(Run.id).where(Run.id.in_(ids))).scalars())
            missing = [i for i in ids if i not in found]
            if missing:
                raise _not_found(missing[0])
            moved = s.execute(
                select(Run.id).where(Run.id.in_(ids), Run.status.in_(RESUMABLE_STATUSES)).with_for_update()
            ).scalars().all()
            if moved:
                s.execute(
                    update(Run)
                    .where(Run.id.in_(moved), Run.status.in_(RESUMABLE_STATUSES))
                    .values(status="queued", error=None, finished_at=None, cancel_requested=False,
                            owner=owner, worker_id=None, heartbeat_at=utcnow() if owner else None)
                    .execution_options(synchronize_session=False)
                )
        return sorted(int(i) for i in moved)

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

    def touch_queued(self, run_ids: Iterable[int], owner: str) -> None:
        """Stamp the heartbeat of queued runs that ``owner`` will train (they are not orphans)."""
        ids = _ids(run_ids)
        if not ids:
            return
        with self._session(write=True) as s:
            s.execute(
                update(Run)
                .where(Run.id.in_(ids), Run.status == "queued", Run.owner == owner)
                .values(heartbeat_at=utcnow())
                .execution_options(synchronize_session=False)
            )

    def queued_owners(self) -> list[tuple[int, str, Optional[datetime]]]:
        """``(run_id, owner, last sign of life)`` of queued runs that a process owns."""
        with self._session() as s:
            rows = s.execute(
                select(Run.id, Run.owner, Run.heartbeat_at, Run.created_at)
                .where(Run.status == "queued", Run.owner.is_not(None))
            ).all()
        return [(int(i), o, beat or created) for i, o, beat, created in rows]

    def release_queued(self, run_ids: Iterable[int]) -> list[int]:
        """Hand queued runs to any worker (owner None); the ids changed."""
        ids = _ids(run_ids)
        if not ids:
            return []
        with self._session(write=True) as s:
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
        with self._session(write=True) as s:
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

    def set_tags(self, run_id: int, tags: Iterable[str]) -> None:
        """Replace the run's tags (stripped, without duplicates, in order)."""
        self._update_run(run_id, tags=_tags(tags))

    def add_metrics(self, run_id: int, rows: Iterable[tuple[int, float, str, float]]) -> None:
        """Append ``(step, wall_time, name, value)`` rows: one executemany, one transaction.

        The run's row is locked first (``SELECT … FOR UPDATE`` on PostgreSQL; SQLite's write
        lock serialises all writers), so the writers of one run commit in id order.
        """
        params = [
            {"run_id": run_id, "step": int(step), "wall_time": float(wall), "name": str(name), "value": float(value)}
            for step, wall, name, value in rows
        ]
        if not params:
            return
        with self._session(write=True) as s:
            if s.execute(select(Run.id).where(Run.id == run_id).with_for_update()).first() is None:
                raise _not_found(run_id)
            s.execute(insert(Metric.__table__), params)

    def delete_metrics_after(self, run_id: int, step: int) -> int:
        """Delete the run's metrics with step > ``step`` (a resumed run rewrites them); return
        how many.  Bumps ``history_version`` so incremental readers re-read the run."""
        mt = Metric.__table__
        with self._session(write=True) as s:
            if s.execute(select(Run.id).where(Run.id == run_id).with_for_update()).first() is None:
                raise _not_found(run_id)
            n = s.execute(delete(mt).where(mt.c.run_id == run_id, mt.c.step > int(step))).rowcount
            s.execute(
                update(Run).where(Run.id == run_id)
                .values(history_version=Run.history_version + 1)
                .execution_options(synchronize_session=False)
            )
        return int(n or 0)

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

    def runs_frame(self) -> pd.DataFrame:
        """One row per run: the RunRecord fields but config and versions, plus the last
        train/val loss and cos_mean."""
        mt = Metric.__table__

        def last(metric: str):
            return (
                select(mt.c.value)
                .where(mt.c.run_id == Run.id, mt.c.name == metric)
                .order_by(mt.c.step.desc(), mt.c.id.desc())
                .limit(1)
                .scalar_subquery()
            )

        stmt = select(Run, *(last(m).label(col) for col, m in LAST_METRICS.items())).order_by(Run.id)
        with self._session() as s:
            records = []
            for run, *lasts in s.execute(stmt):
                rec = RunRecord.from_row(run)
                row = {f: getattr(rec, f) for f in SCALAR_FIELDS}
                row.update(zip(LAST_METRICS, lasts))
                records.append(row)
        frame = pd.DataFrame.from_records(records, columns=[*SCALAR_FIELDS, *LAST_METRICS])
        for col in _TIME_FIELDS:
            frame[col] = pd.to_datetime(frame[col], utc=True)
        for col in _INT_FIELDS:
            frame[col] = frame[col].astype("Int64")
        frame["id"] = frame["id"].astype("int64")
        frame["history_version"] = frame["history_version"].astype("int64")
        frame["cancel_requested"] = frame["cancel_requested"].astype(bool)
        for col in ("lam", *LAST_METRICS):
            frame[col] = frame[col].astype("float64")
        return frame

    def metrics(
        self,
        run_ids: Sequence[int],
        *,
        names: Optional[Sequence[str]] = None,
        after_id: int = 0,
    ) -> pd.DataFrame:
        """Metric rows of ``run_ids`` with id > ``after_id`` (all of them, unsampled), by id."""
        ids = _ids(run_ids)
        return self.metrics_after({i: int(after_id) for i in ids}, names=names)

    def metrics_after(self, marks: Mapping[int, int], *, names: Optional[Sequence[str]] = None) -> pd.DataFrame:
        """Metric rows with id > ``marks[run_id]`` for each run in ``marks``, by id (one query)."""
        if not marks or (names is not None and len(names) == 0):
            return empty_metrics_frame()
        mt = Metric.__table__
        by_mark: dict[int, list[int]] = {}
        for run_id, mark in marks.items():
            by_mark.setdefault(int(mark), []).append(int(run_id))
        cond = or_(*(and_(mt.c.run_id.in_(rids), mt.c.id > mark) for mark, rids in by_mark.items()))
        stmt = select(*(mt.c[c] for c in METRIC_COLUMNS)).where(cond)
        if names is not None:
            stmt = stmt.where(mt.c.name.in_([names] if isinstance(names, str) else list(names)))
        with self._session() as s:
            # plain tuples: DataFrame.from_records is ~8x slower on Row objects
            rows = [tuple(r) for r in s.connection().execute(stmt.order_by(mt.c.id))]
        return _metrics_frame(rows)

    def history_versions(self, run_ids: Iterable[int]) -> dict[int, int]:
        """``{run_id: history_version}`` for those of ``run_ids`` that exist."""
        ids = _ids(run_ids)
        if not ids:
            return {}
        with self._session() as s:
            rows = s.execute(select(Run.id, Run.history_version).where(Run.id.in_(ids))).all()
        return {int(rid): int(v or 0) for rid, v in rows}

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

    # ------------------------------------------------------------------ workers

    def register_worker(self, worker_id: str, host: str, pid: int, device: Optional[str] = None,
                        concurrent: int = 1) -> None:
        """Record a worker as ``active`` (again, if its id was seen before)."""
        worker_id = str(worker_id)
        if not (0 < len(worker_id) <= 64):
            raise ValueError(f"a worker id must be 1 to 64 characters (got {worker_id!r})")
        now = utcnow()
        values = dict(host=str(host), pid=int(pid), device=device, started_at=now, heartbeat_at=now,
                      current_run_id=None, status="active", concurrent=int(concurrent))
        with self._session(write=True) as s:
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
        with self._session(write=True) as s:
            res = s.execute(
                update(Worker).where(Worker.id == str(worker_id))
                .values(heartbeat_at=utcnow(), **values)
                .execution_options(synchronize_session=False)
            )
            if res.rowcount != 1:
                raise StorageError(f"no worker {worker_id!r}; register it first")

    def list_workers(self) -> list[WorkerRecord]:
        """Every registered worker, newest start first.  Whether a silent one is gone is the
        caller's policy (see ``engine/liveness.py``)."""
        with self._session() as s:
            return [WorkerRecord.from_row(w) for w in s.scalars(select(Worker).order_by(Worker.started_at.desc(), Worker.id))]

    def workers_frame(self) -> pd.DataFrame:
        cols = [f.name for f in fields(WorkerRecord)]
        frame = pd.DataFrame.from_records([[getattr(w, c) for c in cols] for w in self.list_workers()], columns=cols)
        for col in ("started_at", "heartbeat_at"):
            frame[col] = pd.to_datetime(frame[col], utc=True)
        for col in ("pid", "current_run_id", "concurrent"):
            frame[col] = frame[col].astype("Int64")
        return frame

    # ------------------------------------------------------------------ diagnostics

    def create_diagnostic(self, run_id: int, step: Optional[int], settings: Optional[dict] = None) -> int:
        """Queue an estimator-diagnostics job on the run's checkpoint at ``step``; its id."""
        settings = _json_normal(dict(settings or {}), "diagnostic settings")
        with self._session(write=True) as s:
            if s.execute(select(Run.id).where(Run.id == run_id)).first() is None:
                raise _not_found(run_id)
            diag = Diagnostic(uid=new_uid(), run_id=int(run_id), step=None if step is None else int(step),
                              status="queued", settings=settings, created_at=utcnow(), notes="")
            s.add(diag)
            s.flush()
            return int(diag.id)

    def claim_diagnostic(self, diag_id: int, owner: str) -> bool:
        """Atomically move a queued diagnostic to running; False if it is no longer queued."""
        now = utcnow()
        with self._session(write=True) as s:
            res = s.execute(
                update(Diagnostic)
                .where(Diagnostic.id == diag_id, Diagnostic.status == "queued")
                .values(status="running", started_at=now, heartbeat_at=now, owner=owner)
                .execution_options(synchronize_session=False)
            )
            return res.rowcount == 1

    def set_diagnostic_status(self, diag_id: int, status: str, error: Optional[str] = None) -> None:
        _check_status(status)
        now = utcnow()
        with self._session(write=True) as s:
            diag = s.get(Diagnostic, diag_id)
            if diag is None:
                raise StorageError(f"no diagnostic {diag_id}; list the run's diagnostics to see their ids")
            diag.status = status
            diag.heartbeat_at = now
            if status == "running" and diag.started_at is None:
                diag.started_at = now
            if status in ENDED_STATUSES:
                diag.finished_at = now
            if error is not None:
                diag.error = str(error)

    def add_diagnostic_results(self, diag_id: int, rows: Iterable[Mapping[str, Any]]) -> None:
        """Append result rows (keys from :data:`DIAGNOSTIC_RESULT_COLUMNS`; missing ones are NULL)."""
        params = []
        for row in rows:
            unknown = set(row) - set(DIAGNOSTIC_RESULT_COLUMNS)
            if unknown:
                raise ValueError(f"unknown diagnostic result fields {sorted(unknown)}; "
                                 f"expected some of {', '.join(DIAGNOSTIC_RESULT_COLUMNS)}")
            p = {c: row.get(c) for c in DIAGNOSTIC_RESULT_COLUMNS}
            for c in ("rank", "keys", "batches"):
                p[c] = None if p[c] is None else int(p[c])
            for c in ("lam", "bias2", "bias2_se", "variance", "mse", "cos_mean"):
                p[c] = None if p[c] is None else float(p[c])
            params.append({"diagnostic_id": int(diag_id), **p})
        if not params:
            return
        with self._session(write=True) as s:
            if s.get(Diagnostic, diag_id) is None:
                raise StorageError(f"no diagnostic {diag_id}; list the run's diagnostics to see their ids")
            s.execute(insert(DiagnosticResult.__table__), params)

    def diagnostics_frame(self, run_id: Optional[int] = None) -> pd.DataFrame:
        """One row per diagnostic (of ``run_id``, or all), by id."""
        stmt = select(*(getattr(Diagnostic, c) for c in _DIAGNOSTIC_FIELDS)).order_by(Diagnostic.id)
        if run_id is not None:
            stmt = stmt.where(Diagnostic.run_id == int(run_id))
        with self._session() as s:
            rows = [tuple(r) for r in s.execute(stmt)]
        frame = pd.DataFrame.from_records(rows, columns=list(_DIAGNOSTIC_FIELDS))
        for col in ("created_at", "started_at", "finished_at", "heartbeat_at"):
            frame[col] = pd.to_datetime(frame[col], utc=True)
        frame["step"] = frame["step"].astype("Int64")
        frame[["id", "run_id"]] = frame[["id", "run_id"]].astype("int64")
        return frame

    def diagnostic_results(self, diag_id: int) -> pd.DataFrame:
        """The result rows of one diagnostic, in the order they were added."""
        rt = DiagnosticResult.__table__
        stmt = select(*(rt.c[c] for c in DIAGNOSTIC_RESULT_COLUMNS)).where(rt.c.diagnostic_id == int(diag_id))
        with self._session() as s:
            rows = [tuple(r) for r in s.execute(stmt.order_by(rt.c.id))]
        frame = pd.DataFrame.from_records(rows, columns=list(DIAGNOSTIC_RESULT_COLUMNS))
        for col in ("rank", "keys", "batches"):
            frame[col] = frame[col].astype("Int64")
        for col in ("lam", "bias2", "bias2_se", "variance", "mse", "cos_mean"):
            frame[col] = frame[col].astype("float64")
        return frame
