"""What sets the selected runs apart: their config diff and a parallel-coordinates figure.

Both read the fields of the one run schema (``engine.config.schema``, in its order; keys a
stored config has beyond it, from an older or newer version, follow by name), keep those
whose stored values differ among the runs, and leave out ``name`` (each run's column or
line already says it). Values are compared as JSON text, as ``differing_fields`` compares
them (stored configs are written from ``RunConfig``, so a field keeps one type).

The figure (``parallel_figure``, Plotly ``go.Parcoords``) has one axis per differing field
and one per final metric (each run's value at its highest step, ``storage``'s
``final_metrics``): a numeric field (every value a number, none missing) on a numeric axis,
any other field (text, lists, mappings, a value missing in some runs) on an axis of its
distinct values in order (numbers by value, then text). Exact backprop's rank and λ are
shown as not set ("—"): it has neither (``effective``). Lines are coloured by the first metric axis (final val loss
when present), lower is darker. A metric a run has no value of (or NaN: a diverged run)
breaks its line at that axis.
"""

from __future__ import annotations

import json
import math
from typing import Any, Iterable, Mapping, Sequence

import pandas as pd
import plotly.graph_objects as go

from engine.config import RunConfig, schema, stored
from engine.core.text import PLOTLY, plain

FINAL_METRICS = {  # metric name → axis title, in axis order (the first that runs have colours the lines)
    "val_loss": "final val loss",
    "train_loss": "final train loss",
    "cos_mean": "final mean cos",
    "tokens_per_s": "tokens/s",
}
HIDDEN_FIELDS = ("name",)
UNUSED_BY_EXACT = ("rank", "lam")
LINE_SCALE = "Viridis"


def _key(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def effective(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` as it acts: exact backprop (``RunConfig.is_exact``) has no rank and no λ
    (they are None), as ``seed_group_key`` ignores them for exact runs."""
    config, run = dict(config), stored(config)
    if run is not None and run.is_exact:
        config.update({k: None for k in UNUSED_BY_EXACT if k in config})
    return config


def config_text(value: Any, none: str | None = None) -> str:
    """A config value as a page or report shows it: None as ``default (none)`` (``none``: the
    schema's words for what None means), a mapping as ``k=v, …`` ("—" when empty)."""
    if value is None:
        return f"default ({none})" if none else "default"
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in sorted(value.items())) or "—"
    return str(value)


def shown_config(config: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(field, value as text) of every field of a stored ``config``, schema fields in schema
    order then unknown keys: ``config_text``, but exact backprop's rank and λ, which it
    stores and never uses (``effective``), read "— (exact backprop sketches nothing)"."""
    specs = {f.name: spec for f, spec, _ in schema(RunConfig)}
    unused = {k for k, v in effective(config).items() if k in UNUSED_BY_EXACT and v is None and config.get(k) is not None}
    return [(k, "— (exact backprop sketches nothing)" if k in unused else
             config_text(v, getattr(specs.get(k), "none", None))) for k, v in config.items()]


def differing(configs: Sequence[Mapping[str, Any]]) -> list[str]:
    """The config fields whose values differ among ``configs`` (a key one config lacks
    differs), schema fields first in schema order, then unknown keys by name."""
    known = [f.name for f, _, _ in schema(RunConfig)]
    keys = [k for k in known if any(k in c for c in configs)] + sorted({k for c in configs for k in c} - set(known))
    return [k for k in keys if k not in HIDDEN_FIELDS and len({_key(c.get(k)) for c in configs}) > 1]


def _shown(value: Any) -> str:
    if value is None:
        return "—"
    return value if isinstance(value, str) else _key(value)


def config_diff(records: Iterable) -> pd.DataFrame:
    """One row per differing field (``differing``), a ``field`` column then one column per
    run, ``#id name``, by id; each cell the value as text ("—": not set). Empty (just
    ``field``) when the runs share every field, or there are fewer than two."""
    records = sorted(records, key=lambda r: r.id)
    configs = [effective(r.config) for r in records]
    fields = differing(configs) if len(records) > 1 else []
    columns = {f"#{r.id} {r.name}": [_shown(config.get(k)) for k in fields] for r, config in zip(records, configs)}
    return pd.DataFrame({"field": fields, **(columns if fields else {})})  # built at once: a column a run


def _numeric(values: list) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values)


def _order(shown: str) -> tuple:
    """Numbers first, in numeric order (a rank axis with exact's "—" reads 1, 8, 32, —), then text."""
    try:
        return (0, float(shown), "")
    except ValueError:
        return (1, 0.0, shown)


def _dimension(label: str, values: list) -> dict:
    """A parcoords axis of ``values`` (one per run): numeric, or categorical with tick labels."""
    if _numeric(values):
        return {"label": label, "values": [float(v) for v in values]}
    names = sorted({_shown(v) for v in values}, key=_order)
    codes = {n: i for i, n in enumerate(names)}
    return {"label": label, "values": [codes[_shown(v)] for v in values], "tickvals": list(range(len(names))),
            "ticktext": [plain(n if len(n) <= 24 else n[:23] + "…", PLOTLY) for n in names], "range": [-0.25, len(names) - 0.75]}


def parallel_figure(records: Iterable, finals: pd.DataFrame, *, metrics: Mapping[str, str] = FINAL_METRICS,
                    title: str | None = None, height: int = 420) -> go.Figure:
    """The parallel-coordinates figure of ``records`` (see the module); ``finals`` is
    ``final_metrics``' frame (run_id, name, value …). A figure that says why when fewer
    than two runs are given or nothing sets them apart."""
    records = sorted(records, key=lambda r: r.id)
    fig = go.Figure()
    fig.update_layout(title=dict(text=title), height=height, margin=dict(l=70, r=70, t=90 if title else 60, b=30),
                      template="plotly_white")
    if len(records) < 2:
        return _note(fig, "Select two or more runs to see what sets them apart.")
    configs = [effective(r.config) for r in records]
    dims = [_dimension(plain(k, PLOTLY), [c.get(k) for c in configs]) for k in differing(configs)]
    wide = finals.pivot_table(index="run_id", columns="name", values="value", aggfunc="last") if len(finals) else pd.DataFrame()
    colour = None
    for name, label in metrics.items():
        if name not in wide.columns:
            continue
        values = [float(wide[name].get(r.id, float("nan"))) for r in records]
        if all(math.isnan(v) for v in values):
            continue
        dims.append({"label": label, "values": values})
        colour = colour if colour is not None else (label, values)
    if len(dims) < 2:
        return _note(fig, "These runs share their config and have no final metrics yet.")
    line: dict[str, Any] = {"color": "#4c78a8"}
    if colour is not None:
        line = {"color": colour[1], "colorscale": LINE_SCALE, "showscale": True,
                "colorbar": {"title": {"text": colour[0], "side": "right"}, "thickness": 12}}
    fig.add_trace(go.Parcoords(name="runs", dimensions=dims, line=line, labelangle=-20, labelside="top"))
    return fig


def _note(fig: go.Figure, message: str) -> go.Figure:
    fig.add_annotation(text=message, showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5,
                       font=dict(size=14, color="#888"))
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return fig
