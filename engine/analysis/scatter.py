"""A final metric against a run or config field, one point per run (the Runs page's scatter,
W&B's "scatter plot" panel: the learning-rate sensitivity of a method is one).

The fields are the filter's (``engine.analysis.where.runs_table``): a run field or any
``RunConfig`` field; the final value of a metric is the filter's too (its value at the
run's highest step, ``store.metrics.final_metrics()``). A config field the run leaves to its preset
or to a default (``batch_size``, ``seq_len``, ``eval_interval``, …: None in the stored
config) is the value the run trained with (``RunConfig.effective_*``). A field whose values
are all numbers is a numeric axis (``log_x`` possible); any other (``estimator``, ``sweep``,
``dtype``, a flag) is a categorical one. Points are coloured by method with the one colour
rule of run charts (``frames.describe_runs``: ``charts.method_colors``). No Streamlit here.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, NamedTuple, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from engine.analysis import charts, frames
from engine.analysis.where import RUN_FIELDS, config_fields, runs_table
from engine.config import RunConfig
from engine.core.text import PLOTLY, plain

# run fields that name, describe or time a run rather than set it: not offered as an axis
NOT_AXES = frozenset({"uid", "name", "error", "notes", "tags", "created_at", "started_at", "finished_at",
                      "heartbeat_at", "worker_id", "owner"})
EFFECTIVE = {  # a config field left unset (None) → the RunConfig property with the value the run used
    "batch_size": "effective_batch_size", "seq_len": "effective_seq_len", "eval_interval": "effective_eval_interval",
    "val_batches": "effective_val_batches", "interim_val_batches": "effective_interim_val_batches",
    "test_tokens": "effective_test_tokens",
}
POINT_COLUMNS = ["run_id", "name", "method", "color", "order", "x", "y"]


class Scatter(NamedTuple):
    """The points of a scatter: ``points`` (``POINT_COLUMNS``, one row per run with both
    values, by method order then run id); ``numeric``: whether the x field is a numeric axis;
    ``no_x``/``no_y``: the ids of the runs left out for want of the field's or the metric's value."""

    points: pd.DataFrame
    numeric: bool
    no_x: list[int]
    no_y: list[int]


def _missing(value: Any) -> bool:
    return value is None or value is pd.NA or value is pd.NaT or (isinstance(value, float) and math.isnan(value))


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


def _effective(config: dict, field: str) -> Any:
    """The value ``field`` had in a run whose stored config leaves it None: its ``EFFECTIVE``
    property of the config (None when the stored config no longer reads as a ``RunConfig``)."""
    try:
        return getattr(RunConfig.from_dict(config), EFFECTIVE[field])
    except (ValueError, TypeError, KeyError):
        return None


def field_values(table: pd.DataFrame, records: Sequence, field: str) -> pd.Series:
    """Each run's value of ``field`` (indexed like ``table``, ``runs_table(records, …)``): the
    table's cell, or for a field of ``EFFECTIVE`` left unset, the value the run used."""
    values = table[field].astype(object) if field in table else pd.Series([None] * len(table), dtype=object)
    if field in EFFECTIVE:
        configs = {r.id: r.config for r in records}
        values = pd.Series([_effective(configs[int(i)], field) if _missing(v) else v
                            for i, v in zip(table["id"], values)], index=table.index, dtype=object)
    return values


def _numeric(values: pd.Series) -> bool:
    present = [v for v in values if not _missing(v)]
    return bool(present) and all(_is_number(v) for v in present)


def axes(records: Sequence) -> tuple[list[str], list[str], list[str]]:
    """(the fields a scatter's x axis offers: the run fields that set a run, not ``NOT_AXES``,
    then every config field, those whose values differ among ``records`` first, the run id
    last; the fields that differ, the id aside; the fields whose values are all numbers, a
    numeric axis)."""
    records = sorted(records, key=lambda r: r.id)
    table = runs_table(records)
    fields = [*dict.fromkeys(f for f in (*RUN_FIELDS, *config_fields()) if f not in NOT_AXES | {"id"}), "id"]
    values = {f: field_values(table, records, f) for f in fields}
    varying = [f for f in fields[:-1] if values[f].map(str).nunique() > 1]
    numeric = [f for f in fields if _numeric(values[f])]
    return [*varying, *[f for f in fields if f not in varying]], varying, numeric


def points(records: Sequence, finals: pd.DataFrame, x: str, y: str) -> Scatter:
    """The runs of ``records`` as points: x their value of field ``x``, y their final value of
    metric ``y`` (``finals``: ``store.metrics.final_metrics()``'s long frame), coloured by method."""
    records = sorted(records, key=lambda r: r.id)
    table = runs_table(records)
    xs = field_values(table, records, x)
    numeric = _numeric(xs)
    info = frames.describe_runs(records).set_index("run_id")
    ids = table["id"].astype(int)
    final = finals.loc[finals["name"] == y].drop_duplicates("run_id", keep="last").set_index("run_id")["value"]
    ys = ids.map(final).astype(float)
    no_x = [int(i) for i, v in zip(ids, xs) if _missing(v)]
    no_y = [int(i) for i, v in zip(ids, ys) if math.isnan(v)]
    keys = {rid: charts.method_key(e, r, lam) for rid, e, r, lam in
            zip(info.index, info["estimator"], info["rank"], info["lam"])}
    order = {k: i for i, k in enumerate(sorted(set(keys.values()), key=lambda k: (k[0] != "exact", k)))}
    frame = pd.DataFrame({
        "run_id": ids, "name": ids.map(info["name"]), "method": ids.map(info["method"]),
        "color": ids.map(info["color"]), "order": ids.map(lambda i: order[keys[i]]),
        "x": [float(v) if numeric and not _missing(v) else (None if _missing(v) else str(v)) for v in xs], "y": ys,
    })
    keep = ~ids.isin(no_x + no_y)
    shown = frame[keep].sort_values(["order", "run_id"], kind="stable").reset_index(drop=True)
    return Scatter(shown[POINT_COLUMNS], numeric, no_x, no_y)


def _hover(row, x: str, y: str, numeric: bool) -> str:
    x_text = f"{row.x:,.6g}" if numeric else str(row.x)
    return (f"<b>#{row.run_id} {plain(row.name, PLOTLY)}</b><br>{plain(row.method, PLOTLY)}<br>"
            f"{plain(x, PLOTLY)} = {plain(x_text, PLOTLY)}<br>{plain(y, PLOTLY)} = {row.y:,.6g}")


def figure(scatter: Scatter, *, x: str, y: str, y_title: str | None = None, log_x: bool = False,
           title: str | None = None, height: int = 420) -> go.Figure:
    """The scatter: one trace of markers per method (in its colour, named by it in the legend),
    each point's hover naming its run, the method and both values; ``customdata`` the run ids.
    A numeric x axis is logarithmic with ``log_x``; a categorical one lists its values sorted."""
    fig = go.Figure()
    for (_, method, color), rows in scatter.points.groupby(["order", "method", "color"], sort=True):
        fig.add_trace(go.Scatter(
            x=rows["x"], y=rows["y"], mode="markers", name=plain(method, PLOTLY), customdata=rows["run_id"],
            marker=dict(color=color, size=10, line=dict(width=1, color="white")),
            text=[_hover(r, x, y, scatter.numeric) for r in rows.itertuples()], hovertemplate="%{text}<extra></extra>"))
    if scatter.numeric:
        fig.update_xaxes(type="log" if log_x else "linear")
    else:
        fig.update_xaxes(type="category", categoryorder="array", categoryarray=sorted(set(scatter.points["x"])))
    fig.update_xaxes(title_text=plain(x, PLOTLY))
    fig.update_yaxes(title_text=plain(y_title or f"final {y}", PLOTLY))
    return charts._layout(fig, plain(title, PLOTLY) if title else None, height)
