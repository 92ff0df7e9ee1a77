"""pandas frames of runs, workers and diagnoses for tables and exports.

The repository ``store.frames`` of :class:`storage.store.RunStore`, over its :class:`storage.database.Database`."""

from __future__ import annotations

from dataclasses import fields
from typing import Callable, Optional

import pandas as pd
from sqlalchemy import select

from .database import Database, Repository
from .models import Diagnostic, Metric, Run
from .records import (
    DIAGNOSTIC_FIELDS,
    LAST_METRICS,
    RUN_INT_FIELDS,
    RUN_TIME_FIELDS,
    SCALAR_FIELDS,
    RunRecord,
    WorkerRecord,
)
from .workers import WorkersRepository


class FramesRepository(Repository):
    """pandas frames of runs, workers and diagnoses for tables and exports; the workers'
    come from the ``workers`` repository."""

    def __init__(self, db: Database, workers: WorkersRepository):
        super().__init__(db)
        self.workers = workers

    list_workers: Callable[[], list[WorkerRecord]]  # WorkersMixin's

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
        with self.db.session() as s:
            records = []
            for run, *lasts in s.execute(stmt):
                rec = RunRecord.from_row(run)
                row = {f: getattr(rec, f) for f in SCALAR_FIELDS}
                row.update(zip(LAST_METRICS, lasts))
                records.append(row)
        frame = pd.DataFrame.from_records(records, columns=[*SCALAR_FIELDS, *LAST_METRICS])
        for col in RUN_TIME_FIELDS:
            frame[col] = pd.to_datetime(frame[col], utc=True)
        for col in RUN_INT_FIELDS:
            frame[col] = frame[col].astype("Int64")
        frame["id"] = frame["id"].astype("int64")
        frame["history_version"] = frame["history_version"].astype("int64")
        frame["epoch"] = frame["epoch"].astype("int64")
        frame["cancel_requested"] = frame["cancel_requested"].astype(bool)
        for col in ("lam", *LAST_METRICS):
            frame[col] = frame[col].astype("float64")
        return frame

    def workers_frame(self) -> pd.DataFrame:
        cols = [f.name for f in fields(WorkerRecord)]
        frame = pd.DataFrame.from_records([[getattr(w, c) for c in cols] for w in self.workers.list_workers()], columns=cols)
        for col in ("started_at", "heartbeat_at"):
            frame[col] = pd.to_datetime(frame[col], utc=True)
        for col in ("pid", "current_run_id", "concurrent"):
            frame[col] = frame[col].astype("Int64")
        return frame

    def diagnostics_frame(self, run_id: Optional[int] = None) -> pd.DataFrame:
        """One row per diagnostic (of ``run_id``, or all), by id."""
        stmt = select(*(getattr(Diagnostic, c) for c in DIAGNOSTIC_FIELDS)).order_by(Diagnostic.id)
        if run_id is not None:
            stmt = stmt.where(Diagnostic.run_id == int(run_id))
        with self.db.session() as s:
            rows = [tuple(r) for r in s.execute(stmt)]
        frame = pd.DataFrame.from_records(rows, columns=list(DIAGNOSTIC_FIELDS))
        for col in ("created_at", "started_at", "finished_at", "heartbeat_at"):
            frame[col] = pd.to_datetime(frame[col], utc=True)
        frame["step"] = frame["step"].astype("Int64")
        frame[["id", "run_id"]] = frame[["id", "run_id"]].astype("int64")
        return frame
