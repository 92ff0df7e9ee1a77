"""The Runs table and the summary table, as plain DataFrames (decoration is the views' job)."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Sequence

import numpy as np
import pandas as pd

from engine.summary import table3

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



def _mean_std(mean: float, std: float, signed: bool = False) -> str:
    """``6.616``, ``6.616 ± 0.012`` (std when finite), ``+0.044`` when ``signed``; ``—`` for NaN."""
    if mean is None or not np.isfinite(mean):
        return "—"
    text = f"{mean:+.3f}" if signed else f"{mean:.3f}"
    return f"{text} ± {std:.3f}" if std is not None and np.isfinite(std) else text


def summary_table(summary: pd.DataFrame, info: pd.DataFrame) -> pd.DataFrame:
    """The paper's Table 3 form for the runs of ``summary`` (``summarize``), seeds
    pooled within each comparable config: method, rank, λ, seeds, step, memory
    compression (exact saved bytes / saved bytes, ``×``), final train and validation
    loss and Δ val to exact (``mean ± std`` when there are several seeds, ``—``
    when unknown), and ``paper val loss`` (the paper's Table 3, after 50,000 steps)
    when any row is of the paper preset. A ``setup`` column names the config
    differences when the runs mix setups. Ordered by setup, exact first, then rank."""
    if summary.empty:
        return pd.DataFrame()
    s = summary.merge(info[["run_id", "key", "setup"]], on="run_id")
    parts = []
    for (key, setup), sub in s.groupby(["key", "setup"], sort=False):
        t = table3(sub.drop(columns=["key", "setup"]))
        t["setup"] = setup
        parts.append(t)
    t = pd.concat(parts, ignore_index=True)
    t["_order"] = (t["estimator"] != "exact").astype(int)
    t = t.sort_values(["setup", "_order", "estimator", "rank", "lam"], kind="stable", na_position="first")
    out = pd.DataFrame({
        "setup": t["setup"],
        "method": [("exact" if e == "exact" else e) for e in t["estimator"]],
        "rank": t["rank"].astype("Int64"),
        "λ": t["lam"],
        "seeds": t["seeds"],
        "step": t["step"],
        "memory compression": [f"{c:.3f}×" if np.isfinite(c) else "—" for c in t["compression"]],
        "train loss": [_mean_std(m, sd) for m, sd in zip(t["train_loss"], t["train_loss_std"])],
        "val loss": [_mean_std(m, sd) for m, sd in zip(t["val_loss"], t["val_loss_std"])],
        "Δ val vs exact": [_mean_std(m, sd, signed=True) for m, sd in zip(t["delta_vs_exact"], t["delta_vs_exact_std"])],
        "paper val loss": [f"{p:.3f}" if np.isfinite(p) else "—" for p in t["paper_val_loss"]],
    })
    if not t["paper_val_loss"].notna().any():
        out = out.drop(columns="paper val loss")
    if (out["setup"] == "").all():
        out = out.drop(columns="setup")
    return out.reset_index(drop=True)
