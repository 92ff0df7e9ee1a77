"""The frames with one row per method (a row of ``engine.analysis.summary.table3``) at one
step, without Streamlit: the paper's central figure as numbers (a quantity against the
rank R, ``rank_frame``), the train-step time per method in the same rows
(``step_time_frame``), and each counted run's own step times (``run_time_frame``, which
claim (e) reads). Everything takes and returns plain values and pandas DataFrames.
"""

from __future__ import annotations

import os

import numpy as np
import pandas as pd

from engine.analysis.charts import SETUP_DASHES, method_colors, method_dash, method_key, setup_symbol
from engine.analysis.overlap import shared_runs
from engine.analysis.summary import MIB, summarize, table3
from engine.config import stored
from engine.core.estimators import is_exact

RANK_QUANTITIES = {  # column of ``engine.analysis.summary.summarize`` → (name, axis title, divisor to the shown unit)
    "val_loss": ("validation loss", "validation loss (nats/token)", 1.0),
    "cos_mean": ("mean cosine", "mean cosine of sketched dW to exact dW", 1.0),
    "mem_saved_bytes": ("saved bytes", "saved for backward (MiB)", float(MIB)),
}
RANK_COLUMNS = ["trace", "color", "line_color", "dash", "symbol", "setup", "estimator", "rank", "lam", "step", "seeds", "mean",
                "std"]


def rank_frame(records, metrics: pd.DataFrame, quantity: str = "val_loss", at_step: int | None = None, *,
               table: pd.DataFrame | None = None) -> pd.DataFrame:
    """The paper's central figure as numbers: ``quantity`` (a key of ``RANK_QUANTITIES``)
    against the rank R, one row per Table 3 row with seeds at its step.

    The rows, their step and the runs they count are those of
    ``engine.analysis.summary.table3(records, metrics, at_step)`` (every row of a comparable
    config group read at one step: ``at_step``, or the group's latest common step).
    ``mean`` and ``std`` (ddof 1; NaN for one seed) are over the counted runs' values
    from ``summarize(records, metrics, step)`` at that step, in the shown unit (bytes
    in MiB); runs without a value are left out of both and of ``seeds``. ``trace``
    names a line: the estimator, ``λ=…`` when λ > 0, ``[setup]`` when the groups
    differ (``exact`` rows have no rank: the figure draws them as a band). ``color`` is
    the method's colour (``charts.method_colors`` of ``records``, as on the curves),
    ``line_color`` that of the line's largest R, ``dash`` its line style (for ``exact``: its setup's,
    ``charts.SETUP_DASHES``, so two setups' reference lines differ), ``symbol`` its
    setup's marker (``charts.setup_symbol``). ``table``: that Table 3 when the caller has it
    already (see :func:`_per_method`)."""
    if quantity not in RANK_QUANTITIES:
        raise ValueError(f"unknown quantity {quantity!r}; use one of {', '.join(RANK_QUANTITIES)}")
    records = list(records)
    divisor = RANK_QUANTITIES[quantity][2]
    at: dict[int, pd.Series] = {}

    def values(step: int) -> pd.Series:
        if step not in at:
            at[step] = summarize(records, metrics, at_step=step).set_index("run_id")[quantity] / divisor
        return at[step]

    return _per_method(records, metrics, at_step, values, table)


def step_time_frame(records, metrics: pd.DataFrame, at_step: int | None = None, *,
                    table: pd.DataFrame | None = None) -> pd.DataFrame:
    """Milliseconds per train step of each method, in the rows of :func:`rank_frame`
    (``RANK_COLUMNS``, the runs Table 3 counts at its step): per run
    1000 · B·T / median(tokens/s) over its evaluation windows up to that step (each
    window's tokens/s times only the train steps: no validation, probe or checkpoint),
    then ``mean`` and ``std`` over the runs. A run whose stored config names no B·T is
    left out. ``table``: that Table 3 when the caller has it already (see :func:`_per_method`)."""
    records = list(records)
    rows = {}
    for r in records:
        config = stored(r.config)
        if config is not None:
            rows[r.id] = config.rows
    tps = metrics[(metrics["name"] == "tokens_per_s") & metrics["run_id"].isin(list(rows))]
    tps = tps.sort_values("id").drop_duplicates(["run_id", "step"], keep="last")

    def values(step: int) -> pd.Series:
        upto = tps[(tps["step"] <= step) & (tps["value"] > 0)]
        median = upto.groupby("run_id")["value"].median()
        return pd.Series({rid: 1000.0 * rows[rid] / v for rid, v in median.items()}, dtype=float)

    return _per_method(records, metrics, at_step, values, table)


RUN_TIME_COLUMNS = ["run_id", "estimator", "rank", "lam", "setup", "seed", "windows", "ms", "ms_low", "ms_high",
                    "shared", "load", "cores"]
LOAD_METRIC = "sys/load1"  # the host's 1-minute load, ``engine.training.system`` (the analysis imports no training)
CORES_METRIC = "sys/cores"  # the host's logical CPUs, recorded beside it


def run_time_frame(records, metrics: pd.DataFrame, at_step: int | None = None, *, others=(),
                   cores: int | None = None) -> pd.DataFrame:
    """Each run's own train-step times, for the runs Table 3 counts at its step
    (``RUN_TIME_COLUMNS``): over its evaluation windows up to that step, each window's
    1000 · B·T / tokens/s (train steps only), their count, median ``ms`` and range
    ``ms_low``–``ms_high``; ``shared`` when it trained at the same time as another run of
    ``records`` or of ``others`` (every stored run, of any selection) on the same machine
    (``shared_runs``); ``load`` the median of the host load it recorded (``LOAD_METRIC``)
    at the steps its windows end at (NaN: none recorded), the load its median step time was
    measured under; ``cores`` the host's cores to read that load against: the count the run
    recorded (``CORES_METRIC``), else ``cores`` when given, else the cores of the machine
    reading them (``os.cpu_count()``; runs of versions before 5 record none)."""
    records = list(records)
    rows_of = {r.id: config.rows for r in records if (config := stored(r.config)) is not None}
    tps = metrics[(metrics["name"] == "tokens_per_s") & metrics["run_id"].isin(list(rows_of)) & (metrics["value"] > 0)]
    tps = tps.sort_values("id").drop_duplicates(["run_id", "step"], keep="last")
    loads = metrics[(metrics["name"] == LOAD_METRIC) & metrics["run_id"].isin(list(rows_of))]
    counted = metrics[(metrics["name"] == CORES_METRIC)].groupby("run_id")["value"].max()
    cores = int(cores or os.cpu_count() or 1)
    shared = shared_runs(records, others)
    by_id = {r.id: r for r in records}
    table = table3(records, metrics, at_step)
    out = []
    for row in table[table["seeds"] > 0].itertuples():
        for run_id in (int(i) for i in str(row.run_ids).split(", ")):
            if run_id not in rows_of:
                continue
            windows = tps[(tps["run_id"] == run_id) & (tps["step"] <= int(row.step))]
            if windows.empty:
                continue
            ms = 1000.0 * rows_of[run_id] / windows["value"]
            load = loads.loc[(loads["run_id"] == run_id) & loads["step"].isin(windows["step"]), "value"].median()
            out.append({"run_id": run_id, "estimator": row.estimator, "rank": row.rank, "lam": row.lam,
                        "setup": row.setup, "seed": by_id[run_id].seed, "windows": len(ms), "ms": float(ms.median()),
                        "ms_low": float(ms.min()), "ms_high": float(ms.max()), "shared": run_id in shared,
                        "load": float(load), "cores": int(counted.get(run_id, cores))})
    return pd.DataFrame(out, columns=RUN_TIME_COLUMNS).astype({"rank": "Int64", "windows": "int64", "shared": bool,
                                                                "load": float, "cores": "Int64"})


def _per_method(records: list, metrics: pd.DataFrame, at_step: int | None, values,
                table: pd.DataFrame | None = None) -> pd.DataFrame:
    """One ``RANK_COLUMNS`` row per Table 3 row with seeds: ``values(step)`` (a Series by
    run id) over the runs the row counts, their mean and std (see :func:`rank_frame`).
    The rows are those of ``table`` when given, else of ``table3(records, metrics,
    at_step)``: a Table 3 of the same runs at the same ``at_step``, with any margin,
    batches or adjustment (they change its verdicts and intervals, not its rows, steps
    or the runs they count)."""
    table = table3(records, metrics, at_step) if table is None else table
    table = table[table["seeds"] > 0]
    setups = {setup: i for i, setup in enumerate(sorted(set(table["setup"])))}
    colors = method_colors((r.estimator, r.rank, r.lam) for r in records)
    rows = []
    for row in table.itertuples():
        step = int(row.step)
        ids = [int(i) for i in str(row.run_ids).split(", ")]
        found = values(step).reindex(ids).dropna()
        if found.empty:
            continue
        exact = is_exact(row.estimator)
        if not exact and pd.isna(row.rank):
            continue  # a sketched run stored without a rank has no place on the R axis
        lam = None if pd.isna(row.lam) else float(row.lam)
        name = "exact" if exact else row.estimator + (f" λ={lam:g}" if lam else "")
        rows.append({
            "trace": f"{name} [{row.setup}]" if row.setup else name,
            "color": colors[method_key(row.estimator, None if exact else row.rank, lam)],
            "dash": SETUP_DASHES[setups[row.setup] % len(SETUP_DASHES)] if exact else method_dash(lam),
            "symbol": setup_symbol(setups[row.setup]), "setup": row.setup, "estimator": row.estimator,
            "rank": pd.NA if exact else int(row.rank), "lam": np.nan if lam is None else lam, "step": step,
            "seeds": len(found), "mean": float(found.mean()), "std": float(found.std(ddof=1)) if len(found) > 1 else np.nan,
        })
    out = pd.DataFrame(rows, columns=[c for c in RANK_COLUMNS if c != "line_color"])
    top = out.sort_values("rank", na_position="first").groupby("trace")["color"].last()  # each line: its largest R's
    out.insert(2, "line_color", out["trace"].map(top))
    return out.astype({"rank": "Int64", "step": "int64", "seeds": "int64"})
