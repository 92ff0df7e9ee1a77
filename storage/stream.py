"""Streamed reads of the metrics table: frames of a bounded number of rows, never the whole table.

The rule: a streamed read holds at most about ``size`` rows (default :data:`CHUNK_ROWS`) at a
time, so its memory is bounded by the chunk, not by the table. Rows are read from a
server-side cursor (PostgreSQL; SQLite's cursor steps the statement itself) ``size`` at a
time, ordered by run id then metric id (the order each run recorded them), with the run ids
asked for in batches of :data:`RUN_BATCH` per query. With ``whole_runs`` a run is never split
between two frames, so a frame holds whole runs: about ``size`` rows, or one run's rows when
that run alone has more (what a per-run pivot needs; memory is then bounded by the larger of
the chunk and the largest run).

:class:`MetricsSnapshot` makes several reads in one transaction so they agree with each
other: the metric names of the runs and then their rows (SQLite: one read transaction;
PostgreSQL: ``REPEATABLE READ``). ``store.metrics.snapshot()`` opens one and
``store.metrics.chunks(...)`` reads in one (:class:`storage.metrics.MetricsRepository`).
"""

from __future__ import annotations

from bisect import bisect_left
from operator import itemgetter
from typing import Iterable, Iterator, Optional, Sequence

import pandas as pd
from sqlalchemy import Connection, select

from .models import Metric
from .records import METRIC_COLUMNS, as_ids, metrics_frame

__all__ = ["CHUNK_ROWS", "RUN_BATCH", "MetricsSnapshot"]

CHUNK_ROWS = 20_000  # metric rows per streamed frame: some 50 MB in flight (about 2.5 kB a row, all copies counted)
RUN_BATCH = 500  # run ids per query (an IN list every backend takes)
_RUN_ID = itemgetter(METRIC_COLUMNS.index("run_id"))


def _batches(ids: Sequence[int]) -> Iterator[list[int]]:
    n = RUN_BATCH
    for i in range(0, len(ids), n):
        yield list(ids[i:i + n])


def _names_list(names: Optional[Sequence[str]]) -> Optional[list[str]]:
    return None if names is None else ([names] if isinstance(names, str) else list(names))


def _cut(pending: list, size: int, whole_runs: bool) -> int:
    """How many rows of ``pending`` (>= ``size`` rows, by run id) make the next frame: ``size``,
    or with ``whole_runs`` every row before the last run's first (0: one run so far, read on)."""
    if not whole_runs:
        return size
    return bisect_left(pending, _RUN_ID(pending[-1]), key=_RUN_ID)


class MetricsSnapshot:
    """Reads of the metrics table over one connection in one transaction (see the module)."""

    def __init__(self, conn: Connection):
        self.conn = conn

    def names(self, run_ids: Iterable[int]) -> list[str]:
        """Every metric name the runs recorded, sorted."""
        mt = Metric.__table__
        found: set[str] = set()
        for batch in _batches(sorted(as_ids(run_ids))):
            found.update(self.conn.execute(select(mt.c.name).where(mt.c.run_id.in_(batch)).distinct()).scalars())
        return sorted(found)

    def chunks(self, run_ids: Iterable[int], *, names: Optional[Sequence[str]] = None, size: Optional[int] = None,
               whole_runs: bool = False) -> Iterator[pd.DataFrame]:
        """The metric rows of ``run_ids`` (``names``: only these; None: all) as frames of
        ``store.metrics``' columns, ordered by run id then id, about ``size`` rows each
        (default :data:`CHUNK_ROWS`); with ``whole_runs`` each frame holds whole runs.
        None when there are no rows."""
        size = max(1, int(size or CHUNK_ROWS))
        pending: list[tuple] = []
        for part in self._parts(sorted(as_ids(run_ids)), _names_list(names), size):
            pending.extend(part)
            del part  # the rows live in pending alone, so a frame cut from it frees them
            while len(pending) >= size:
                cut = _cut(pending, size, whole_runs)
                if not cut:
                    break
                yield metrics_frame(pending[:cut])
                del pending[:cut]
        if pending:
            yield metrics_frame(pending)

    def _parts(self, ids: list[int], names: Optional[list[str]], size: int) -> Iterator[list[tuple]]:
        """The rows as tuples, ``size`` at a time, from one streamed query per batch of runs."""
        if names is not None and not names:
            return
        mt = Metric.__table__
        for batch in _batches(ids):
            stmt = select(*(mt.c[c] for c in METRIC_COLUMNS)).where(mt.c.run_id.in_(batch))
            if names is not None:
                stmt = stmt.where(mt.c.name.in_(names))
            result = self.conn.execute(stmt.order_by(mt.c.run_id, mt.c.id),
                                       execution_options={"stream_results": True, "max_row_buffer": size})
            for rows in result.partitions(size):
                yield [tuple(r) for r in rows]  # plain tuples: from_records is ~8x slower on Row objects
