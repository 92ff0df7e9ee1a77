"""The Runs page's tables as plain DataFrames (decoration is the views' job)."""

from __future__ import annotations

import hashlib
from datetime import datetime, timezone
from typing import Sequence

import numpy as np
import pandas as pd

RUNS_COLUMNS = [
    "id", "name", "sweep", "tags", "status", "progress", "estimator", "rank", "lam", "seed", "preset",
    "steps_done", "steps", "steps_text", "worker", "devices", "device", "train_loss", "val_loss", "mean_cos", "started", "duration_s",
    "checkpoint_step", "notes",
]
WORKERS_COLUMNS = ["id", "state", "host", "pid", "device", "current_run", "heartbeat_age_s"]


def device_parts(text) -> tuple[int | None, str | None]:
    """(device count, device kind) of a run's ``device`` text: ``"gpu: NVIDIA H200 × 4"``
    → (4, ``"gpu: NVIDIA H200"``); without `` × N`` one device; (None, None) when unknown."""
    if not isinstance(text, str) or not text:
        return None, None
    kind, sep, count = text.rpartition(" × ")
    if sep and count.isdigit():
        return int(count), kind
    return 1, text


def runs_view(frame: pd.DataFrame, now: datetime | None = None) -> pd.DataFrame:
    """``FramesRepository.frames.runs_frame()`` → the Runs table: status, progress in [0, 1]
    (steps done / steps, floored to a whole percent so a live run never reads 100 %
    before it ends), ``steps_text`` ("done/total"), the worker (its ``host:pid``
    owner, else its worker id), the devices it trains on (count and kind, ``device_parts``),
    the last losses and mean cosine, start time (UTC,
    naive) and duration in seconds (to ``now`` for running runs). Newest first (by id,
    descending): what was just launched is at the top."""
    if frame.empty:
        return pd.DataFrame(columns=RUNS_COLUMNS)
    now = now or datetime.now(timezone.utc)
    started = pd.to_datetime(frame["started_at"], utc=True)
    ended = pd.to_datetime(frame["finished_at"], utc=True)
    running = frame["status"] == "running"
    end = ended.where(~running, pd.Timestamp(now))
    steps = frame["steps"].astype("Float64")
    done = frame["steps_done"].astype("Float64")
    progress = (done / steps.where(steps > 0)).clip(0, 1).astype("float64")
    progress = np.floor(progress * 100 + 1e-9) / 100
    progress = progress.where(frame["status"] != "finished", 1.0)
    total = frame["steps"].astype("object").where(frame["steps"].notna(), "?")
    out = pd.DataFrame(
        {
            "id": frame["id"].astype("int64"),
            "name": frame["name"],
            "sweep": frame["sweep_id"],
            "tags": [list(t) if isinstance(t, (list, tuple)) else [] for t in frame["tags"]],
            "status": frame["status"],
            "progress": progress.astype("float64"),
            "estimator": frame["estimator"],
            "rank": frame["rank"],
            "lam": frame["lam"],
            "seed": frame["seed"],
            "preset": frame["preset"],
            "steps_done": frame["steps_done"],
            "steps": frame["steps"],
            "steps_text": [f"{int(d):,}/{t:,}" if isinstance(t, (int, np.integer)) else f"{int(d):,}/?"
                           for d, t in zip(frame["steps_done"].fillna(0), total)],
            "worker": frame["owner"].where(frame["owner"].notna(), frame["worker_id"]),
            "devices": pd.array([device_parts(d)[0] for d in frame["device"]], dtype="Int64"),
            "device": [device_parts(d)[1] for d in frame["device"]],
            "train_loss": frame["last_train_loss"],
            "val_loss": frame["last_val_loss"],
            "mean_cos": frame["last_mean_cos"],
            "started": started.dt.tz_convert(None),
            "duration_s": (end - started).dt.total_seconds(),
            "checkpoint_step": frame["checkpoint_step"],
            "notes": frame["notes"],
        }
    )
    return out.sort_values("id", ascending=False).reset_index(drop=True)


def sweeps_of(view: pd.DataFrame) -> list[str]:
    """The sweep ids in the table, newest first (ids start with their launch time)."""
    return sorted(set(view["sweep"].dropna()), reverse=True)


def tags_of(view: pd.DataFrame) -> list[str]:
    """Every tag in the table, sorted."""
    return sorted({t for tags in view["tags"] for t in tags})


def filter_runs(view: pd.DataFrame, text: str = "", statuses: Sequence[str] = (), estimators: Sequence[str] = (),
                sweeps: Sequence[str] = (), tags: Sequence[str] = ()) -> pd.DataFrame:
    """Rows whose name or notes contain ``text`` (case-insensitive), whose status is
    in ``statuses``, estimator in ``estimators``, sweep in ``sweeps``, and which carry
    at least one of ``tags`` (each empty = any)."""
    keep = pd.Series(True, index=view.index)
    if text.strip():
        needle = text.strip().lower()
        keep &= view["name"].str.lower().str.contains(needle, regex=False) | view["notes"].fillna("").str.lower().str.contains(needle, regex=False)
    if statuses:
        keep &= view["status"].isin(list(statuses))
    if estimators:
        keep &= view["estimator"].isin(list(estimators))
    if sweeps:
        keep &= view["sweep"].isin(list(sweeps))
    if tags:
        wanted = set(tags)
        keep &= view["tags"].map(lambda ts: bool(wanted.intersection(ts)))
    return view[keep].reset_index(drop=True)


NOT_STARTED = "⚠ not started"  # the status shown for an interrupted run that trained no step (``never_started``)
CAUSES = {  # why runs were interrupted (storage.records.INTERRUPTION_CAUSES), as a notice says it
    "signal": "because their process was stopped (a restart, Ctrl-C or a signal)",
    "stale": "because their worker died",
    "crash": "because their training crashed",
    "disk_full": "because the disk was full",
    None: "for a reason not recorded",
}


def never_started(frame: pd.DataFrame) -> pd.Series:
    """Which rows (of ``runs_frame`` or ``runs_view``) are interrupted runs that never trained a
    step: no step done and no checkpoint, so Resume trains them from step 0 and nothing is lost."""
    return (frame["status"] == "interrupted") & frame["steps_done"].fillna(0).eq(0) & frame["checkpoint_step"].isna()


def cause_text(cause: str | None, one: bool = False) -> str:
    """Why a run (``one``) or runs were interrupted: ``because its worker died``."""
    text = CAUSES.get(cause, CAUSES[None])
    return text.replace("their", "its") if one else text


def count_text(view: pd.DataFrame, total: int) -> str:
    """The count above the table, of the rows it shows (``view``) by status: ``2 finished ·
    1 failed · 3 in all``, or, when a filter hides some of the ``total`` runs, ``… · 3 of 16
    runs match the filters``."""
    counts = view["status"].value_counts()
    parts = [f"{counts[s]} {s}" for s in ("queued", "running", "finished", "failed", "cancelled", "interrupted")
             if s in counts]
    tail = f"{total} in all" if len(view) == total else f"{len(view)} of {total} runs match the filters"
    return " · ".join([*parts, tail])


def interrupted_text(frame: pd.DataFrame) -> str | None:
    """What the Runs page says of the interrupted runs of ``runs_frame`` (None: there are none):
    how many, why (their ``interruption_cause``), how many of them never trained a step, and
    what Resume all does with them."""
    rows = frame[frame["status"] == "interrupted"]
    n = len(rows)
    if not n:
        return None
    causes = rows["interruption_cause"].fillna("").value_counts()  # "": not recorded
    why = [(int(k), cause_text(c or None, one=n == 1)) for c, k in causes.items()]
    fresh = int(never_started(rows).sum())
    if n == 1:
        text = f"1 run was interrupted{' before its first step' if fresh else ''} {why[0][1]}"
        return f"{text}. Resume all continues it from its last checkpoint."
    text = f"{n} runs were interrupted" + (f" {why[0][1]}" if len(why) == 1 else ": " + ", ".join(f"{k} {w}" for k, w in why))
    if fresh:
        text += f"; {fresh} of them before {'its' if fresh == 1 else 'their'} first step (nothing trained, nothing lost)"
    return f"{text}. Resume all continues them from their last checkpoints."


def merge_selection(previous: Sequence[int], visible: Sequence[int], chosen: Sequence[int]) -> list[int]:
    """The app-wide selection after the user chose ``chosen`` among the ``visible``
    rows: selected runs hidden by a filter stay selected; order is kept."""
    visible_set = set(int(v) for v in visible)
    kept = [int(i) for i in previous if int(i) not in visible_set]
    return list(dict.fromkeys(kept + [int(c) for c in chosen]))


CHAR_PX, CELL_PAD_PX, CHIP_PAD_PX = 7.5, 18, 22  # the grid's 14 px font: width of a character, a cell's padding


def text_width(values, low: int = 60, high: int = 260) -> int:
    """A column width (px) that shows the longest of ``values`` whole, within [low, high]."""
    longest = max((len(str(v)) for v in values if isinstance(v, str)), default=0)
    return int(min(max(low, longest * CHAR_PX + CELL_PAD_PX), high))


def tags_width(tag_lists, low: int = 60, high: int = 320) -> int:
    """A width (px) for a tags column that shows the longest row's chips whole, within [low, high]."""
    longest = max((sum(len(t) * CHAR_PX + CHIP_PAD_PX for t in tags) for tags in tag_lists), default=0)
    return int(min(max(low, longest + CELL_PAD_PX), high))


def ids_at(visible: Sequence[int], rows: Sequence[int]) -> list[int]:
    """The run ids at the selected row positions ``rows`` of a table whose rows are ``visible``."""
    return [int(visible[r]) for r in rows if 0 <= r < len(visible)]


def table_key(prefix: str, visible: Sequence[int]) -> str:
    """A widget key for a table showing the runs ``visible`` in that order: another
    list of runs is another key, so a row selection never outlives its rows."""
    digest = hashlib.sha256(",".join(str(int(i)) for i in visible).encode()).hexdigest()[:12]
    return f"{prefix}.{digest}"


def workers_view(states: pd.DataFrame, now: datetime | None = None) -> pd.DataFrame:
    """``engine.runner.liveness.worker_states(...)`` → the Workers panel: id, state (active,
    stopped, gone), host, pid, device, the run it trains now and the seconds since its
    last heartbeat; active workers first, then by last heartbeat."""
    if states.empty:
        return pd.DataFrame(columns=WORKERS_COLUMNS)
    now = now or datetime.now(timezone.utc)
    beat = pd.to_datetime(states["heartbeat_at"], utc=True)
    out = pd.DataFrame(
        {
            "id": states["id"],
            "state": states["state"],
            "host": states["host"],
            "pid": states["pid"],
            "device": states["device"],
            "current_run": states["current_run_id"].where(states["state"] == "active"),
            "heartbeat_age_s": (pd.Timestamp(now) - beat).dt.total_seconds().clip(lower=0),
        }
    )
    order = out["state"].map({"active": 0, "gone": 1, "stopped": 2}).fillna(3)
    return out.assign(_o=order).sort_values(["_o", "heartbeat_age_s"]).drop(columns="_o").reset_index(drop=True)
