"""Chart builders: pure functions from the frames of :mod:`engine.analysis.frames` to Plotly figures (the dashboard and the reports draw the same ones).

Colours belong to the method within what is shown: :func:`method_colors` gives each
method (estimator, rank, λ) of a selection its own colour from a categorical palette
(exact backprop a neutral dark grey), the same on every chart of a page or report:
the loss and cosine curves, the memory bars and the points of the rank figure. Frames
carry that colour in their ``color`` column. Exact-baseline bars in memory charts are
light grey. Every axis has a title with its unit. (:func:`method_color`, a hue family
per estimator shaded by R, is the Diagnosis page's colour of an estimator.)
"""

from __future__ import annotations

import colorsys
import hashlib
import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from engine.core.estimators import is_exact
from engine.core.text import PLOTLY, plain

EXACT_COLOR = "#404040"  # exact backprop: the neutral reference
ESTIMATOR_HUES = {  # degrees on the colour wheel, one family per estimator
    "basis": 212, "countsketch": 28, "balanced": 125, "scalars": 270,
    "gaussian": 352, "crs": 178, "wta-crs": 45, "proj": 318,
}
BASELINE_COLOR = "#b0b0b0"
CATEGORY_COLORS = {
    "sketched_inputs": "#1f77b4",
    "nonlinearity": "#ff7f0e",
    "attention": "#2ca02c",
    "loss_logits": "#d62728",
    "other": "#7f7f7f",
}
RANK_DODGE = 0.06  # octaves between neighbouring lines of the rank figure
MARKERS_UP_TO = 60  # curves with at most this many points also draw their points
SETUP_SYMBOLS = ("circle", "square", "diamond", "triangle-up", "x", "star", "cross", "triangle-down")
SETUP_DASHES = ("dot", "dash", "dashdot", "longdash", "longdashdot")  # the rank figure's exact line, per setup
SEED_SHADES = (0.0, 0.13, -0.11, 0.24, -0.2, 0.32)  # lightness shifts of the 1st, 2nd, … seed of a method
X_TITLES = {"step": "step", "wall_time": "wall time (s)"}


def _hue(estimator: str) -> float:
    if estimator in ESTIMATOR_HUES:
        return ESTIMATOR_HUES[estimator]
    return int.from_bytes(hashlib.sha256(estimator.encode()).digest()[:4], "big") % 360  # stable across processes


def method_color(estimator: str | None, rank=None, lam=None) -> str:
    """The colour of a method, ``#rrggbb``, from the method alone (not the run, the
    selection or the sweep), so a method looks the same everywhere.

    * exact (or no rank): ``EXACT_COLOR``, a neutral dark grey;
    * a sketched estimator: its hue family (``ESTIMATOR_HUES``; an unknown name gets a
      stable hash of itself), shaded by k = log2(R): lightness L = 0.70 − 0.045·k
      (clipped to [0.25, 0.70]), the hue turning 3° per doubling, so R = 1 is light
      and large R dark;
    * λ > 0: the same shade step, desaturated (S = 0.42 instead of 0.80) and the hue
      turned 14°, so a shrunk method is told from its λ = 0 twin (line charts also
      dash it, :func:`method_dash`).
    """
    if is_exact(estimator) or rank is None or pd.isna(rank):
        return EXACT_COLOR
    k = math.log2(max(float(rank), 1.0))
    shrunk = lam is not None and not pd.isna(lam) and float(lam) > 0
    hue = (_hue(str(estimator)) + 3.0 * k + (14.0 if shrunk else 0.0)) % 360
    lightness = min(max(0.70 - 0.045 * k, 0.25), 0.70)
    saturation = 0.42 if shrunk else 0.80
    r, g, b = colorsys.hls_to_rgb(hue / 360.0, lightness, saturation)
    return "#{:02x}{:02x}{:02x}".format(*(round(255 * c) for c in (r, g, b)))


METHOD_PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf",
                  "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94", "#f7b6d2", "#dbdb8d", "#9edae5")
# D3's category20 without its greys (grey is exact backprop's): strong colours first, then their light twins


def method_key(estimator, rank=None, lam=None) -> tuple:
    """(estimator, R, λ) as one hashable, comparable key: ``("exact", -1, 0.0)`` for exact
    backprop (or a run without a rank), λ None as 0."""
    if is_exact(estimator) or rank is None or pd.isna(rank):
        return ("exact", -1, 0.0)
    return (str(estimator), int(rank), 0.0 if lam is None or pd.isna(lam) else float(lam))


def method_colors(methods) -> dict[tuple, str]:
    """The one colour rule of run charts: each distinct method of ``methods`` ((estimator,
    rank, λ) triples) → ``#rrggbb``, keyed by :func:`method_key`. Exact backprop is
    ``EXACT_COLOR``; the sketched methods, sorted by estimator, R and λ, take
    ``METHOD_PALETTE`` in turn (cycling past its 18), so the ranks of one estimator are
    told apart at a glance on every chart, not as shades of one hue."""
    keys = sorted({method_key(*m) for m in methods} - {method_key(None)})
    colors = {k: METHOD_PALETTE[i % len(METHOD_PALETTE)] for i, k in enumerate(keys)}
    return {method_key(None): EXACT_COLOR, **colors}


GROUP_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
                "#17becf")  # D3's categorical palette: curves coloured by a chosen field or tag


def group_color(index: int) -> str:
    """The colour of the ``index``-th value when curves are coloured by a field or tag."""
    return GROUP_COLORS[int(index) % len(GROUP_COLORS)]


def setup_symbol(index: int) -> str:
    """The marker of the ``index``-th setup (config that differs in a trajectory or
    measurement field) of a selection: circle, square, diamond, …"""
    return SETUP_SYMBOLS[int(index) % len(SETUP_SYMBOLS)]


def seed_shade(color: str, index: int) -> str:
    """The ``index``-th seed's shade of a method colour (``#rrggbb``): the colour itself for
    the first seed, then lighter and darker in turn (``SEED_SHADES``, lightness clipped to
    [0.12, 0.88]), so unpooled seeds read as one method and still apart."""
    h = color.lstrip("#")
    r, g, b = (int(h[i:i + 2], 16) / 255 for i in (0, 2, 4))
    hue, lightness, saturation = colorsys.rgb_to_hls(r, g, b)
    step = SEED_SHADES[int(index) % len(SEED_SHADES)]
    lightness = min(max(lightness + step, 0.12), 0.88)
    r, g, b = colorsys.hls_to_rgb(hue, lightness, saturation)
    return "#{:02x}{:02x}{:02x}".format(*(round(255 * c) for c in (r, g, b)))


def method_dash(lam) -> str:
    """The line style of a method: dashed when it shrinks (λ > 0), else solid."""
    return "dash" if lam is not None and not pd.isna(lam) and float(lam) > 0 else "solid"


def _rgba(hex_color: str, alpha: float) -> str:
    h = hex_color.lstrip("#")
    r, g, b = (int(h[i:i + 2], 16) for i in (0, 2, 4))
    return f"rgba({r},{g},{b},{alpha})"


def _layout(fig: go.Figure, title: str | None, height: int) -> go.Figure:
    fig.update_layout(
        title=dict(text=title, yref="container", y=1 - 12 / height, yanchor="top"), height=height,
        margin=dict(l=60, r=20, t=50 if title else 20, b=50),
        # the legend sits under the title and pushes the plot down, clear of axis titles and tick labels
        legend=dict(orientation="h", yref="container", yanchor="top", y=1 - (44 if title else 8) / height, xanchor="left", x=0,
                    tracegroupgap=0, font=dict(size=12)),
        hovermode="closest", template="plotly_white",
    )
    fig.update_xaxes(automargin=True)
    return fig


SUBPLOT_TITLE_CHARS = 12  # a subplot title's longest line: three panels side by side fit a 420 px screen
SUBPLOT_TITLE_SIZE = 12
TITLE_LINE_PX = 16  # the height of one line of a subplot title


def wrapped(text: str, width: int = SUBPLOT_TITLE_CHARS) -> list[str]:
    """``text`` in lines of at most ``width`` characters where it can be broken: after a
    "/" (``block_0/mlp/`` ``proj``) or at a space; a part longer than ``width`` stays whole."""
    parts = [p for p in text.replace("/", "/\n").replace(" ", " \n").split("\n") if p]
    lines: list[str] = []
    for part in parts:
        if lines and len(lines[-1]) + len(part.rstrip()) <= width:
            lines[-1] += part
        else:
            lines.append(part)
    return [line.rstrip() for line in lines] or [""]


def _subplot_titles(titles) -> list[str]:
    """Subplot titles wrapped (``wrapped``) for ``make_subplots``, Plotly-safe."""
    return ["<br>".join(plain(line, PLOTLY) for line in wrapped(str(t))) for t in titles]


def _clear_subplot_titles(fig: go.Figure) -> go.Figure:
    """Room between the legend and the subplot titles above the panels, one line of
    ``TITLE_LINE_PX`` per line of the longest: a transparent legend border, which the
    legend's push on the top margin includes; the titles in a smaller font."""
    lines = max((a.text.count("<br>") + 1 for a in fig.layout.annotations if a.text), default=1)
    fig.update_annotations(font=dict(size=SUBPLOT_TITLE_SIZE))
    fig.update_layout(legend=dict(borderwidth=12 + TITLE_LINE_PX * (lines - 1), bordercolor="rgba(0,0,0,0)"))
    return fig


def _bar_height(bars: int, minimum: int) -> int:
    """Height of a horizontal bar chart: room for each bar's label and its group, and
    for the title and legend above."""
    return max(minimum, 130 + 34 * bars)


def _no_data(fig: go.Figure, message: str) -> go.Figure:
    fig.add_annotation(text=message, showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5, font=dict(size=14, color="#888"))
    return fig


def band_segments(rows: pd.DataFrame) -> list[pd.DataFrame]:
    """The stretches of consecutive rows with a ± std band (``lo``/``hi`` set: two or more
    seeds at those steps); a step with one seed ends a stretch, so no band bridges it."""
    has = rows["lo"].notna().to_numpy() & rows["hi"].notna().to_numpy()
    if not has.any():
        return []
    stretch = np.cumsum(~has)  # constant along each stretch of banded rows
    return [part for _, part in rows[has].groupby(stretch[has], sort=True)]


def _add_curves(fig: go.Figure, frame: pd.DataFrame, x_title: str, y_title: str, legend: set[str], **cell) -> None:
    """Add each trace of a series frame; a trace gets a legend entry once, the first
    time it is added (``legend`` holds the traces already listed)."""
    setups = frame["symbol"].nunique() > 1 if "symbol" in frame else False
    for (c, trace), rows in frame.groupby(["color", "trace"], sort=False):
        dash = rows["dash"].iloc[0] if "dash" in rows else "solid"
        symbol = rows["symbol"].iloc[0] if "symbol" in rows else "circle"
        show_legend = trace not in legend
        legend.add(trace)
        banded = rows["lo"].notna().any()
        for band in band_segments(rows):  # only where at least two seeds have a value
            fig.add_trace(go.Scatter(x=band["x"], y=band["hi"], mode="lines", line=dict(width=0, color=c),
                                     legendgroup=trace, showlegend=False, hoverinfo="skip", name=plain(f"{trace} +std", PLOTLY)), **cell)
            fig.add_trace(go.Scatter(x=band["x"], y=band["lo"], mode="lines", line=dict(width=0, color=c),
                                     fill="tonexty", fillcolor=_rgba(c, 0.2), legendgroup=trace, showlegend=False,
                                     hoverinfo="skip", name=plain(f"{trace} −std", PLOTLY)), **cell)
        # mixed setups: every curve shows its setup's marker (at most MARKERS_UP_TO of them)
        mode = "lines+markers" if setups or len(rows) <= MARKERS_UP_TO else "lines"
        extra = " (mean of %{customdata} seeds at this step)" if banded else ""
        fig.add_trace(go.Scatter(
            x=rows["x"], y=rows["y"], mode=mode, name=plain(trace, PLOTLY), legendgroup=trace, showlegend=show_legend,
            line=dict(color=c, width=2, dash=dash), customdata=rows["n"],
            marker=dict(size=7 if setups else 5, color=c, symbol=symbol, maxdisplayed=MARKERS_UP_TO if setups else 0),
            hovertemplate=f"<b>{plain(trace, PLOTLY)}</b><br>{x_title} %{{x:,.4~g}}<br>{y_title} %{{y:.4f}}{extra}<extra></extra>",
        ), **cell)


def line_figure(
    frame: pd.DataFrame,
    *,
    x: str = "step",
    y_title: str,
    title: str | None = None,
    log_y: bool = False,
    height: int = 380,
) -> go.Figure:
    """Curves from a ``frames.series`` frame, in its order: one line per trace in its
    method's colour and line style (``color``, ``dash``); a
    trace with ``lo``/``hi`` also gets a translucent ± std band (two fill traces
    before its line). ``x`` (``step`` or ``wall_time``) names the x axis; ``log_y``
    makes the y axis logarithmic. An empty frame gives an empty chart that says so."""
    x_title = X_TITLES[x]
    fig = go.Figure()
    if frame.empty:
        _no_data(fig, "no points yet")
    else:
        _add_curves(fig, frame, x_title, y_title, set())
    fig.update_xaxes(title_text=x_title)
    fig.update_yaxes(title_text=y_title, type="log" if log_y else "linear")
    return _layout(fig, title, height)


def panels_figure(
    panels: dict[str, pd.DataFrame],
    *,
    x: str = "step",
    y_title: str,
    title: str | None = None,
    columns: int = 3,
    height_per_row: int = 280,
    log_y: bool = False,
    shared_y: bool = True,
) -> go.Figure:
    """One subplot per named ``frames.series`` frame (e.g. one per layer, or per value of
    a facet field), sharing the y axis (``log_y``: logarithmic) and the x axis (steps or
    wall time: every panel spans the same range, and a zoom in one zooms all), a trace
    keeps its colour in every panel and appears once in the legend."""
    names = list(panels)
    if not names:
        return _layout(_no_data(go.Figure(), "no points yet"), title, height_per_row)
    cols = max(1, min(columns, len(names)))
    rows = math.ceil(len(names) / cols)
    lines = max(len(wrapped(n)) for n in names)
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=_subplot_titles(names), shared_yaxes=shared_y,
                        horizontal_spacing=0.06, vertical_spacing=min(0.18 + 0.04 * (lines - 1), 0.9 / (rows - 1)) if rows > 1 else 0.1)
    legend: set[str] = set()
    for i, name in enumerate(names):
        r, c = divmod(i, cols)
        _add_curves(fig, panels[name], X_TITLES[x], y_title, legend, row=r + 1, col=c + 1)
        fig.update_xaxes(title_text=X_TITLES[x], row=r + 1, col=c + 1)
    for r in range(rows):
        fig.update_yaxes(title_text=y_title, row=r + 1, col=1)
    if log_y:
        fig.update_yaxes(type="log")
    for axis in [a for a in fig.layout if a.startswith("xaxis") and a != "xaxis"]:  # shared_xaxes: per column only
        fig.layout[axis].matches = "x"
    return _clear_subplot_titles(_layout(fig, title, height_per_row * rows + 80))


def memory_figure(frame: pd.DataFrame, *, title: str | None = None, height: int = 300) -> go.Figure:
    """Grouped horizontal bars from a ``frames.memory_frame``: one panel per quantity
    (saved for backward, peak, XLA temp) side by side, sharing one axis of runs (each
    named once, whole, top to bottom in the frame's order); for each curve a bar in its
    colour beside a grey bar for the exact baseline of its config, the ratio to that
    baseline written after the coloured bar as run ÷ exact (``0.994×``). Bars are in MiB."""
    if frame.empty:
        return _layout(_no_data(go.Figure(), "no memory figures recorded"), title, height)
    quantities = list(dict.fromkeys(frame["quantity"]))
    fig = make_subplots(rows=1, cols=len(quantities), subplot_titles=_subplot_titles(quantities),
                        horizontal_spacing=0.08, shared_yaxes=True)
    for i, quantity in enumerate(quantities, start=1):
        q = frame[frame["quantity"] == quantity]
        has_base = q["baseline_mib"].notna()
        labels = [plain(t, PLOTLY) for t in q["trace"]]
        fig.add_trace(go.Bar(
            y=labels, x=q["mib"], orientation="h", name="run (run ÷ exact after it)", showlegend=i == 1,
            legendgroup="run", marker=dict(color=list(q["color"])),
            text=[f"{r:.3f}×" if pd.notna(r) else "" for r in q["ratio"]], textposition="outside",
            textfont=dict(size=12), cliponaxis=False, constraintext="none",
            customdata=q["ratio"], hovertemplate="<b>%{y}</b><br>%{x:,.3f} MiB, run ÷ exact %{customdata:.3f}×<extra></extra>",
        ), row=1, col=i)
        fig.add_trace(go.Bar(
            y=[label for label, b in zip(labels, has_base) if b], x=q["baseline_mib"][has_base], orientation="h",
            name="exact baseline of its config", showlegend=i == 1, legendgroup="baseline",
            marker=dict(color=BASELINE_COLOR), hovertemplate="<b>%{y}</b><br>exact baseline %{x:,.3f} MiB<extra></extra>",
        ), row=1, col=i)
        top = max(q["mib"].max(), q["baseline_mib"].max() if has_base.any() else 0)
        fig.update_xaxes(title_text="MiB", range=[0, 1.3 * top if top > 0 else 1], row=1, col=i)
    fig.update_layout(barmode="group")
    fig.update_yaxes(autorange="reversed")  # the frame's first run on top
    rows = frame["trace"].nunique()
    return _clear_subplot_titles(_layout(fig, title, _bar_height(2 * rows, height)))


def breakdown_figure(frame: pd.DataFrame, *, title: str | None = None, height: int = 300) -> go.Figure:
    """Stacked horizontal bars from a ``frames.breakdown_frame``: one bar per run and one
    per its exact baseline (each named whole, top to bottom in the frame's order),
    stacked by category in fixed category colours, in MiB."""
    fig = go.Figure()
    bars: list[str] = []
    if frame.empty:
        _no_data(fig, "no per-category memory recorded")
    else:
        bars = list(dict.fromkeys(frame["bar"]))
        for category in dict.fromkeys(frame["category"]):
            part = frame[frame["category"] == category].set_index("bar").reindex(bars)
            fig.add_trace(go.Bar(
                y=[plain(b, PLOTLY) for b in bars], x=part["mib"], orientation="h", name=category,
                marker=dict(color=CATEGORY_COLORS.get(category, "#999")),
                hovertemplate=f"<b>%{{y}}</b><br>{category}: %{{x:,.3f}} MiB<extra></extra>",
            ))
        fig.update_layout(barmode="stack")
        fig.update_yaxes(autorange="reversed")
    fig.update_xaxes(title_text="saved for backward (MiB)")
    return _layout(fig, title, _bar_height(len(bars), height))


def rank_figure(frame: pd.DataFrame, *, y_title: str, title: str | None = None, height: int = 420) -> go.Figure:
    """The paper's central figure from a ``method_frames.rank_frame``: the quantity against the
    rank R on a log x axis, one line per trace (estimator, λ, setup) in its
    ``line_color`` and ``dash``, each point in its method's colour and its setup's
    marker with the seed std as its error bar; exact as a horizontal band (mean ± std,
    a line at the mean in its setup's dash: dotted, dashed, …) across the ranks shown,
    one per setup. Line i of n is drawn at
    R·2^(RANK_DODGE·(i − (n−1)/2)) so error bars at a shared R do not hide each other
    (the hover names the true R)."""
    fig = go.Figure()
    sketched = frame[frame["estimator"] != "exact"] if not frame.empty else frame
    if sketched.empty:
        _no_data(fig, "no sketched run has a value at this step")
        fig.update_xaxes(title_text="rank R (log scale)", type="log")
        fig.update_yaxes(title_text=y_title)
        return _layout(fig, title, height)
    ranks = sorted(int(r) for r in sketched["rank"].unique())
    lo, hi = ranks[0] / 1.4, ranks[-1] * 1.4
    for _, band in frame[frame["estimator"] == "exact"].iterrows():
        c = band["color"]
        name = plain(f"{band['trace']} (mean ± std of {band['seeds']} seeds)" if band["seeds"] > 1 else band["trace"], PLOTLY)
        if pd.notna(band["std"]):
            top, bottom = band["mean"] + band["std"], band["mean"] - band["std"]
            fig.add_trace(go.Scatter(x=[lo, hi], y=[top, top], mode="lines", line=dict(width=0, color=c), legendgroup=name,
                                     showlegend=False, hoverinfo="skip", name=f"{name} +std"))
            fig.add_trace(go.Scatter(x=[lo, hi], y=[bottom, bottom], mode="lines", line=dict(width=0, color=c), fill="tonexty",
                                     fillcolor=_rgba(c, 0.15), legendgroup=name, showlegend=False, hoverinfo="skip",
                                     name=f"{name} −std"))
        fig.add_trace(go.Scatter(
            x=[lo, hi], y=[band["mean"]] * 2, mode="lines", name=name, legendgroup=name,
            line=dict(color=c, width=2, dash=band["dash"] if band.get("dash", "solid") != "solid" else "dot"),
            hovertemplate=f"<b>{plain(band['trace'], PLOTLY)}</b><br>{y_title} %{{y:.4f}}"
                          + ("" if pd.isna(band["std"]) else f" ± {band['std']:.4f}") + "<extra></extra>",
        ))
    lines = list(dict.fromkeys(sketched["trace"]))
    for i, (trace, rows) in enumerate(sketched.groupby("trace", sort=False)):
        rows = rows.sort_values("rank")
        dodge = 2.0 ** (RANK_DODGE * (i - (len(lines) - 1) / 2))  # lines side by side at a shared R
        fig.add_trace(go.Scatter(
            x=rows["rank"].astype(int) * dodge, y=rows["mean"], mode="lines+markers", name=plain(trace, PLOTLY),
            line=dict(color=rows["line_color"].iloc[0], width=2, dash=rows["dash"].iloc[0]),
            marker=dict(size=9, color=list(rows["color"]), line=dict(width=1, color="white"),
                        symbol=rows["symbol"].iloc[0] if "symbol" in rows else "circle"),
            error_y=dict(type="data", array=rows["std"].tolist(), visible=True, thickness=1.5, width=5),
            customdata=rows[["rank", "seeds", "std"]].astype(float).to_numpy(),
            hovertemplate=f"<b>{plain(trace, PLOTLY)}</b> R=%{{customdata[0]}}<br>{y_title} %{{y:.4f}} ± %{{customdata[2]:.4f}}"
                          "<br>%{customdata[1]} seeds<extra></extra>",
        ))
    fig.update_xaxes(title_text="rank R (rows kept, log scale)", type="log", tickvals=ranks, ticktext=[str(r) for r in ranks],
                     range=[math.log10(lo), math.log10(hi)])
    fig.update_yaxes(title_text=y_title)
    return _layout(fig, title, height)
