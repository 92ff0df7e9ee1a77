"""The per-session metrics cache: every metric row of the chosen runs, read incrementally."""

from __future__ import annotations

from typing import Iterable

import pandas as pd


class MetricsCache:
    """The metric rows of a chosen set of runs, kept current by reading only rows
    with ids above the largest already read (metric ids only grow, see storage).

    ``update(store, run_ids)`` returns every row of ``run_ids`` exactly once, ordered
    by id: rows of runs no longer asked for are dropped, runs newly asked for are
    read from the start, and the others from the last id read.
    """

    def __init__(self) -> None:
        self.frame = pd.DataFrame(columns=["id", "run_id", "step", "wall_time", "name", "value"])
        self.run_ids: frozenset[int] = frozenset()
        self.last_id = 0

    def update(self, store, run_ids: Iterable[int]) -> pd.DataFrame:
        wanted = list(dict.fromkeys(int(i) for i in run_ids))
        if set(self.run_ids) - set(wanted):
            self.frame = self.frame[self.frame["run_id"].isin(wanted)]
        old = [i for i in wanted if i in self.run_ids]
        added = [i for i in wanted if i not in self.run_ids]
        parts, marks = [], []
        # Two reads see the database at two moments; only ids up to the smaller of
        # their maxima are known complete, so the next read starts there and the
        # rows it reads again are dropped by id.
        if old:
            rows = store.metrics(old, after_id=self.last_id)
            parts.append(rows)
            marks.append(int(rows["id"].max()) if len(rows) else self.last_id)
        if added:
            rows = store.metrics(added)
            parts.append(rows)
            marks.append(int(rows["id"].max()) if len(rows) else self.last_id)
        fresh = [p for p in parts if len(p)]
        if fresh:
            frame = pd.concat([self.frame, *fresh], ignore_index=True) if len(self.frame) else pd.concat(fresh, ignore_index=True)
            frame = frame.drop_duplicates("id", keep="first") if len(fresh) > 1 or len(self.frame) else frame
            if added or len(fresh) > 1:
                frame = frame.sort_values("id", kind="stable")
            self.frame = frame.reset_index(drop=True)
        self.run_ids = frozenset(wanted)
        self.last_id = min(marks) if marks else self.last_id
        return self.frame
