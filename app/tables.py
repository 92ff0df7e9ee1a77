"""The Runs table as a plain DataFrame (decoration is the views' job)."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Sequence

import pandas as pd


RUNS_COLUMNS = [
    "id", "name", "status", "progress", "estimator", "rank", "lam", "seed", "preset",
    "steps_done", "steps", "train_loss", "val_loss", "mean_cos", "started", "duration_s", "notes",
]


def runs_view(frame: pd.DataFrame, now: datetime | None = None) -> pd.DataFrame:
    """``RunStore.runs_frame()`` → the Runs table: status, progress in
    [0, 1] (steps done / steps), the last losses and mean cosine, start time (UTC,
    naive) and duration in seconds (to ``now`` for running runs). Ordered by id."""
    if frame.empty:
        return pd.DataFrame(columns=RUNS_COLUMNS)
    now = now or datetime.now(timezone.utc)
    started = pd.to_datetime(frame["started_at"], utc=True)
    ended = pd.to_datetime(frame["finished_at"], utc=True)
    running = frame["status"] == "running"
    end = ended.where(~running, pd.Timestamp(now))
    steps = frame["steps"].astype("Float64")
    done = frame["steps_done"].astype("Float64")
    progress = (done / steps.where(steps > 0)).clip(0, 1)
    progress = progress.where(frame["status"] != "finished", 1.0)
    out = pd.DataFrame(
        {
            "id": frame["id"].astype("int64"),
            "name": frame["name"],
            "status": frame["status"],
            "progress": progress.astype("float64"),
            "estimator": frame["estimator"],
            "rank": frame["rank"],
            "lam": frame["lam"],
            "seed": frame["seed"],
            "preset": frame["preset"],
            "steps_done": frame["steps_done"],
            "steps": frame["steps"],
            "train_loss": frame["last_train_loss"],
            "val_loss": frame["last_val_loss"],
            "mean_cos": frame["last_mean_cos"],
            "started": started.dt.tz_convert(None),
            "duration_s": (end - started).dt.total_seconds(),
            "notes": frame["notes"],
        }
    )
    return out.sort_values("id").reset_index(drop=True)


def filter_runs(view: pd.DataFrame, text: str = "", statuses: Sequence[str] = (), estimators: Sequence[str] = ()) -> pd.DataFrame:
    """Rows whose name or notes contain ``text`` (case-insensitive), whose status is
    in ``statuses`` and estimator in ``estimators`` (empty = any)."""
    keep = pd.Series(True, index=view.index)
    if text.strip():
        needle = text.strip().lower()
        keep &= view["name"].str.lower().str.contains(needle, regex=False) | view["notes"].fillna("").str.lower().str.contains(needle, regex=False)
    if statuses:
        keep &= view["status"].isin(list(statuses))
    if estimators:
        keep &= view["estimator"].isin(list(estimators))
    return view[keep].reset_index(drop=True)


def merge_selection(previous: Sequence[int], visible: Sequence[int], chosen: Sequence[int]) -> list[int]:
    """The app-wide selection after the user chose ``chosen`` among the ``visible``
    rows: selected runs hidden by a filter stay selected; order is kept."""
    visible_set = set(int(v) for v in visible)
    kept = [int(i) for i in previous if int(i) not in visible_set]
    return list(dict.fromkeys(kept + [int(c) for c in chosen]))
