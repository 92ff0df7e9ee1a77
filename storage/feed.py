"""MetricsFeed: an incremental reader of metrics that misses nothing on any backend.

A poller that remembers one "largest id seen" can miss rows on PostgreSQL, where writers of
different runs may commit their sequence ids out of order (id 11 visible before id 10).
Within one run they cannot: :meth:`storage.metrics.MetricsRepository.add_metrics` locks the run's row,
so its writers commit in id order.  The feed therefore keeps one high-water mark per run and
asks for ``run_id = r AND id > mark[r]`` for each run: every row of run ``r`` below a row it
has seen was committed before it, hence already seen.

A resumed run may delete its metrics past its checkpoint (``delete_metrics_after``), which
bumps the run's ``history_version``.  The feed reads the versions before the metrics; when a
run's version changed it forgets that run's rows and re-reads them all (and lists the run in
:attr:`MetricsFeed.replaced`), so the curve shows the new history without duplicates.
"""

from __future__ import annotations

from typing import Iterable, Optional, Sequence

import pandas as pd

from .store import RunStore, empty_metrics_frame

__all__ = ["MetricsFeed"]


class MetricsFeed:
    """Per-run high-water marks over the metrics table; :attr:`frame` holds every row read
    for the runs of the last poll (by id), :meth:`poll` returns the rows new to it."""

    def __init__(self, names: Optional[Sequence[str]] = None):
        self.names = None if names is None else list(names)
        self.frame: pd.DataFrame = empty_metrics_frame()
        self.replaced: frozenset[int] = frozenset()  # runs whose history was replaced at the last poll
        self._marks: dict[int, int] = {}
        self._versions: dict[int, int] = {}

    def marks(self) -> dict[int, int]:
        """``{run_id: largest metric id read}`` (0 for a run with none yet)."""
        return dict(self._marks)

    def poll(self, store: RunStore, run_ids: Iterable[int]) -> pd.DataFrame:
        """Rows of ``run_ids`` not returned before (all rows of a run new to the feed or whose
        history was replaced), by id.  Runs not asked for, or deleted, are forgotten."""
        wanted = list(dict.fromkeys(int(r) for r in run_ids))
        versions = store.metrics.history_versions(wanted)  # before the metrics: see the module doc
        live = [r for r in wanted if r in versions]
        replaced = {r for r in live if r in self._versions and self._versions[r] != versions[r]}
        keep = set(live) - replaced
        for r in list(self._marks):
            if r not in keep:
                del self._marks[r]
                self._versions.pop(r, None)
        if len(self.frame) and not self.frame["run_id"].isin(keep).all():
            self.frame = self.frame[self.frame["run_id"].isin(keep)].reset_index(drop=True)
        new = store.metrics.metrics_after({r: self._marks.get(r, 0) for r in live}, names=self.names)
        for r in live:
            self._versions[r] = versions[r]
            self._marks.setdefault(r, 0)
        if len(new):
            for r, top in new.groupby("run_id")["id"].max().items():
                self._marks[int(r)] = max(self._marks[int(r)], int(top))
            if not len(self.frame):
                self.frame = new
            else:
                frame = pd.concat([self.frame, new], ignore_index=True)
                if new["id"].iloc[0] < self.frame["id"].iloc[-1]:  # a late commit or a re-read run
                    frame = frame.sort_values("id", kind="stable").reset_index(drop=True)
                self.frame = frame
        self.replaced = frozenset(replaced)
        return new
