"""Chart builders: frames in, figures out; their traces, colours, bands, axes and texts."""

import colorsys
import re

import numpy as np
import pandas as pd
import pytest

from engine.analysis import charts, frames


def _title(text: str) -> str:
    """A subplot title with ``charts.wrapped``'s line breaks undone: none after a "/", a space elsewhere."""
    return "".join(line if line.endswith("/") or k == len(text.split("<br>")) - 1 else line + " "
                   for k, line in enumerate(text.split("<br>")))


def _series(trace, color, ys, std=None, xs=None, dash="solid"):
    xs = list(range(0, 10 * len(ys), 10)) if xs is None else xs
    ys = np.asarray(ys, float)
    sd = np.full_like(ys, np.nan) if std is None else np.full_like(ys, std)
    return pd.DataFrame({"trace": trace, "color": color, "dash": dash, "x": xs, "y": ys, "lo": ys - sd, "hi": ys + sd,
                         "n": 1 if std is None else 3})


EXACT, R8 = charts.method_color("exact"), charts.method_color("basis", 8, 0.0)
R1, R32 = charts.method_color("basis", 1, 0.0), charts.method_color("basis", 32, 0.0)


def _hls(color):
    return colorsys.rgb_to_hls(*(int(color[i:i + 2], 16) / 255 for i in (1, 3, 5)))


def test_method_colors_are_the_methods_alone():
    assert charts.method_color("exact", None, 0.0) == charts.method_color(None) == charts.EXACT_COLOR
    assert charts.method_color("exact", 8, 0.01) == charts.EXACT_COLOR  # exact has no rank: one neutral colour
    assert _hls(charts.EXACT_COLOR)[2] == 0 and charts.BASELINE_COLOR != charts.EXACT_COLOR  # grey, not the baseline bars'
    estimators = ["basis", "countsketch", "balanced", "scalars", "gaussian", "crs", "wta-crs", "proj"]
    at_8 = [charts.method_color(e, 8, 0.0) for e in estimators]
    assert len(set(at_8)) == len(estimators) and charts.EXACT_COLOR not in at_8
    hues = sorted(_hls(c)[0] * 360 for c in at_8)  # families apart on the colour wheel
    assert min(np.diff(hues + [hues[0] + 360])) > 15
    assert _hls(R1)[1] > _hls(R8)[1] > _hls(R32)[1]  # shaded by rank: larger R darker
    shrunk = charts.method_color("basis", 8, 0.01)
    assert shrunk != R8 and _hls(shrunk)[2] < _hls(R8)[2]  # λ > 0: desaturated
    assert charts.method_dash(0.01) == "dash" and charts.method_dash(0.0) == charts.method_dash(None) == "solid"
    unknown = charts.method_color("my-new-sketch", 8, 0.0)
    assert unknown == charts.method_color("my-new-sketch", 8, 0.0) and unknown.startswith("#") and len(unknown) == 7
    assert charts.method_color("basis", 8.0, 0) == R8 and charts.method_color("basis", np.int64(8), np.float64(0)) == R8


def test_line_figure_draws_one_line_per_trace_in_its_run_colour():
    frame = pd.concat([_series("exact s0", EXACT, [10, 8, 7]), _series("basis R=8 s0", R8, [10, 9, 8])])
    fig = charts.line_figure(frame, y_title="validation loss (nats/token)", title="Validation loss")
    assert [t.name for t in fig.data] == ["exact s0", "basis R=8 s0"]
    assert [t.line.color for t in fig.data] == [EXACT, R8]
    assert list(fig.data[0].y) == [10, 8, 7] and list(fig.data[1].x) == [0, 10, 20]
    assert fig.data[0].mode == "lines+markers"
    assert fig.layout.xaxis.title.text == "step"
    assert fig.layout.yaxis.title.text == "validation loss (nats/token)"
    assert fig.layout.yaxis.type == "linear" and fig.layout.title.text == "Validation loss"


def test_line_figure_band_log_axis_and_wall_time():
    frame = _series("basis R=8 · mean of 3 seeds", R8, [10, 9, 8], std=0.5, dash="dash")
    fig = charts.line_figure(frame, x="wall_time", y_title="train loss (nats/token)", log_y=True)
    upper, lower, line = fig.data
    assert list(upper.y) == [10.5, 9.5, 8.5] and list(lower.y) == [9.5, 8.5, 7.5]
    assert lower.fill == "tonexty" and not upper.showlegend and not lower.showlegend
    assert line.name == "basis R=8 · mean of 3 seeds" and line.showlegend is not False
    assert lower.fillcolor.startswith("rgba(") and line.line.color == R8 and line.line.dash == "dash"
    assert "mean of %{customdata} seeds at this step" in line.hovertemplate
    assert fig.layout.xaxis.title.text == "wall time (s)" and fig.layout.yaxis.type == "log"


def test_line_figure_long_curves_have_no_markers_and_empty_frames_say_so():
    fig = charts.line_figure(_series("a", R1, np.linspace(10, 6, 500)), y_title="loss")
    assert fig.data[0].mode == "lines"
    empty = charts.line_figure(pd.DataFrame(columns=frames.SERIES_COLUMNS), y_title="loss")
    assert not fig.layout.annotations and len(empty.data) == 0
    assert empty.layout.annotations[0].text == "no points yet"


def test_panels_figure_one_panel_per_layer_one_legend_entry_per_curve():
    panels = {layer: pd.concat([_series("basis R=1 s0", R1, [0.1, 0.2]), _series("basis R=8 s0", R8, [0.5, 0.6])])
              for layer in ("block_0/mlp/fc", "block_0/mlp/proj", "head", "block_1/mlp/fc")}
    fig = charts.panels_figure(panels, y_title="cosine", columns=3)
    assert [_title(a.text) for a in fig.layout.annotations] == list(panels)
    assert len(fig.data) == 8
    legend = [t.name for t in fig.data if t.showlegend is not False]
    assert legend == ["basis R=1 s0", "basis R=8 s0"]
    assert {t.line.color for t in fig.data if t.name == "basis R=8 s0"} == {R8}
    assert fig.layout.yaxis.title.text == "cosine" and fig.layout.xaxis4.title.text == "step"
    assert fig.data[6].xaxis == "x4"  # the fourth layer is drawn in the second row


def test_memory_figure_bars_against_the_grey_baseline_with_the_ratio_written():
    frame = pd.DataFrame({
        "trace": ["exact s0", "basis R=8 s0", "exact s0", "basis R=8 s0"],
        "color": [EXACT, R8, EXACT, R8],
        "quantity": ["Saved for backward"] * 2 + ["Peak device memory"] * 2,
        "mib": [12.0, 6.0, 40.0, 30.0], "baseline_mib": [12.0, 12.0, 40.0, np.nan],
        "ratio": [1.0, 0.5, 1.0, np.nan],
    })
    fig = charts.memory_figure(frame)
    assert [_title(a.text) for a in fig.layout.annotations] == ["Saved for backward", "Peak device memory"]
    run, base, run2, base2 = fig.data
    assert {t.orientation for t in fig.data} == {"h"}  # whole labels on the axis of runs, readable at any width
    assert list(run.x) == [12.0, 6.0] and list(run.text) == ["1.000×", "0.500×"]
    assert list(run.y) == ["exact s0", "basis R=8 s0"]
    assert list(run.marker.color) == [EXACT, R8]
    assert run.name == "run (run ÷ exact after it)"
    assert base.marker.color == charts.BASELINE_COLOR and list(base.x) == [12.0, 12.0]
    assert list(base2.y) == ["exact s0"]  # no baseline bar where the baseline is unknown
    assert list(run2.text) == ["1.000×", ""]
    assert fig.layout.xaxis.title.text == "MiB" and fig.layout.xaxis2.title.text == "MiB"
    assert fig.layout.xaxis.range[1] >= 1.2 * 12.0  # room for the ratio after the longest bar
    assert fig.layout.yaxis.autorange == "reversed" and fig.layout.barmode == "group"


def test_breakdown_figure_stacks_categories_in_fixed_colours():
    frame = pd.DataFrame({
        "bar": ["R=8", "R=8", "R=8 · exact", "R=8 · exact"], "color": [R8] * 4,
        "category": ["sketched_inputs", "loss_logits", "sketched_inputs", "loss_logits"],
        "mib": [1.0, 5.0, 4.0, 5.0],
    })
    fig = charts.breakdown_figure(frame)
    assert fig.layout.barmode == "stack"
    assert [t.name for t in fig.data] == ["sketched_inputs", "loss_logits"]
    assert list(fig.data[0].y) == ["R=8", "R=8 · exact"] and list(fig.data[0].x) == [1.0, 4.0]
    assert fig.data[0].orientation == "h" and fig.layout.yaxis.autorange == "reversed"
    assert fig.data[1].marker.color == charts.CATEGORY_COLORS["loss_logits"]
    assert fig.layout.xaxis.title.text == "saved for backward (MiB)"



@pytest.mark.parametrize("builder", [charts.memory_figure, charts.breakdown_figure])
def test_bar_figures_on_empty_frames_say_so(builder):
    fig = builder(pd.DataFrame(columns=["trace", "bar", "color", "category", "quantity", "mib", "baseline_mib", "ratio"]))
    assert len(fig.data) == 0 and fig.layout.annotations[0].text.startswith("no ")


# Streamlit's markdown (1.67, StreamlitMarkdown.js) replaces these in text between spaces after
# reading the escapes: "rank >= 8" would show as "rank ≥ 8", which no filter parses.
STREAMLIT_TYPOGRAPHY = [(r"(^|\s)<->(\s|$)", "↔"), (r"(^|\s)->(\s|$)", "→"), (r"(^|\s)<-(\s|$)", "←"),
                        (r"(^|\s)--(\s|$)", "—"), (r"(^|\s)>=(\s|$)", "≥"), (r"(^|\s)<=(\s|$)", "≤"),
                        (r"(^|\s)~=(\s|$)", "≈")]


def test_plain_text_keeps_the_operators_streamlit_would_typeset():
    from app.text import plain
    from engine.analysis.where import EXAMPLE, parse
    from engine.core.text import WORD_JOINER

    typed = "rank >= 8 and lam <= 0.01 -- a -> b <- c <-> d ~= e\n>= x"
    read = re.sub(r"\\(.)", r"\1", plain(typed).replace("  \n", "\n"))  # the text node, escapes read
    shown = read
    for pattern, symbol in STREAMLIT_TYPOGRAPHY:
        shown = re.sub(pattern, lambda m: m.group(1) + symbol + m.group(2), shown)
    assert shown == read and shown.replace(WORD_JOINER, "") == typed
    parse(plain(EXAMPLE).replace("\\", ""))  # a filter copied from a page's error message still parses


def test_one_plain_text_helper_for_markdown_and_plotly():
    from app.text import PLOTLY, plain
    from engine.core.text import WORD_JOINER

    evil = "![q](http://127.0.0.2:9/x.png) <img src=http://127.0.0.2:9/y.png>"
    shown = plain(evil)
    assert shown.startswith("\\!\\[q\\]\\(") and "\\<img" in shown  # every special character escaped
    assert shown.replace("\\", "").replace(WORD_JOINER, "") == evil  # the text itself, once the escapes are read
    assert "://" not in shown.replace("\\", "")  # no autolink: a joiner stands in each
    assert plain(evil, PLOTLY) == evil.replace("<", "&lt;").replace(">", "&gt;")
    with pytest.raises(ValueError, match="medium"):
        plain(evil, "html")


def test_log_axis_labels_always_name_their_decade():
    from app.diagnosis_charts import log_ticks, power_text

    assert [power_text(v) for v in (1e-3, 2e-3, 5e-2, 1.0, 30.0)] == ["10⁻³", "2×10⁻³", "5×10⁻²", "10⁰", "3×10¹"]
    narrow, labels = log_ticks([0.021, 0.034, 0.09])  # less than a decade: Plotly would label minor ticks "2", "5"
    assert len(narrow) >= 2 and all("10" in t for t in labels)
    assert min(narrow) <= 0.021 and max(narrow) >= 0.09
    # less than a decade across a power of ten (a diagnosis's MSE from 5.4 to 52): Plotly's axis shows about
    # the values, so two labels at least must fall among them, not one power of ten (10) alone
    across, labels = log_ticks([5.38, 7.77, 32.6, 52.3])
    assert len([t for t in across if 5.38 <= t <= 52.3]) >= 2 and all("10" in t for t in labels), labels
    wide, labels = log_ticks([1e-5, 3e-2, np.nan, 0.0, -1.0])  # non-positive values have no place on a log axis
    assert wide == [10.0**k for k in range(-5, 0)] and labels[0] == "10⁻⁵"
    assert log_ticks([np.nan]) == ([], [])
