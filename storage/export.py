"""CSV export of runs and their metrics, unsampled, in two shapes.

* long: one row per recorded metric value —
  ``run_id, run_name, estimator, rank, lam, seed, step, wall_time, metric, value``.
* wide: one row per (run, step) — ``run_id, run_name, estimator, rank, lam, seed, preset,
  steps``, the run config flattened into ``config.<key>`` (nested keys joined with ``.``,
  lists as JSON), ``step``, ``wall_time`` (the latest wall time at that step), then one column
  per metric name (the last value recorded at that step; a metric whose name clashes with a
  column above is called ``metric.<name>``).

Floats are written with full precision, so ``pandas.read_csv`` gives back the stored values.
"""

from __future__ import annotations

import json
import os
from typing import Any, Optional, Sequence

import pandas as pd

from .db import StorageError
from .store import RunRecord, RunStore

__all__ = ["LONG_COLUMNS", "WIDE_RUN_COLUMNS", "EXPORT_FORMATS", "long_frame", "wide_frame", "export_csv", "to_csv_bytes", "flatten_config"]

LONG_COLUMNS = ["run_id", "run_name", "estimator", "rank", "lam", "seed", "step", "wall_time", "metric", "value"]
WIDE_RUN_COLUMNS = ["run_id", "run_name", "estimator", "rank", "lam", "seed", "preset", "steps"]
EXPORT_FORMATS = ("long", "wide")


def flatten_config(config: dict, prefix: str = "config.") -> dict[str, Any]:
    """``{"a": {"b": 1}, "c": [1, 2]}`` -> ``{"config.a.b": 1, "config.c": "[1, 2]"}``."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten_config(value, name + "."))
        elif isinstance(value, (dict, list, tuple)):
            out[name] = json.dumps(value)
        else:
            out[name] = value
    return out


def _runs(store: RunStore, run_ids: Optional[Sequence[int]]) -> list[RunRecord]:
    if run_ids is None:
        return store.list_runs()
    if isinstance(run_ids, int):
        run_ids = [run_ids]
    return [store.get_run(int(r)) for r in dict.fromkeys(run_ids)]


def _run_info(runs: list[RunRecord], columns: list[str], config: bool = False) -> pd.DataFrame:
    rows = []
    for r in runs:
        row = {"run_id": r.id, "run_name": r.name, **{c: getattr(r, c) for c in columns[2:]}}
        if config:
            row.update(flatten_config(r.config))
        rows.append(row)
    frame = pd.DataFrame.from_records(rows)
    if frame.empty:
        frame = pd.DataFrame(columns=columns)
    frame["run_id"] = frame["run_id"].astype("int64")
    for col in ("rank", "seed", "steps"):
        if col in frame:
            frame[col] = frame[col].astype("Int64")
    return frame


def long_frame(store: RunStore, run_ids: Optional[Sequence[int]]) -> pd.DataFrame:
    """Every metric value of ``run_ids`` (None: all runs), ordered by run then record order."""
    runs = _runs(store, run_ids)
    info = _run_info(runs, LONG_COLUMNS[:6])
    m = store.metrics([r.id for r in runs])
    out = m.merge(info, on="run_id", how="left").rename(columns={"name": "metric"})
    out = out.sort_values(["run_id", "id"], kind="stable")
    return out[LONG_COLUMNS].reset_index(drop=True)


def wide_frame(store: RunStore, run_ids: Optional[Sequence[int]]) -> pd.DataFrame:
    """One row per (run, step) with run/config columns and one column per metric."""
    runs = _runs(store, run_ids)
    info = _run_info(runs, WIDE_RUN_COLUMNS, config=True)
    config_cols = sorted(c for c in info.columns if c.startswith("config."))
    info = info[WIDE_RUN_COLUMNS + config_cols]
    m = store.metrics([r.id for r in runs])
    taken = set(info.columns) | {"step", "wall_time"}
    m["name"] = [f"metric.{n}" if n in taken else n for n in m["name"]]
    metric_cols = sorted(set(m["name"]))
    if m.empty:
        per_step = pd.DataFrame({"run_id": pd.Series(dtype="int64"), "step": pd.Series(dtype="int64"),
                                 "wall_time": pd.Series(dtype="float64")})
    else:
        wall = m.groupby(["run_id", "step"])["wall_time"].max()
        last = m.drop_duplicates(["run_id", "step", "name"], keep="last")  # m is ordered by id
        values = last.pivot(index=["run_id", "step"], columns="name", values="value")
        values.columns.name = None
        per_step = wall.to_frame().join(values).reset_index()
    out = info.merge(per_step, on="run_id", how="inner")
    out = out.sort_values(["run_id", "step"], kind="stable").reset_index(drop=True)
    return out[[*WIDE_RUN_COLUMNS, *config_cols, "step", "wall_time", *metric_cols]]


def to_csv_bytes(frame: pd.DataFrame) -> bytes:
    """UTF-8 CSV of ``frame`` without the index (for a download button)."""
    return frame.to_csv(index=False).encode("utf-8")


def export_csv(
    store: RunStore,
    path: "str | os.PathLike[str]",
    run_ids: Optional[Sequence[int]] = None,
    fmt: str = "long",
) -> int:
    """Write runs (None: all) to ``path`` as ``long`` or ``wide`` CSV; return the data rows written."""
    if fmt not in EXPORT_FORMATS:
        raise ValueError(f"unknown export format {fmt!r}; use 'long' or 'wide'")
    frame = long_frame(store, run_ids) if fmt == "long" else wide_frame(store, run_ids)
    try:
        frame.to_csv(path, index=False)
    except OSError as e:
        raise StorageError(f"cannot write {path} ({e.strerror or e}); choose another output path") from e
    return len(frame)
