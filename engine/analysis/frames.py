"""The frames the charts of the dashboard and of the reports are drawn from, without Streamlit.

Run groups (which runs differ only by seed, and their legend labels, colours by
method), EMA smoothing and seed pooling of metric curves, and the memory frames. The
frames of one row per method at one step (the rank figure, step times) are
``engine.analysis.method_frames``. Everything takes and returns plain values and
pandas DataFrames.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np
import pandas as pd

from engine.analysis.charts import (
    group_color,
    method_colors,
    method_dash,
    method_key,
    seed_shade,
    setup_symbol,
)
from engine.analysis.summary import MIB
from engine.config import comparable_key, differing_fields, method_label, seed_group_key


def describe_runs(records: Sequence) -> pd.DataFrame:
    """One row per ``storage.RunRecord`` (ordered by id): run_id, name, status,
    estimator, rank, lam, seed, preset, steps, ``key`` (comparable config),
    ``group`` (seed group), ``group_id`` (smallest run id of its group),
    ``group_size``, ``method``, ``color`` and ``dash`` (the method's colour and line
    style, ``charts.method_colors`` of these runs/``method_dash``), ``setup`` (the trajectory and
    measurement fields that differ across the selection, e.g. ``lr=0.02``; empty when all
    share one setup) with its ``symbol`` (``charts.setup_symbol`` of the setup's place
    in sorted order), and ``seed_color``: the run's shade of its method colour by its
    place among its group's seeds (``charts.seed_shade``), for curves that are not pooled."""
    records = sorted(records, key=lambda r: r.id)
    columns = ["run_id", "name", "status", "estimator", "rank", "lam", "seed", "preset", "steps",
               "key", "group", "group_id", "group_size", "method", "color", "dash", "setup", "symbol", "seed_color",
               "sweep", "tags", "config"]
    if not records:
        return pd.DataFrame(columns=columns)
    differing = differing_fields([r.config for r in records])
    colors = method_colors((r.estimator, r.rank, r.lam) for r in records)
    rows = []
    for r in records:
        setup = ", ".join(f"{k}={r.config.get(k)}" for k in differing)
        rows.append({
            "run_id": r.id, "name": r.name, "status": r.status, "estimator": r.estimator,
            "rank": r.rank, "lam": r.lam, "seed": r.seed, "preset": r.preset, "steps": r.steps,
            "key": comparable_key(r.config), "group": seed_group_key(r.config),
            "method": method_label(r.estimator, r.rank, r.lam), "setup": setup,
            "color": colors[method_key(r.estimator, r.rank, r.lam)], "dash": method_dash(r.lam),
            "sweep": getattr(r, "sweep_id", None), "tags": list(getattr(r, "tags", None) or []), "config": dict(r.config),
        })
    info = pd.DataFrame(rows)
    info["group_id"] = info.groupby("group")["run_id"].transform("min")
    info["group_size"] = info.groupby("group")["run_id"].transform("size")
    info["rank"] = info["rank"].astype("Int64")
    setups = {setup: i for i, setup in enumerate(sorted(set(info["setup"])))}
    info["symbol"] = info["setup"].map(lambda v: setup_symbol(setups[v]))
    place = info.sort_values(["seed", "run_id"], na_position="last").groupby("group").cumcount()
    info["seed_color"] = [seed_shade(c, place[i]) for i, c in zip(info.index, info["color"])]
    return info[columns]


def common_seeds(records: Sequence) -> tuple[list, dict[str, list]]:
    """(the runs whose seed every method of their comparable config has, the seeds
    Table 3 can pair each method with exact on; per method label the seeds outside that
    set). Compare names the latter under its pooled curves, which average each method's own
    seeds. A setup whose methods share no seed keeps all its runs."""
    by_key: dict[str, dict[str, set]] = {}
    for r in records:
        by_key.setdefault(comparable_key(r.config), {}).setdefault(seed_group_key(r.config), set()).add(r.seed)
    common = {k: set.intersection(*groups.values()) for k, groups in by_key.items()}
    kept: list = []
    left_out: dict[str, set] = {}
    for r in records:
        key = comparable_key(r.config)
        if not common[key] or r.seed in common[key]:
            kept.append(r)
        else:
            left_out.setdefault(method_label(r.estimator, r.rank, r.lam), set()).add(r.seed)
    return kept, {label: sorted(seeds) for label, seeds in left_out.items()}


GROUP_BY_TAG, GROUP_BY_SWEEP = "tag", "sweep"


def group_choices(info: pd.DataFrame) -> list[str]:
    """What runs can be coloured or faceted by: ``tag``, ``sweep`` and every config field
    (those whose values differ among the runs first, then the rest, each sorted)."""
    fields = sorted({k for c in info["config"] for k in c})
    varying = [k for k in fields if len({_value_text(c.get(k)) for c in info["config"]}) > 1]
    return [GROUP_BY_TAG, GROUP_BY_SWEEP, *varying, *[k for k in fields if k not in varying]]


def _value_text(value) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in sorted(value.items())) or "{}"
    return "—" if value is None else str(value)


def group_values(info: pd.DataFrame, by: str) -> pd.Series:
    """Each run's value (text) of ``by``: a config field, ``tag`` (its tags joined, or
    ``no tag``) or ``sweep`` (its sweep id, or ``no sweep``); indexed like ``info``. An
    exact run's ``rank`` and ``lam`` are ``—``: they do not apply to it."""
    if by == GROUP_BY_TAG:
        return info["tags"].map(lambda ts: ", ".join(ts) if ts else "no tag")
    if by == GROUP_BY_SWEEP:
        return info["sweep"].map(lambda v: v or "no sweep")
    values = info["config"].map(lambda c: _value_text(c.get(by)))
    if by in ("rank", "lam"):  # exact backprop has neither (its stored config keeps the form's value)
        exact = info["config"].map(lambda c: c.get("estimator") == "exact" or c.get("sketched_layers") == "none")
        values = values.where(~exact, "—")
    return values


def _value_order(text: str):
    """Numbers in numeric order (rank 8 before 16), then other values, then ``—``."""
    try:
        return (0, float(text), "")
    except ValueError:
        return (2 if text == "—" else 1, 0.0, text)


def grouped(info: pd.DataFrame, by: str | None) -> pd.DataFrame:
    """``info`` coloured by ``by`` (see :func:`group_values`) instead of by method: each
    value its colour (``charts.group_color`` of its place in sorted order), seeds of a
    method pooled within a value only, and every label ending ``· by=value``. None: ``info``."""
    if not by:
        return info
    values = group_values(info, by)
    order = {v: i for i, v in enumerate(sorted(set(values), key=_value_order))}
    out = info.copy()
    out["group"] = out["group"] + "|" + values
    out["color"] = values.map(lambda v: group_color(order[v]))
    suffix = " · " + by + "=" + values
    out["method"] = out["method"] + suffix
    out["name"] = out["name"] + suffix
    out["setup"] = out["setup"].map(lambda t: ", ".join(p for p in t.split(", ") if p and not p.startswith(by + "=")))
    out["group_id"] = out.groupby("group")["run_id"].transform("min")
    out["group_size"] = out.groupby("group")["run_id"].transform("size")
    place = out.sort_values(["seed", "run_id"], na_position="last").groupby("group").cumcount()
    out["seed_color"] = [seed_shade(c, place[i]) for i, c in zip(out.index, out["color"])]
    return out


def facets(info: pd.DataFrame, by: str) -> dict[str, pd.DataFrame]:
    """``info`` split by the value of ``by``, one part per value in sorted order (the
    panels of a faceted chart, each titled ``by=value``; numbers in numeric order)."""
    values = group_values(info, by)
    return {f"{by}={v}": info[values == v] for v in sorted(set(values), key=_value_order)}


def trace_labels(info: pd.DataFrame, pool_seeds: bool, present=None) -> pd.Series:
    """Legend label per run (indexed by run_id): the run name, or for a pooled seed
    group ``method · mean of k/n seeds`` (shared by its runs: n seeds in the group, k
    of them with data, i.e. among the run ids ``present``; None: all; ``mean of n
    seeds`` when k = n), followed by ``(m still training, q queued)`` while some of
    its runs are running or queued: the mean at a step is over the seeds that reached
    it, so the tail of such a curve is the mean of fewer seeds (the hover says how many). With
    ``[setup]`` when the selection mixes setups. Labels that would still name two
    curves get ``#id`` (the run id, or the group's smallest run id when pooled)."""
    labels: dict[int, str] = {}
    owners: dict[str, set[tuple[str, Any]]] = {}  # label → the curves (a run or a pooled group) it names
    suffix: dict[int, int] = {}
    present = set(info["run_id"]) if present is None else {int(i) for i in present}
    for row in info.itertuples():
        pooled = pool_seeds and row.group_size > 1
        if pooled:
            runs = info[info["group"] == row.group]
            unit = "seeds" if runs["seed"].nunique() == row.group_size else "runs"
            have = int(runs["run_id"].isin(present).sum())
            going = ", ".join(f"{n} {word}" for n, word in ((int((runs["status"] == "running").sum()), "still training"),
                                                           (int((runs["status"] == "queued").sum()), "queued")) if n)
            base = (f"{row.method} · mean of {have if have == row.group_size else f'{have}/{row.group_size}'} {unit}"
                    + (f" ({going})" if going else ""))
        else:
            base = row.name
        label = f"{base} [{row.setup}]" if row.setup else base
        labels[row.run_id] = label
        curve = ("group", row.group) if pooled else ("run", row.run_id)
        owners.setdefault(label, set()).add(curve)
        suffix[row.run_id] = row.group_id if pooled else row.run_id
    return pd.Series(
        {rid: (f"{label} #{suffix[rid]}" if len(owners[label]) > 1 else label) for rid, label in labels.items()},
        dtype=object,
    )


SERIES_COLUMNS = ["trace", "color", "dash", "symbol", "x", "y", "lo", "hi", "n"]


def ema(values: Sequence[float], weight: float) -> np.ndarray:
    """Debiased exponential moving average (TensorBoard's smoothing):
    m_t = w·m_{t−1} + (1−w)·x_t, reported as m_t / (1 − w^t). ``weight`` 0 returns
    the values unchanged; NaNs are skipped (they stay NaN in the output)."""
    x = np.asarray(values, dtype=float)
    if not 0.0 <= weight < 1.0:
        raise ValueError(f"smoothing weight must be in [0, 1) (got {weight})")
    if weight == 0.0 or x.size == 0:
        return x.copy()
    out = np.full_like(x, np.nan)
    m, t = 0.0, 0
    for i, v in enumerate(x):
        if math.isfinite(v):
            t += 1
            m = weight * m + (1.0 - weight) * v
            out[i] = m / (1.0 - weight**t)
    return out


def thin(frame: pd.DataFrame, max_points: int) -> pd.DataFrame:
    """At most ``max_points`` rows, evenly spaced, first and last kept (for drawing only)."""
    if max_points < 2:
        raise ValueError(f"max_points must be >= 2 (got {max_points})")
    if len(frame) <= max_points:
        return frame
    idx = np.unique(np.linspace(0, len(frame) - 1, max_points).round().astype(int))
    return frame.iloc[idx]


def series(
    metrics: pd.DataFrame,
    info: pd.DataFrame,
    name: str,
    *,
    x: str = "step",
    smoothing: float = 0.0,
    pool_seeds: bool = True,
    max_points: int = 2000,
) -> pd.DataFrame:
    """The curves of metric ``name`` for the runs in ``info`` (see :func:`describe_runs`).

    Each run's values are ordered by step (the last value recorded at a step wins)
    and EMA-smoothed with ``smoothing``. With ``pool_seeds``, runs of one seed group
    (more than one run) become one curve, labelled ``mean of k/n seeds`` (k of its n
    seeds have a value of ``name``): at each step the mean over the runs that reached
    it, ``n`` the number of those runs and ``lo``/``hi`` = mean ∓ std (ddof 1) where
    n ≥ 2, else NaN (one seed has no spread: no band); single runs have ``lo``/``hi``
    NaN and n = 1. ``x`` is ``step`` or ``wall_time``
    (seconds; pooled: the mean wall time at that step). Returns columns
    ``SERIES_COLUMNS`` (``color``/``dash``: the method's, see :func:`describe_runs`),
    curves in :func:`method_order`, each by x, at most ``max_points`` points per curve.
    """
    if x not in ("step", "wall_time"):
        raise ValueError(f"x must be 'step' or 'wall_time' (got {x!r})")
    m = metrics[(metrics["name"] == name) & metrics["run_id"].isin(info["run_id"])]
    if m.empty:
        return pd.DataFrame(columns=SERIES_COLUMNS)
    m = m.sort_values("id").drop_duplicates(["run_id", "step"], keep="last").sort_values(["run_id", "step"])
    labels = trace_labels(info, pool_seeds, present=m["run_id"].unique())
    curves = _run_curves(m, info, labels, smoothing, pool_seeds)
    single, pooled = curves[~curves["pooled"]], curves[curves["pooled"]]
    out = [_single_points(single, x)] if len(single) else []
    if len(pooled):
        out.append(_pooled_points(pooled, x))
    result = pd.concat(out, ignore_index=True)
    result["order"] = result["trace"].map(method_order(info, labels))
    result = result.sort_values(["order", "x"], kind="stable")
    result = pd.concat([thin(t, max_points) for _, t in result.groupby("order", sort=True)])
    result["n"] = result["n"].astype("int64")
    return result[SERIES_COLUMNS].reset_index(drop=True)


def _run_curves(m: pd.DataFrame, info: pd.DataFrame, labels: pd.Series, smoothing: float,
                pool_seeds: bool) -> pd.DataFrame:
    """Each run's EMA-smoothed values of one metric ``m`` (by step) with its trace label, style
    and whether it is ``pooled`` into its seed group's curve."""
    by_run = info.set_index("run_id")
    parts = []
    for run_id, rows in m.groupby("run_id", sort=True):
        parts.append(pd.DataFrame({
            "run_id": run_id, "step": rows["step"].to_numpy(), "wall_time": rows["wall_time"].to_numpy(),
            "y": ema(rows["value"].to_numpy(), smoothing),
        }))
    curves = pd.concat(parts, ignore_index=True)
    curves["trace"] = curves["run_id"].map(labels)
    curves["pooled"] = pool_seeds & curves["run_id"].map(by_run["group_size"]).gt(1)
    curves["color"] = curves["run_id"].map(by_run["color"]).where(curves["pooled"], curves["run_id"].map(by_run["seed_color"]))
    curves["dash"] = curves["run_id"].map(by_run["dash"])
    curves["symbol"] = curves["run_id"].map(by_run["symbol"])
    return curves


def _single_points(single: pd.DataFrame, x: str) -> pd.DataFrame:
    """The points of runs drawn on their own: n = 1, no band."""
    return pd.DataFrame({
        "trace": single["trace"], "color": single["color"], "dash": single["dash"], "symbol": single["symbol"], "x": single[x],
        "y": single["y"], "lo": np.nan, "hi": np.nan, "n": 1,
    })


def _pooled_points(pooled: pd.DataFrame, x: str) -> pd.DataFrame:
    """A seed group's curve: at each step the mean over its runs there, the band mean ∓ std
    where n ≥ 2, and the mean wall time for ``x="wall_time"``."""
    g = pooled.groupby(["trace", "color", "dash", "symbol", "step"], sort=True)
    stats = g.agg(y=("y", "mean"), sd=("y", "std"), n=("y", "count"), wall_time=("wall_time", "mean")).reset_index()
    sd = stats["sd"].where(stats["n"] > 1)
    return pd.DataFrame({
        "trace": stats["trace"], "color": stats["color"], "dash": stats["dash"], "symbol": stats["symbol"],
        "x": stats["step"] if x == "step" else stats["wall_time"],
        "y": stats["y"], "lo": stats["y"] - sd, "hi": stats["y"] + sd, "n": stats["n"],
    })


def method_order(info: pd.DataFrame, labels: pd.Series) -> dict[str, int]:
    """Position of each trace label in legends and tables: by setup, exact first,
    then estimator, rank, λ, and the first run id."""
    rows = info.assign(label=info["run_id"].map(labels), sketched=info["estimator"] != "exact")
    rows = rows.sort_values(["setup", "sketched", "estimator", "rank", "lam", "run_id"], na_position="first", kind="stable")
    return {label: i for i, label in enumerate(dict.fromkeys(rows["label"]))}


def layer_names(metrics: pd.DataFrame, prefix: str = "cos/") -> list[str]:
    """The per-layer suffixes of metrics named ``prefix<layer>``, sorted."""
    names = metrics["name"].drop_duplicates()
    return sorted(n[len(prefix):] for n in names if n.startswith(prefix))



MEMORY_QUANTITIES = {
    "mem_saved_bytes": "Saved for backward",
    "mem_peak_bytes": "Peak device memory",
    "mem_temp_bytes": "XLA temp of the step",
}
MEMORY_COLUMNS = ["trace", "color", "quantity", "mib", "baseline_mib", "ratio"]


def memory_frame(summary: pd.DataFrame, info: pd.DataFrame, pool_seeds: bool = True) -> pd.DataFrame:
    """Memory of each run (or pooled seed group, averaged) against the exact baseline
    of its config, in MiB: saved-activation bytes against ``mem_saved_bytes_exact``;
    peak and XLA temp bytes against the exact run of the same comparable config and
    seed (NaN baseline when there is none). ``ratio`` = mib / baseline_mib (run ÷ exact).
    ``summary`` is ``engine.analysis.summary.summarize``; quantities no run recorded are left out."""
    if summary.empty:
        return pd.DataFrame(columns=MEMORY_COLUMNS)
    s = summary.merge(info[["run_id", "key", "color", "seed_color", "group", "group_size"]], on="run_id")
    s["color"] = s["color"].where(pool_seeds & s["group_size"].gt(1), s["seed_color"])
    recorded = [c for c in MEMORY_QUANTITIES if c in s]
    labels = trace_labels(info, pool_seeds, present=s.loc[s[recorded].notna().any(axis=1), "run_id"] if recorded else [])
    s["trace"] = s["run_id"].map(labels)
    exact = s[s["estimator"] == "exact"].drop_duplicates(["key", "seed"], keep="last").set_index(["key", "seed"])
    order = method_order(info, labels)
    rows = []
    for column, quantity in MEMORY_QUANTITIES.items():
        if column not in s or s[column].isna().all():
            continue
        if column == "mem_saved_bytes":
            baseline = s["mem_saved_bytes_exact"]
        else:
            baseline = pd.Series([exact[column].get((k, sd), np.nan) if column in exact else np.nan
                                  for k, sd in zip(s["key"], s["seed"])], index=s.index)
        part = pd.DataFrame({"trace": s["trace"], "color": s["color"], "run_id": s["run_id"],
                             "mib": s[column] / MIB, "baseline_mib": baseline / MIB})
        part = part.dropna(subset=["mib"])
        part = part.groupby(["trace", "color"], sort=False).agg(mib=("mib", "mean"), baseline_mib=("baseline_mib", "mean")).reset_index()
        part["quantity"] = quantity
        rows.append(part.sort_values("trace", key=lambda t: t.map(order), kind="stable"))
    if not rows:
        return pd.DataFrame(columns=MEMORY_COLUMNS)
    out = pd.concat(rows, ignore_index=True)
    out["ratio"] = out["mib"] / out["baseline_mib"]
    return out[MEMORY_COLUMNS]


BREAKDOWN_PREFIX = "mem_bytes/"
BREAKDOWN_EXACT_PREFIX = "mem_bytes_exact/"
BREAKDOWN_COLUMNS = ["bar", "color", "category", "mib"]


def breakdown_frame(metrics: pd.DataFrame, info: pd.DataFrame, pool_seeds: bool = True) -> pd.DataFrame:
    """Saved-for-backward bytes by category (``mem_bytes/<category>``) for every run
    that recorded them, each followed by its exact baseline
    (``mem_bytes_exact/<category>``, bar ``<label> · exact``), in MiB; the last value of
    each metric. Empty (columns ``BREAKDOWN_COLUMNS``) when no run has a breakdown."""
    m = metrics[metrics["name"].str.startswith((BREAKDOWN_PREFIX, BREAKDOWN_EXACT_PREFIX)) & metrics["run_id"].isin(info["run_id"])]
    if m.empty:
        return pd.DataFrame(columns=BREAKDOWN_COLUMNS)
    last = m.sort_values("id").drop_duplicates(["run_id", "name"], keep="last")
    labels = trace_labels(info, pool_seeds, present=last["run_id"].unique())
    by_run = info.set_index("run_id")
    colors = by_run["color"].where(pool_seeds & by_run["group_size"].gt(1), by_run["seed_color"])
    exact = last["name"].str.startswith(BREAKDOWN_EXACT_PREFIX)
    frame = pd.DataFrame({
        "run_id": last["run_id"].to_numpy(),
        "bar": [labels[r] + (" · exact" if e else "") for r, e in zip(last["run_id"], exact)],
        "color": last["run_id"].map(colors).to_numpy(),
        "category": [n.split("/", 1)[1] for n in last["name"]],
        "exact": exact.to_numpy(),
        "mib": last["value"].to_numpy() / MIB,
        "order": last["run_id"].map(labels).map(method_order(info, labels)).to_numpy(),
    })
    frame = frame.groupby(["bar", "color", "category", "exact"], sort=False).agg(mib=("mib", "mean"), order=("order", "min")).reset_index()
    frame = frame.sort_values(["order", "exact"], kind="stable")
    return frame[BREAKDOWN_COLUMNS].reset_index(drop=True)
