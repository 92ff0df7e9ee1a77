"""Charts of any recorded metric: Compare's "Any metric" section (every metric the
selected runs recorded, drawn with the loss charts' pooling, smoothing, x axis, log
scale and colour/facet choices) and Run detail's system metrics
(``engine.training.system``). The figures are built by ``engine.analysis.frames`` and
``engine.analysis.charts``, the loss charts' own code."""

from __future__ import annotations

from typing import Sequence

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from app.display import plot
from engine.analysis import charts, frames
from engine.training.system import SYSTEM_METRICS, axis_title, chart_title, is_system

SYSTEM_HEIGHT = 260  # a small chart: Run detail shows several in a row


def metric_choices(metrics: pd.DataFrame, chosen: Sequence[str] = ()) -> list[str]:
    """Every metric name in ``metrics`` (and each of ``chosen``, which a link may name
    before any run has recorded it): the run's own measures first, then per-layer ones
    (``cos/<layer>``…), then the system metrics in ``SYSTEM_METRICS`` order, each part sorted."""
    names = set(metrics["name"].unique()) | set(chosen)
    system = list(SYSTEM_METRICS)

    def order(name: str):
        if is_system(name):
            return (2, system.index(name) if name in system else len(system), name)
        return (1 if "/" in name else 0, 0, name)

    return sorted(names, key=order)


def metric_figure(metrics: pd.DataFrame, info: pd.DataFrame, name: str, *, x: str = "step", smoothing: float = 0.0,
                  pool: bool = True, log_y: bool = False, group_by: str | None = None, facet: bool = False,
                  height: int = 380) -> go.Figure:
    """The curves of metric ``name`` for the runs of ``info`` (``frames.describe_runs``): as
    the loss charts draw theirs, one line per run or, with ``pool``, the mean over the seeds
    of a setup with a ± std band; coloured by ``group_by`` or, with ``facet``, one panel
    per value of it."""
    y_title = axis_title(name)
    if facet and group_by:
        panels = {label: frames.series(metrics, part, name, x=x, smoothing=smoothing, pool_seeds=pool)
                  for label, part in frames.facets(info, group_by).items()}
        return charts.panels_figure(panels, x=x, y_title=y_title, title=f"{chart_title(name)}, by {group_by}",
                                    log_y=log_y, shared_y=True)
    s = frames.series(metrics, frames.grouped(info, group_by), name, x=x, smoothing=smoothing, pool_seeds=pool)
    return charts.line_figure(s, x=x, y_title=y_title, title=chart_title(name), log_y=log_y, height=height)


def any_metric_section(metrics: pd.DataFrame, info: pd.DataFrame, *, key: str, persist: str, x: str,
                       smoothing: float, pool: bool, log_y: bool, group_by: str | None, facet: bool,
                       names: Sequence[str] | None = None) -> None:
    """Compare's section: a picker of every metric the selected runs recorded (``names``;
    None: those in ``metrics``, which then must hold every name) (widget ``key``, kept for
    the ``persist`` scope) and a chart of each chosen, two to a row."""
    st.subheader("Any metric")
    chosen = st.session_state.get(key) or []
    if not isinstance(chosen, list):  # a view applied from a link holds a tuple
        chosen = st.session_state[key] = list(chosen)
    offered = metrics if names is None else pd.DataFrame({"name": list(names)})
    picked = st.multiselect(
        "Chart metrics", metric_choices(offered, chosen), key=key, persist_state=persist,
        placeholder="Choose metrics: tokens/s, rel_err_*, per-layer cosine, memory, system (sys/*)…",
        help="Any metric the selected runs recorded, with the pooling, smoothing, x axis, log y and colouring "
             "chosen above. sys/* are the system metrics: process CPU and memory, host load, device memory, "
             "GPU utilisation and power, sampled with every record.")
    for i in range(0, len(picked), 2):
        for column, name in zip(st.columns(2), picked[i:i + 2]):
            with column:
                plot(metric_figure(metrics, info, name, x=x, smoothing=smoothing, pool=pool, log_y=log_y,
                                   group_by=group_by, facet=facet), f"metric.{name}")


def system_section(metrics: pd.DataFrame, info: pd.DataFrame) -> None:
    """Run detail's section: one small chart per system metric the run recorded, three to
    a row (they stack on a narrow screen); a note when it has none yet."""
    names = [n for n in SYSTEM_METRICS if (metrics["name"] == n).any()]
    st.subheader("System")
    if not names:
        st.caption("No system metrics yet: they are sampled with each record (step 0, every probe interval "
                   "and every eval).")
        return
    for i in range(0, len(names), 3):
        for column, name in zip(st.columns(3), names[i:i + 3]):
            with column:
                fig = metric_figure(metrics, info, name, pool=False, height=SYSTEM_HEIGHT)
                plot(fig.update_layout(showlegend=False), f"d.{name}")
    st.caption("CPU is the training process's CPU time over wall time (100 % = one core) and RSS its resident "
               "memory: both count every run the worker trains at once. Load is the host's one-minute load average; "
               "above its core count, runs wait for a CPU. Device memory is JAX's; GPU utilisation and power NVML's.")
