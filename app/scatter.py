"""The Runs page's scatter: any final metric (y) against any run or config field (x) over
the runs the filters show, one point per run coloured by method, its hover naming the run
(``engine.analysis.scatter``: the points and the figure). Its choices are kept in the URL
as the page's filters are (``SCATTER_PARAMS``: ``app.state.seed_from_url`` and
``keep_in_url``); a value a link holds that is not among the choices is named in one line."""

from __future__ import annotations

from typing import Sequence

import pandas as pd
import streamlit as st

from app import metric_charts, state, viewstate
from app.display import plain, plot
from engine.analysis import scatter
from engine.training.system import axis_title, chart_title, is_system
from storage import RunStore

Y, X, LOG_X = "runs.scatter.y", "runs.scatter.x", "runs.scatter.log_x"
SCATTER_PARAMS = (viewstate.Param("scatter_y", Y), viewstate.Param("scatter_x", X),
                  viewstate.Param("scatter_logx", LOG_X))
DEFAULTS = {Y: "val_loss", X: "rank", LOG_X: False}  # left out of the URL; R: what a launch sweeps
NAMED_AT_MOST = 6  # the most run ids a note names


def _seed(y_choices: Sequence[str], x_choices: Sequence[str]) -> list[str]:
    """Set the controls not drawn yet in this session from the URL (``state.seed_from_url``),
    a missing or unusable value to its default (the metric first recorded when the default is
    not); the problems of the link's values."""
    unset = [p for p in SCATTER_PARAMS if p.key not in st.session_state]
    problems = state.seed_from_url(unset, {})
    for p in unset:
        given, choices = st.session_state[p.key], {Y: y_choices, X: x_choices, LOG_X: ("0", "1")}[p.key]
        if given and given not in choices:
            problems.append(p.unknown.format(name=p.name, value=viewstate.shown(given), choices=viewstate.listed(choices)))
        if p.key == LOG_X:
            st.session_state[p.key] = given == "1"
        elif not given or given not in choices:
            st.session_state[p.key] = DEFAULTS[p.key]
    if st.session_state[Y] not in y_choices:  # a metric none of the runs shown has recorded
        st.session_state[Y] = DEFAULTS[Y] if DEFAULTS[Y] in y_choices else y_choices[0]
    if st.session_state[X] not in x_choices:
        st.session_state[X] = DEFAULTS[X]
    return problems


def _controls(y_choices: Sequence[str], x_choices: Sequence[str], numeric: Sequence[str]) -> tuple[str, str, bool]:
    """The metric, field and log x pickers, in one row (stacked when narrow), kept in the URL;
    log x is off (and disabled) for a field that is not a number."""
    for problem in _seed(y_choices, x_choices):
        st.warning(plain(f"The link's {problem}; shown without it."), icon=":material/link_off:")
    c1, c2, c3 = st.columns([2, 2, 1], vertical_alignment="bottom")
    y = c1.selectbox("Final metric (y)", y_choices, key=Y,
                     help="Each run's last recorded value of this metric (its value at its highest step), as the "
                          "table's loss columns and the filter read it.")
    x = c2.selectbox("Field (x)", x_choices, key=X,
                     help="Any run or config field, those that differ among the runs shown first. Numbers are a "
                          "numeric axis, other values categories. A field the run left to its preset (batch_size, "
                          "seq_len, eval_interval…) is the value it trained with.")
    log_x = c3.toggle("log x", key=LOG_X, disabled=x not in numeric,
                      help="A logarithmic x axis (a numeric field only: lr, λ, batch size…).") and x in numeric
    state.keep_in_url({p.name: None if st.session_state[p.key] == DEFAULTS[p.key] else
                       ("1" if p.key == LOG_X else st.session_state[p.key]) for p in SCATTER_PARAMS})
    return y, x, log_x


def _ids(ids: Sequence[int]) -> str:
    more = len(ids) - NAMED_AT_MOST
    return ", ".join(f"#{i}" for i in ids[:NAMED_AT_MOST]) + (f" and {more} more" if more > 0 else "")


def _notes(data: scatter.Scatter, y: str, x: str, log_x: bool, varying: Sequence[str]) -> list[str]:
    """What the chart leaves out, and a hint when every run shown has one value of ``x``."""
    notes = []
    if data.no_x:
        notes.append(f"Not drawn, with no {x}: {_ids(data.no_x)}" + (" (exact backprop has none)" if x in ("rank", "lam")
                                                                     else "") + ".")
    if data.no_y:
        notes.append(f"Not drawn, with no {y} yet: {_ids(data.no_y)}.")
    if log_x and data.numeric and (data.points["x"] <= 0).any():
        notes.append(f"On the log axis the runs with {x} ≤ 0 are not drawn: "
                     f"{_ids(list(data.points.loc[data.points['x'] <= 0, 'run_id']))}.")
    others = [f for f in varying if f != x]
    if len(data.points) > 1 and data.points["x"].nunique() == 1 and others:
        value = data.points["x"].iloc[0]
        notes.append(f"Every run drawn has {x} = {f'{value:g}' if data.numeric else value}; fields that differ among "
                     f"the runs shown: {', '.join(others[:NAMED_AT_MOST])}.")
    return notes


def section(store: RunStore, ids: Sequence[int]) -> None:
    """The scatter of the runs ``ids`` (those the filters show), under its pickers; a one-line
    caption instead of a chart when fewer than two runs (or two points) are there to draw."""
    st.subheader("Scatter: a final metric against a field")
    if len(ids) < 2:
        st.caption(f"The scatter needs two runs or more; the filters show {len(ids) or 'none'}.")
        return
    wanted = set(ids)
    records = [r for r in store.runs.list_runs() if r.id in wanted]
    y_choices = metric_charts.metric_choices(pd.DataFrame({"name": store.metrics.metric_names(list(wanted))}))
    if not y_choices:
        st.caption("None of the runs shown has recorded a metric yet: the scatter appears after their first eval.")
        return
    x_choices, varying, numeric = scatter.axes(records)
    y, x, log_x = _controls(y_choices, x_choices, numeric)
    data = scatter.points(records, store.metrics.final_metrics(list(wanted), names=[y]), x, y)
    if len(data.points) < 2:
        st.caption(plain(f"Fewer than two of the {len(records)} runs shown have both a {x} and a final {y}: nothing to draw."))
    else:
        y_title = f"final {chart_title(y)} ({axis_title(y)})" if is_system(y) else f"final {y}"
        plot(scatter.figure(data, x=x, y=y, y_title=y_title, log_x=log_x, title=f"Final {y} against {x}"),
             "runs.scatter")
    for note in _notes(data, y, x, log_x, varying):
        st.caption(plain(note))
