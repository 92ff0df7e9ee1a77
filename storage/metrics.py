"""The metrics table: appends in id order per run, reads (whole, incremental, streamed), truncation on resume.

Streamed reads (a chunk of rows at a time, in one snapshot) are :mod:`storage.stream`'s.

A metric is stored once per (run, name, step) (a unique index): a row whose key is stored
already is skipped (``INSERT … ON CONFLICT DO NOTHING`` on both backends). The writes that
meet one are a write retried after its commit went through unseen, which holds the same
values; a resume that recomputes stored steps deletes them first (``delete_metrics_after``).
The per-batch losses of a record's evaluation (:mod:`storage.eval_losses`) are written with its
metrics, in their transaction, and truncated with them.

The repository ``store.metrics`` of :class:`storage.store.RunStore`, over its :class:`storage.database.Database`."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterable, Iterator, Mapping, Optional, Sequence

import pandas as pd
from sqlalchemy import Connection, and_, delete, func, or_, select, update

from .database import Repository
from .db import rowcount
from .eval_losses import EvalRow, delete_after, rows_of
from .eval_losses import insert as insert_eval_losses
from .lease import hold
from .limits import check_int
from .models import Metric, Run
from .records import METRIC_COLUMNS, as_ids, empty_metrics_frame, metrics_frame
from .stream import CHUNK_ROWS, MetricsSnapshot

MARK_BATCH = 200  # distinct high-water marks per query of ``metrics_after``


def _rows_after(conn: Connection, groups: list[tuple[int, list[int]]],
                names: Optional[list[str]]) -> Iterator[pd.DataFrame]:
    """The rows with ``run_id`` in each group's runs and id > its mark, by id, as frames of
    ``CHUNK_ROWS`` rows (streamed: the rows as tuples are never all in memory at once)."""
    mt = Metric.__table__
    cond = or_(*(and_(mt.c.run_id.in_(rids), mt.c.id > mark) for mark, rids in groups))
    stmt = select(*(mt.c[c] for c in METRIC_COLUMNS)).where(cond)
    if names is not None:
        stmt = stmt.where(mt.c.name.in_(names))
    result = conn.execute(stmt.order_by(mt.c.id), execution_options={"stream_results": True, "max_row_buffer": CHUNK_ROWS})
    for rows in result.partitions(CHUNK_ROWS):
        yield metrics_frame([tuple(r) for r in rows])  # plain tuples: from_records is ~8x slower on Row objects


class MetricsRepository(Repository):
    """The metrics table: appends in id order per run, reads (whole and incremental), truncation on resume."""

    def add_metrics(self, run_id: int, rows: Iterable[tuple[int, float, str, float]], *,
                    epoch: Optional[int] = None, eval_losses: Iterable[EvalRow] = ()) -> None:
        """Append ``(step, wall_time, name, value)`` rows: one executemany, one transaction;
        a row whose (name, step) the run holds already is skipped (see the module). The
        ``eval_losses`` rows ``(step, split, per-batch losses)`` of the same records are stored
        in the same transaction (:mod:`storage.eval_losses`; a (step, split) stored already is
        skipped too), so a record is stored whole or not at all.

        The run's row is locked first (``SELECT … FOR UPDATE`` on PostgreSQL; SQLite's write
        lock serialises all writers), so the writers of one run commit in id order.  With
        ``epoch`` (an owner's write) the rows are stored only while that is still the run's
        lease, checked under that lock; else :class:`LeaseLostError` and nothing is stored.
        """
        params: list[dict[str, Any]] = [
            {"run_id": run_id, "step": int(step), "wall_time": float(wall), "name": str(name), "value": float(value)}
            for step, wall, name, value in rows
        ]
        losses = rows_of(run_id, eval_losses)
        if not params and not losses:
            return
        if params:
            check_int("step", min(p["step"] for p in params))
            check_int("step", max(p["step"] for p in params))
        with self.db.session(write=True) as s:
            hold(s, run_id, epoch)
            if params:
                s.execute(self.db.insert(Metric.__table__).on_conflict_do_nothing(
                    index_elements=["run_id", "name", "step"]), params)
            insert_eval_losses(self.db, s, losses)

    def delete_metrics_after(self, run_id: int, step: int, *, epoch: Optional[int] = None) -> int:
        """Delete the run's metrics with step > ``step`` (a resumed run rewrites them), and its
        per-batch evaluation losses past it (:mod:`storage.eval_losses`) in the same transaction;
        return how many metrics.  When it deleted any metric, bumps ``history_version`` so
        incremental readers re-read the run.  Fenced by ``epoch`` as :meth:`add_metrics`."""
        mt = Metric.__table__
        with self.db.session(write=True) as s:
            hold(s, run_id, epoch)
            n = rowcount(s.execute(delete(mt).where(mt.c.run_id == run_id, mt.c.step > int(step))))
            delete_after(s, run_id, step)
            if n:
                s.execute(
                    update(Run).where(Run.id == run_id)
                    .values(history_version=Run.history_version + 1)
                    .execution_options(synchronize_session=False)
                )
        return int(n or 0)

    def read(
        self,
        run_ids: Sequence[int],
        *,
        names: Optional[Sequence[str]] = None,
        after_id: int = 0,
    ) -> pd.DataFrame:
        """Metric rows of ``run_ids`` with id > ``after_id`` (all of them, unsampled), by id."""
        ids = as_ids(run_ids)
        return self.metrics_after({i: int(after_id) for i in ids}, names=names)

    __call__ = read  # ``store.metrics(run_ids)``: the store's read before it had repositories

    def metrics_after(self, marks: Mapping[int, int], *, names: Optional[Sequence[str]] = None) -> pd.DataFrame:
        """Metric rows with id > ``marks[run_id]`` for each run in ``marks``, by id: one query
        per ``MARK_BATCH`` distinct marks (SQLite refuses an expression deeper than 1000, and
        runs that have read on hold a mark each), in one transaction, each read
        ``storage.stream.CHUNK_ROWS`` rows at a time (memory holds the frame and one chunk)."""
        if not marks or (names is not None and len(names) == 0):
            return empty_metrics_frame()
        by_mark: dict[int, list[int]] = {}
        for run_id, mark in marks.items():
            by_mark.setdefault(int(mark), []).append(int(run_id))
        groups = list(by_mark.items())
        names = None if names is None else ([names] if isinstance(names, str) else list(names))
        with self.db.session() as s:
            parts = [part for i in range(0, len(groups), MARK_BATCH)
                     for part in _rows_after(s.connection(), groups[i:i + MARK_BATCH], names)]
        frame = pd.concat(parts, ignore_index=True) if len(parts) > 1 else (parts[0] if parts else empty_metrics_frame())
        return frame.sort_values("id", kind="stable", ignore_index=True) if len(groups) > MARK_BATCH else frame

    @contextmanager
    def snapshot(self) -> Iterator[MetricsSnapshot]:
        """Reads that agree with each other (:mod:`storage.stream`): one read transaction,
        ``REPEATABLE READ`` on PostgreSQL."""
        options = {"isolation_level": "REPEATABLE READ"} if self.db.is_postgresql else {}
        with self.db.session() as s:
            yield MetricsSnapshot(s.connection(execution_options=options))

    def chunks(self, run_ids: Iterable[int], *, names: Optional[Sequence[str]] = None, size: Optional[int] = None,
               whole_runs: bool = False) -> Iterator[pd.DataFrame]:
        """The rows of ``run_ids`` streamed in frames of about ``size`` rows (whole runs with
        ``whole_runs``), by run id then id, in a snapshot of their own: memory bounded by the
        chunk, not the table (:meth:`storage.stream.MetricsSnapshot.chunks`)."""
        with self.snapshot() as snap:
            yield from snap.chunks(run_ids, names=names, size=size, whole_runs=whole_runs)

    def history_versions(self, run_ids: Iterable[int]) -> dict[int, int]:
        """``{run_id: history_version}`` for those of ``run_ids`` that exist."""
        ids = as_ids(run_ids)
        if not ids:
            return {}
        with self.db.session() as s:
            rows = s.execute(select(Run.id, Run.history_version).where(Run.id.in_(ids))).all()
        return {int(rid): int(v or 0) for rid, v in rows}

    def final_metrics(self, run_ids: Optional[Sequence[int]] = None, *,
                      names: Optional[Sequence[str]] = None) -> pd.DataFrame:
        """Each run's latest value of each metric: one row per (run_id, name) with the
        ``step``, ``wall_time`` and ``value`` of its row of highest step ((run_id, name,
        step) is unique), by run_id and name. ``run_ids``/``names`` None: all."""
        mt = Metric.__table__
        if (run_ids is not None and len(run_ids) == 0) or (names is not None and len(names) == 0):
            return pd.DataFrame(columns=["run_id", "name", "step", "wall_time", "value"]).astype(
                {"run_id": "int64", "step": "int64", "wall_time": "float64", "value": "float64"})
        order = func.row_number().over(partition_by=(mt.c.run_id, mt.c.name), order_by=(mt.c.step.desc(), mt.c.id.desc()))
        inner = select(mt.c.run_id, mt.c.name, mt.c.step, mt.c.wall_time, mt.c.value, order.label("nth"))
        if run_ids is not None:
            inner = inner.where(mt.c.run_id.in_(as_ids(run_ids)))
        if names is not None:
            inner = inner.where(mt.c.name.in_([names] if isinstance(names, str) else list(names)))
        sub = inner.subquery()
        stmt = (select(sub.c.run_id, sub.c.name, sub.c.step, sub.c.wall_time, sub.c.value)
                .where(sub.c.nth == 1).order_by(sub.c.run_id, sub.c.name))
        with self.db.session() as s:
            rows = [tuple(r) for r in s.connection().execute(stmt)]
        frame = pd.DataFrame.from_records(rows, columns=["run_id", "name", "step", "wall_time", "value"])
        return frame.astype({"run_id": "int64", "step": "int64", "wall_time": "float64", "value": "float64"})

    def metric_names(self, run_ids: Optional[Iterable[int]] = None) -> list[str]:
        """Every metric name any run (of ``run_ids``; None: of all) has recorded, sorted."""
        mt = Metric.__table__
        if run_ids is not None:
            with self.snapshot() as snap:
                return snap.names(run_ids)
        with self.db.session() as s:
            return sorted(s.execute(select(mt.c.name).distinct()).scalars())
