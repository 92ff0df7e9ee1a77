"""Charts of any recorded metric: Compare's "Any metric" section (every metric the
selected runs recorded, drawn with the loss charts' pooling, smoothing, x axis, log
scale and colour/facet choices) and Run detail's system metrics
(``engine.training.system``). The figures are built by ``engine.analysis.frames`` and
``engine.analysis.charts``, the loss charts' own code.

The curve controls, x axis (step or wall time), EMA smoothing and log y, are drawn by
``curve_controls`` and kept in a page's URL as Compare keeps them (``x``, ``smooth``, ``log``:
``app.viewstate``'s reading and writing): ``seed_curve_controls`` sets them from a link,
``curve_params`` is what ``app.state.keep_in_url`` holds."""

from __future__ import annotations

from typing import Mapping, Sequence

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from app import state, viewstate
from app.display import plot
from engine.analysis import charts, frames
from engine.training.system import SYSTEM_METRICS, axis_title, chart_title, is_system

SYSTEM_HEIGHT = 260  # a small chart: Run detail shows several in a row
X_LABELS = {"step": "step", "wall_time": "wall time"}
SMOOTHING_HELP = "Weight w of the debiased exponential moving average: m = w·m + (1 − w)·value."
CURVE_PARAMS = {"x": "x", "smoothing": "smooth", "log_y": "log"}  # control → its URL parameter (Compare's)
CONTROL_WIDTHS = (1.2, 1.8, 0.8)  # x axis, smoothing, log y: Compare's row
SYSTEM_NOTE = ("CPU is the training process's CPU time over wall time (100 % = one core) and RSS its resident "
               "memory: both count every run the worker trains at once. Load is the host's one-minute load average; "
               "above its core count, runs wait for a CPU. Device memory is JAX's; GPU utilisation and power NVML's.")
# what the system metrics (sys/*) measure: of the process and the host, not of one run; under every chart of them


def curve_controls(keys: Mapping[str, str], persist: state.Persist = None, columns: Sequence | None = None,
                   ) -> tuple[str, float, bool]:
    """The x axis (step or wall time), EMA smoothing and log y controls, in ``columns`` (three
    containers; None: a row of their own), their widgets' keys ``keys["x"]``,
    ``keys["smoothing"]`` and ``keys["log_y"]``; (x, smoothing, log_y) as chosen."""
    c1, c2, c3 = columns if columns is not None else st.columns(list(CONTROL_WIDTHS))
    x = c1.radio("x axis", viewstate.X_AXES, horizontal=True, persist_state=persist, key=keys["x"],
                 format_func=lambda v: X_LABELS[v])
    smoothing = c2.slider("EMA smoothing", 0.0, viewstate.MAX_SMOOTHING, step=0.01, persist_state=persist,
                          key=keys["smoothing"], help=SMOOTHING_HELP)
    log_y = c3.toggle("log y", persist_state=persist, key=keys["log_y"])
    return x, float(smoothing), bool(log_y)


def seed_curve_controls(keys: Mapping[str, str]) -> list[str]:
    """Set each curve control not drawn yet in this session from the URL's ``x``, ``smooth``
    and ``log`` (read as Compare reads them, ``viewstate.decode``), else to its default;
    the one-line problems of the values the link held that could not be used."""
    missing = [name for name in CURVE_PARAMS if keys[name] not in st.session_state]
    if not missing:
        return []
    query = state.url_query()
    linked = viewstate.decode({CURVE_PARAMS[n]: query[CURVE_PARAMS[n]] for n in missing if query.get(CURVE_PARAMS[n])})
    for name in missing:
        st.session_state[keys[name]] = getattr(linked, name)
    return list(linked.problems)


def curve_params(x: str, smoothing: float, log_y: bool) -> dict[str, str | None]:
    """The URL parameters of the curve controls (None: the default, left out), as Compare writes them."""
    written = viewstate.encode(viewstate.ViewState(x=x, smoothing=round(smoothing, 2), log_y=log_y))
    return {param: written.get(param) for param in CURVE_PARAMS.values()}


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


def any_metric_section(metrics: pd.DataFrame, info: pd.DataFrame, *, key: str, persist: state.Persist, x: str,
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
    if any(is_system(name) for name in picked):
        st.caption(SYSTEM_NOTE)


def system_section(metrics: pd.DataFrame, info: pd.DataFrame, *, x: str = "step", smoothing: float = 0.0,
                   log_y: bool = False) -> None:
    """Run detail's section: one small chart per system metric the run recorded, three to
    a row (they stack on a narrow screen), on the page's x axis, smoothing and y scale; a
    note when it has none yet."""
    names = [n for n in SYSTEM_METRICS if (metrics["name"] == n).any()]
    st.subheader("System")
    if not names:
        st.caption("No system metrics yet: they are sampled with each record (step 0, every probe interval "
                   "and every eval).")
        return
    for i in range(0, len(names), 3):
        for column, name in zip(st.columns(3), names[i:i + 3]):
            with column:
                fig = metric_figure(metrics, info, name, x=x, smoothing=smoothing, pool=False, log_y=log_y,
                                    height=SYSTEM_HEIGHT)
                plot(fig.update_layout(showlegend=False), f"d.{name}")
    st.caption(SYSTEM_NOTE)
