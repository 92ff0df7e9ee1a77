"""The sensitivity figure of a tuning campaign: each method's final validation loss against a
tuned value (``sensitivity_figure``), the dashboard's Compare page and the report draw the same.

A pure function of ``engine.analysis.tuning``'s frames (``trial_frame``'s trials, ``choose``'s
choices): one curve per method through the mean over its tuning seeds at each trial's value
(sorted by value, log x axis), every trial run a point (its hover names the run, seed, value and
loss), each method's chosen value a star, and a diverged trial an ``x`` at the top edge of the
plot (its loss is +inf), said in the legend. Colours: exact backprop in ``charts.EXACT_COLOR``,
the sketched methods in ``charts.METHOD_PALETTE`` in the choices' order.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from engine.analysis.charts import EXACT_COLOR, METHOD_PALETTE, _layout, _no_data
from engine.core.text import PLOTLY, plain

Y_TITLE = "final validation loss (nats/token)"
CHOSEN = "chosen value (★)"
DIVERGED = "diverged (× at the top edge)"
HEIGHT = 440


def method_order(trials: pd.DataFrame, choices: pd.DataFrame | None) -> list[str]:
    """The methods in the choices' (the grid's) order, then any other the trials hold."""
    listed = list(choices["method"]) if choices is not None and len(choices) else []
    return list(dict.fromkeys([*listed, *trials["method"]]))


def colors_of(methods: list[str]) -> dict[str, str]:
    """Method label → colour: exact in ``EXACT_COLOR``, the others the palette in turn."""
    sketched = [m for m in methods if m != "exact"]
    return {m: EXACT_COLOR if m == "exact" else METHOD_PALETTE[sketched.index(m) % len(METHOD_PALETTE)]
            for m in methods}


def _finite(values: pd.Series) -> np.ndarray:
    v = pd.to_numeric(values, errors="coerce").to_numpy(dtype=float)
    return v[np.isfinite(v)]


def _top_edge(trials: pd.DataFrame) -> tuple[float, float, float]:
    """(the y range's low, high, and where a diverged point sits: at the top edge)."""
    finite = _finite(trials["val_loss"])
    if not len(finite):
        return 0.0, 1.0, 0.95
    lo, hi = float(finite.min()), float(finite.max())
    pad = max((hi - lo) * 0.08, abs(hi) * 0.01, 1e-3)
    top = hi + 2 * pad
    return lo - pad, top + pad * 0.6, top


def _means(mine: pd.DataFrame, field: str) -> pd.DataFrame:
    """Per trial: its value of ``field`` and the mean loss over its seeds that finished (+inf
    when one diverged; NaN while none has a loss), sorted by value."""
    rows = []
    for _, t in mine.groupby("trial"):
        losses = pd.to_numeric(t["val_loss"], errors="coerce")
        mean = math.inf if bool(t["diverged"].any()) else (float(losses.mean()) if losses.notna().any() else math.nan)
        rows.append({"value": float(t[field].iloc[0]), "mean": mean, "seeds": int(losses.notna().sum())})
    return pd.DataFrame(rows, columns=["value", "mean", "seeds"]).sort_values("value", kind="stable")


def _points(fig: go.Figure, method: str, mine: pd.DataFrame, field: str, color: str) -> None:
    """Every trial run of ``method`` with a finite loss: a point (the legend is its curve's)."""
    done = mine[np.isfinite(pd.to_numeric(mine["val_loss"], errors="coerce").to_numpy(dtype=float))]
    if done.empty:
        return
    name = plain(method, PLOTLY)
    fig.add_trace(go.Scatter(
        x=done[field].astype(float), y=done["val_loss"].astype(float), mode="markers", name=f"{name} trials",
        legendgroup=name, showlegend=False, marker=dict(size=8, color=color, opacity=0.55, line=dict(width=0)),
        customdata=done[["run_id", "seed"]].astype(int).to_numpy(),
        hovertemplate=f"<b>{name}</b><br>run #%{{customdata[0]}} · seed %{{customdata[1]}}<br>{field} %{{x:.4g}}"
                      "<br>val loss %{y:.4f}<extra></extra>",
    ))


def _curve(fig: go.Figure, method: str, mine: pd.DataFrame, field: str, color: str) -> None:
    """The method's line through its trials' mean losses (finite ones), in value order."""
    means = _means(mine, field)
    shown = means[np.isfinite(means["mean"].to_numpy(dtype=float))]
    name = plain(method, PLOTLY)
    fig.add_trace(go.Scatter(
        x=shown["value"], y=shown["mean"], mode="lines+markers", name=name, legendgroup=name,
        line=dict(color=color, width=2), marker=dict(size=5, color=color), customdata=shown[["seeds"]].to_numpy(),
        hovertemplate=f"<b>{name}</b><br>{field} %{{x:.4g}}<br>mean val loss %{{y:.4f}} over %{{customdata[0]}} "
                      "seed(s)<extra></extra>",
    ))


def _diverged(fig: go.Figure, trials: pd.DataFrame, field: str, colors: dict[str, str], top: float) -> None:
    """Every diverged trial run as an ``x`` at the top edge, one legend entry for all."""
    lost = trials[trials["diverged"].astype(bool)]
    if lost.empty:
        return
    order = list(colors)  # the legend shows the first point's colour: the first method's (exact's grey)
    lost = lost.sort_values("method", key=lambda m: m.map(order.index), kind="stable")
    fig.add_trace(go.Scatter(
        x=lost[field].astype(float), y=[top] * len(lost), mode="markers", name=DIVERGED,
        marker=dict(symbol="x", size=11, color=[colors.get(m, EXACT_COLOR) for m in lost["method"]],
                    line=dict(width=1)),
        customdata=np.column_stack([lost["run_id"].astype(int), lost["seed"].astype(int)]),
        text=[plain(m, PLOTLY) for m in lost["method"]],
        hovertemplate=f"<b>%{{text}}</b> diverged<br>run #%{{customdata[0]}} · seed %{{customdata[1]}}<br>{field} "
                      "%{x:.4g}<extra></extra>",
    ))


def _chosen(fig: go.Figure, choices: pd.DataFrame, field: str, colors: dict[str, str]) -> None:
    """Each method's chosen value as a star at its mean tuning loss, one legend entry for all."""
    rows = [(r.method, float(r.chosen[field]), float(r.val_loss)) for r in choices.itertuples()
            if isinstance(r.chosen, dict) and field in r.chosen and pd.notna(r.val_loss) and math.isfinite(r.val_loss)]
    if not rows:
        return
    methods, xs, ys = zip(*rows)
    fig.add_trace(go.Scatter(
        x=list(xs), y=list(ys), mode="markers", name=CHOSEN, text=[plain(m, PLOTLY) for m in methods],
        marker=dict(symbol="star", size=17, color=[colors.get(m, EXACT_COLOR) for m in methods],
                    line=dict(width=1.2, color="#202020")),
        hovertemplate=f"<b>%{{text}}</b> chosen<br>{field} %{{x:.4g}}<br>mean val loss %{{y:.4f}}<extra></extra>",
    ))


def sensitivity_figure(trials: pd.DataFrame, choices: pd.DataFrame | None, field: str, *,
                       base: float | None = None, title: str | None = None, height: int = HEIGHT) -> go.Figure:
    """Final validation loss against the tuned ``field`` (module docstring): ``trials`` as
    ``tuning.trial_frame`` gives them, ``choices`` as ``tuning.choose`` (None: no stars); ``base``,
    the untuned value, a dotted vertical line. Trials without a loss yet are left out."""
    fig = go.Figure()
    title = title if title is not None else f"Validation loss against {field}, each method's trials"
    if trials.empty or field not in trials or (not len(_finite(trials["val_loss"])) and not trials["diverged"].any()):
        _no_data(fig, "no trial has ended yet")
        fig.update_xaxes(title_text=f"{field} (log scale)", type="log")
        fig.update_yaxes(title_text=Y_TITLE)
        return _layout(fig, title, height)
    methods = method_order(trials, choices)
    colors = colors_of(methods)
    low, high, top = _top_edge(trials)
    for method in methods:
        mine = trials[trials["method"] == method]
        if len(mine):
            _curve(fig, method, mine, field, colors[method])
            _points(fig, method, mine, field, colors[method])
    if choices is not None and len(choices):
        _chosen(fig, choices, field, colors)
    _diverged(fig, trials, field, colors, top)
    if base is not None and base > 0:  # an annotation on a log axis is placed by log10 of its value
        fig.add_vline(x=base, line=dict(color="#888", width=1, dash="dot"))
        fig.add_annotation(x=math.log10(base), xref="x", y=1, yref="paper", yanchor="bottom", xanchor="left",
                           text=f"untuned {field}={base:g}", showarrow=False, font=dict(size=11, color="#666"))
    fig.update_xaxes(title_text=f"{field} (log scale)", type="log")
    fig.update_yaxes(title_text=Y_TITLE, range=[low, high])
    return _layout(fig, title, height)
