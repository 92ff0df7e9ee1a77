"""The Diagnosis page's frames and figures: pure functions of stored diagnosis results
(``DiagnosticsRepository.diagnostics.diagnostic_results``: ``engine.analysis.diagnostics.COLUMNS``).

Every quantity is relative to ‖dW‖²_F of the exact gradient on the same batches. On
log axes a value ≤ 0 has no place: the squared bias is Monte-Carlo corrected (‖ē‖² −
V/K), so an unbiased estimator's is zero within its standard error and often negative.
A bias² not above 2 se is drawn as an open downward triangle at its upper bound
max(b², 0) + 2 se ("below this"), a significant one as a dot with ± se bars; a value
that is 0 to float32 precision (below ``ROUND_OFF``: an estimator that keeps X whole at this
rank, whose error is float32 round-off, relative size ~ε² ≈ 1e-14) is left off the axis.

Colours: each estimator's hue from ``engine.analysis.charts.method_color``, the same as on every
other chart; a second λ of the same estimator is dashed.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from engine.analysis.charts import method_color

COLOR_RANK = 8  # a line spans every R: it takes its estimator's colour at a middle rank
DASHES = ("solid", "dash", "dot", "dashdot")
QUANTITIES = {"mse": "MSE", "bias2": "bias²", "variance": "variance"}
POOLED = "all"
ROUND_OFF = 1e-10  # relative values below this are float32 round-off (ε² ≈ 1.4e-14, with margin): zero
SIGNIFICANT_SE = 2.0  # a bias² above this many standard errors is drawn as a value, else as a bound


def estimator_color(estimator: str) -> str:
    """The estimator's colour on every chart (``engine.analysis.charts.method_color``)."""
    return method_color(estimator, COLOR_RANK)


def layers(results: pd.DataFrame) -> list[str]:
    """``all`` (pooled) first, then the sketched layers in the order measured."""
    names = list(dict.fromkeys(results["layer"]))
    return ([POOLED] if POOLED in names else []) + [n for n in names if n != POOLED]


def layer_label(layer: str) -> str:
    return "all sketched layers (pooled)" if layer == POOLED else layer


def _labels(frame: pd.DataFrame) -> pd.Series:
    several = frame.groupby("estimator")["lam"].transform("nunique") > 1
    return pd.Series([f"{e} λ={lam:g}" if s else e for e, lam, s in zip(frame["estimator"], frame["lam"], several)],
                     index=frame.index)


def curve_frame(results: pd.DataFrame, layer: str, quantity: str) -> pd.DataFrame:
    """One row per (estimator, λ, rank) of ``layer``: ``label, estimator, lam, rank, value,
    se, y, bound`` where ``y`` is what a log axis shows (NaN when nothing can be) and
    ``bound`` marks a bias² drawn at its upper bound (not significantly above 0)."""
    if quantity not in QUANTITIES:
        raise ValueError(f"unknown quantity {quantity!r}; choose one of {', '.join(QUANTITIES)}")
    rows = results[results["layer"] == layer].copy()
    rows = rows.sort_values(["estimator", "lam", "rank"], kind="stable")
    out = pd.DataFrame({
        "label": _labels(rows) if not rows.empty else pd.Series(dtype=str),
        "estimator": rows["estimator"], "lam": rows["lam"].astype(float), "rank": rows["rank"].astype(int),
        "value": rows[quantity].astype(float),
        "se": rows["bias2_se"].astype(float) if quantity == "bias2" else np.nan,
    })
    if quantity == "bias2":
        out["bound"] = out["value"] <= SIGNIFICANT_SE * out["se"]
        upper = out["value"].clip(lower=0) + SIGNIFICANT_SE * out["se"]
        out["y"] = np.where(out["bound"], upper, out["value"])
    else:
        out["bound"] = False
        out["y"] = out["value"]
    out["y"] = out["y"].where(out["y"] > ROUND_OFF)
    return out.reset_index(drop=True)


def _add(fig: go.Figure, frame: pd.DataFrame, quantity: str, *, col: int | None, legend: bool, dash_of: dict) -> None:
    name = QUANTITIES[quantity]
    for label, rows in frame.groupby("label", sort=False):
        c = estimator_color(rows["estimator"].iloc[0])
        dash = dash_of[label]
        cell = dict(row=1, col=col) if col else {}
        hover = f"{label}<br>R=%{{x}}<br>{name} %{{customdata:.4g}}<extra></extra>"
        fig.add_trace(go.Scatter(
            x=rows["rank"], y=rows["y"], mode="lines", name=label, legendgroup=label, showlegend=legend,
            line=dict(color=c, width=2, dash=dash), connectgaps=True, hoverinfo="skip"), **cell)
        sig = rows[~rows["bound"]]
        err = dict(type="data", array=sig["se"], visible=True, color=c, thickness=1) if quantity == "bias2" else None
        fig.add_trace(go.Scatter(
            x=sig["rank"], y=sig["y"], mode="markers", name=label, legendgroup=label, showlegend=False,
            marker=dict(color=c, size=7), error_y=err, customdata=sig["value"], hovertemplate=hover), **cell)
        low = rows[rows["bound"]]
        if not low.empty:
            fig.add_trace(go.Scatter(
                x=low["rank"], y=low["y"], mode="markers", name=label, legendgroup=label, showlegend=False,
                marker=dict(color=c, size=8, symbol="triangle-down-open", line=dict(width=1.5)),
                customdata=low["value"],
                hovertemplate=f"{label}<br>R=%{{x}}<br>bias² %{{customdata:.3g}}: zero within 2 se, "
                              "below %{y:.3g}<extra></extra>"), **cell)


_SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def power_text(value: float) -> str:
    """``2×10⁻³``, ``10⁻³``: a tick label that names its decade, so no label is a bare digit."""
    exponent = math.floor(math.log10(value) + 1e-9)
    mantissa = round(value / 10.0**exponent, 6)
    power = f"10{str(exponent).translate(_SUPERSCRIPT)}"
    return power if mantissa == 1 else f"{mantissa:g}×{power}"


def log_ticks(values) -> tuple[list[float], list[str]]:
    """Labelled ticks of a log axis showing ``values`` (positive ones count): every power
    of ten in range when two or more powers of ten lie among the values, else 1, 2 and 5
    times the powers of ten around them, so the axis always has at least two labels (5.4
    to 52 crosses one power of ten and gets 10, 20 and 50); every label carries its power
    of ten (``2×10⁻³``), unlike Plotly's bare minor digits ("2", "5")."""
    v = np.asarray([x for x in np.asarray(values, dtype=float).ravel() if np.isfinite(x) and x > 0])
    if v.size == 0:
        return [], []
    lo, hi = math.floor(math.log10(v.min())), math.ceil(math.log10(v.max()))
    if math.floor(math.log10(v.max()) + 1e-9) - math.ceil(math.log10(v.min()) - 1e-9) >= 1:
        ticks = [10.0**k for k in range(lo, hi + 1)]
    else:
        ticks = [m * 10.0**k for k in range(lo - 1, hi + 1) for m in (1, 2, 5)]
        ticks = [t for t in ticks if v.min() / 2.5 <= t <= v.max() * 2.5]
    return ticks, [power_text(t) for t in ticks]


def mse_figure(results: pd.DataFrame, layer: str, *, split: bool, title: str | None = None,
               height: int = 460) -> go.Figure:
    """Relative MSE against R on log–log axes, one line per estimator (and λ); with
    ``split``, two panels instead: the squared bias and the variance (MSE = their sum)."""
    quantities = ("bias2", "variance") if split else ("mse",)
    frames = {q: curve_frame(results, layer, q) for q in quantities}
    labels = list(dict.fromkeys(frames[quantities[0]]["label"]))
    per_estimator: dict[str, int] = {}
    dash_of = {}
    for label, estimator in dict(zip(frames[quantities[0]]["label"], frames[quantities[0]]["estimator"])).items():
        dash_of[label] = DASHES[per_estimator.get(estimator, 0) % len(DASHES)]
        per_estimator[estimator] = per_estimator.get(estimator, 0) + 1
    if split:
        fig = make_subplots(rows=1, cols=2, shared_yaxes=True, horizontal_spacing=0.04,
                            subplot_titles=("squared bias ‖E d̂W − dW‖² / ‖dW‖²",
                                            "variance E‖d̂W − E d̂W‖² / ‖dW‖²"))
    else:
        fig = go.Figure()
    for i, q in enumerate(quantities):
        _add(fig, frames[q], q, col=i + 1 if split else None, legend=i == 0, dash_of=dash_of)
    ranks = sorted(set(frames[quantities[0]]["rank"]))
    fig.update_xaxes(type="log", title_text="rank R (rows of X kept)", tickvals=ranks, ticktext=[str(r) for r in ranks])
    drawn = pd.concat([frames[q]["y"] for q in quantities])
    tickvals, ticktext = log_ticks(drawn)
    fig.update_yaxes(type="log", tickvals=tickvals or None, ticktext=ticktext or None,
                     minor=dict(ticks="outside", ticklen=3, dtick="D1", showgrid=False))
    fig.update_yaxes(title_text="relative to ‖dW‖²" if split else "MSE ‖d̂W − dW‖² / ‖dW‖²", col=1 if split else None)
    fig.update_layout(
        title=title, height=height, margin=dict(l=70, r=20, t=70 if title or split else 20, b=50),
        legend=dict(orientation="h", yanchor="top", y=-0.18, xanchor="left", x=0, title_text="estimator"),
        hovermode="closest", template="plotly_white",
    )
    if not labels or frames[quantities[0]]["y"].isna().all():
        fig.add_annotation(text="nothing to draw for this layer", showarrow=False, xref="paper", yref="paper",
                           x=0.5, y=0.5, font=dict(size=14, color="#888"))
    return fig


def ranks(results: pd.DataFrame) -> list[int]:
    return sorted(int(r) for r in set(results["rank"]))


TABLE_COLUMNS = ("estimator", "λ", "bias²", "± se", "variance", "MSE", "bias share", "mean cosine")


def table_at(results: pd.DataFrame, layer: str, rank: int) -> pd.DataFrame:
    """The estimators at rank ``rank`` on ``layer``, best MSE first: bias² (± its standard
    error), variance, MSE (relative to ‖dW‖²), the share of the MSE that is bias²
    (clipped at 0) and the mean cosine to the exact dW."""
    rows = results[(results["layer"] == layer) & (results["rank"] == rank)].sort_values("mse", kind="stable")
    mse = rows["mse"].astype(float)
    share = rows["bias2"].clip(lower=0) / mse.where(mse > 0)
    out = pd.DataFrame({
        "estimator": rows["estimator"].astype(str), "λ": rows["lam"].astype(float),
        "bias²": rows["bias2"].astype(float), "± se": rows["bias2_se"].astype(float),
        "variance": rows["variance"].astype(float), "MSE": mse, "bias share": share.astype(float),
        "mean cosine": rows["cos_mean"].astype(float),
    })
    return out.reset_index(drop=True)[list(TABLE_COLUMNS)]


def measured_on(run_id: int, run_name: str, settings: dict) -> str:
    """One sentence: which state and batches a diagnosis measured (plain text; the page escapes it)."""
    step = int(settings.get("step", 0))
    where = "its initial parameters (step 0)" if settings.get("initial") else f"its checkpoint at step {step:,}"
    n, k = int(settings.get("batches", 0)), int(settings.get("keys", 0))
    batches = f"{n:,} training batch{'es' if n != 1 else ''}"
    after = f"its first {batches}" if settings.get("initial") else f"the {batches} it drew after step {step:,}"
    return (f"Run #{run_id} {run_name}, at {where}, on {after}: K = {k:,} sketch keys per batch, "
            f"every value relative to ‖dW‖² of the exact gradient on the same batch.")


def diagnosis_label(row: pd.Series) -> str:
    """``#3 · step 20 · 8 estimators × 4 ranks · K 256 × 4 batches`` for a ``diagnostics_frame`` row."""
    s = row["settings"] or {}
    step = "initial parameters" if s.get("initial") else f"step {int(row['step']):,}" if pd.notna(row["step"]) else "step ?"
    parts = [f"#{int(row['id'])}", step]
    if s:
        parts.append(f"{len(s.get('estimators', []))} estimators × {len(s.get('ranks', []))} ranks")
        parts.append(f"K {int(s.get('keys', 0)):,} × {int(s.get('batches', 0))} batches")
    return " · ".join(parts)


def progress_fraction(progress: tuple[int, int] | None) -> float:
    if not progress or progress[1] <= 0:
        return 0.0
    return min(max(progress[0] / progress[1], 0.0), 1.0)
