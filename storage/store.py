"""RunStore: every read and write of runs and metrics goes through here.

Each method uses its own short session (``with Session(engine) as s, s.begin():``); write
methods run on :func:`storage.db.write_engine`, so on SQLite they take the write lock at
BEGIN and wait up to the busy timeout for it.  Metric ids only grow (AUTOINCREMENT on
SQLite, and SQLite commits writers one at a time), so a poller that remembers the largest
id it has seen can ask for ``metrics(run_ids, after_id=that_id)`` and miss nothing.
(On PostgreSQL ids come from a sequence and concurrent writers may commit out of order;
a poller there should re-read a small overlap.)
"""

from __future__ import annotations

import json
import os
import socket
from contextlib import contextmanager
from dataclasses import dataclass, fields
from datetime import datetime, timedelta
from typing import Any, Iterable, Iterator, Optional, Sequence, Union

import pandas as pd
from sqlalchemy import Engine, delete, exc, insert, select, update
from sqlalchemy.orm import Session

from .db import StorageError, ensure_schema, json_dumps, make_engine, write_engine
from .models import Metric, Run, utcnow

__all__ = [
    "RUN_STATUSES",
    "ACTIVE_STATUSES",
    "ENDED_STATUSES",
    "RunRecord",
    "RunStore",
    "RunNotFoundError",
    "current_owner",
    "pid_alive",
]

RUN_STATUSES = ("queued", "running", "finished", "failed", "cancelled", "interrupted")
ACTIVE_STATUSES = ("queued", "running")
ENDED_STATUSES = ("finished", "failed", "cancelled", "interrupted")
LAST_METRICS = {"last_train_loss": "train_loss", "last_val_loss": "val_loss", "last_mean_cos": "cos_mean"}
METRIC_COLUMNS = ("id", "run_id", "step", "wall_time", "name", "value")


class RunNotFoundError(StorageError, KeyError):
    """No run with that id or name (also a KeyError)."""

    __str__ = BaseException.__str__  # KeyError would quote the message


def current_owner() -> str:
    """``hostname:pid`` of this process, the owner recorded by :meth:`RunStore.claim`."""
    return f"{socket.gethostname()}:{os.getpid()}"


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


@dataclass(frozen=True)
class RunRecord:
    id: int
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

    @property
    def is_active(self) -> bool:
        return self.status in ACTIVE_STATUSES

    @classmethod
    def from_row(cls, run: Run) -> "RunRecord":
        return cls(
            id=run.id,
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
        )


SCALAR_FIELDS = tuple(f.name for f in fields(RunRecord) if f.name not in ("config", "versions"))
_TIME_FIELDS = ("created_at", "started_at", "finished_at", "heartbeat_at")
_INT_FIELDS = ("rank", "seed", "steps", "steps_done")


def _check_status(status: str) -> str:
    if status not in RUN_STATUSES:
        raise ValueError(f"unknown run status {status!r}; expected one of {', '.join(RUN_STATUSES)}")
    return status


def _not_found(ref: Any) -> RunNotFoundError:
    return RunNotFoundError(f"no run {ref}; `python -m engine list` shows the ids")


def _ids(run_ids: Union[int, Iterable[int]]) -> list[int]:
    if isinstance(run_ids, int) or hasattr(run_ids, "__index__"):  # one id (also numpy ints)
        return [int(run_ids)]  # type: ignore[arg-type]
    return [int(r) for r in dict.fromkeys(run_ids)]


def empty_metrics_frame() -> pd.DataFrame:
    return _metrics_frame([])


def _metrics_frame(rows: list) -> pd.DataFrame:
    frame = pd.DataFrame.from_records(rows, columns=list(METRIC_COLUMNS))
    return frame.astype(
        {"id": "int64", "run_id": "int64", "step": "int64", "wall_time": "float64", "value": "float64"}
    )


class RunStore:
    """Runs and metrics in the BASIS Lab database (see :mod:`storage.db` for where it lives)."""

    def __init__(self, url: Optional[str] = None, engine: Optional[Engine] = None):
        if engine is None:
            engine = make_engine(url)
        else:
            ensure_schema(engine)
        self._engine = engine
        self._write = write_engine(engine)

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
            reason = getattr(e, "orig", None) or e
            raise StorageError(f"database error on {self.url}: {reason}") from e

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
    ) -> int:
        _check_status(status)
        try:  # normalise (tuples -> lists, numpy scalars -> numbers) so reads equal writes
            config = json.loads(json_dumps(dict(config)))
            versions = json.loads(json_dumps(dict(versions or {})))
        except (TypeError, ValueError) as e:
            raise ValueError(f"run config must be JSON serialisable: {e}") from e
        now = utcnow()
        run = Run(
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
        )
        with self._session(write=True) as s:
            s.add(run)
            s.flush()
            return int(run.id)

    def claim(self, run_id: int, owner: str) -> bool:
        """Atomically move a queued run to running; False if it is no longer queued."""
        now = utcnow()
        with self._session(write=True) as s:
            res = s.execute(
                update(Run)
                .where(Run.id == run_id, Run.status == "queued", Run.cancel_requested.is_not(True))
                .values(status="running", started_at=now, heartbeat_at=now, owner=owner)
                .execution_options(synchronize_session=False)
            )
            return res.rowcount == 1

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

    def heartbeat(self, run_id: int, steps_done: int) -> None:
        with self._session(write=True) as s:
            res = s.execute(
                update(Run)
                .where(Run.id == run_id)
                .values(heartbeat_at=utcnow(), steps_done=int(steps_done))
                .execution_options(synchronize_session=False)
            )
            if res.rowcount != 1:
                raise _not_found(run_id)

    def add_metrics(self, run_id: int, rows: Iterable[tuple[int, float, str, float]]) -> None:
        """Append ``(step, wall_time, name, value)`` rows: one executemany, one transaction."""
        params = [
            {"run_id": run_id, "step": int(step), "wall_time": float(wall), "name": str(name), "value": float(value)}
            for step, wall, name, value in rows
        ]
        if not params:
            return
        with self._session(write=True) as s:
            if s.execute(select(Run.id).where(Run.id == run_id)).first() is None:
                raise _not_found(run_id)
            s.execute(insert(Metric.__table__), params)

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

    def mark_stale_interrupted(self, heartbeat_timeout_s: float = 120.0) -> list[int]:
        """Mark ``running`` runs whose worker died as ``interrupted``; return their ids.

        Stale: the owner is ``this-host:pid`` and that pid is not alive, or the last heartbeat
        (else start, else creation time) is older than ``heartbeat_timeout_s``.
        """
        host = socket.gethostname()
        now = utcnow()
        cutoff = now - timedelta(seconds=heartbeat_timeout_s)
        stale: dict[int, str] = {}
        with self._session(write=True) as s:
            rows = s.execute(
                select(Run.id, Run.owner, Run.heartbeat_at, Run.started_at, Run.created_at).where(
                    Run.status == "running"
                )
            ).all()
            for run_id, owner, beat, started, created in rows:
                o_host, _, o_pid = (owner or "").rpartition(":")
                if o_host == host and o_pid.isdigit() and not pid_alive(int(o_pid)):
                    stale[run_id] = f"interrupted: worker {owner} is no longer running"
                    continue
                last = beat or started or created
                if last is None or last < cutoff:
                    stale[run_id] = f"interrupted: no heartbeat from {owner or 'its worker'} since {last}"
            for run_id, reason in stale.items():
                s.execute(
                    update(Run)
                    .where(Run.id == run_id, Run.status == "running")
                    .values(status="interrupted", finished_at=now, error=reason)
                    .execution_options(synchronize_session=False)
                )
        return sorted(stale)

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
        """One row per run: the RunRecord scalar fields plus the last train/val loss and cos_mean."""
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
        if not ids or (names is not None and len(names) == 0):
            return empty_metrics_frame()
        mt = Metric.__table__
        stmt = select(*(mt.c[c] for c in METRIC_COLUMNS)).where(mt.c.run_id.in_(ids), mt.c.id > int(after_id))
        if names is not None:
            stmt = stmt.where(mt.c.name.in_([names] if isinstance(names, str) else list(names)))
        with self._session() as s:
            # plain tuples: DataFrame.from_records is ~8x slower on Row objects
            rows = [tuple(r) for r in s.connection().execute(stmt.order_by(mt.c.id))]
        return _metrics_frame(rows)

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
        """Delete a run and its metrics.  A running run must be cancelled first unless ``force``."""
        with self._session(write=True) as s:
            status = s.execute(select(Run.status).where(Run.id == run_id)).scalar()
            if status is None:
                raise _not_found(run_id)
            if status == "running" and not force:
                raise StorageError(
                    f"run {run_id} is running; cancel it first (`python -m engine cancel {run_id}`) and delete it once it stops"
                )
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
                raise RunNotFoundError(
                    f"no run with id or name {text!r}; `python -m engine list` shows the ids and names"
                )
            if found not in out:
                out.append(found)
        return out
