"""Run summaries: final metrics per run and the paper's Table 3 across seeds."""

from __future__ import annotations

import numpy as np
import pandas as pd

from storage import RunStore

MIB = 2**20

# Table 3 of the paper: final validation loss after 50,000 steps at the paper preset.
PAPER_TABLE3 = {None: 6.616, 64: 6.573, 32: 6.575, 16: 6.675, 8: 6.762, 1: 7.221}

SUMMARY_METRICS = (
    "train_loss", "val_loss", "cos_mean", "tokens_per_s",
    "mem_saved_bytes", "mem_saved_bytes_exact", "mem_saved_ratio", "mem_temp_bytes", "mem_peak_bytes",
)
_MATCH_IGNORES = ("estimator", "rank", "lam", "name", "seed")


def comparable_key(config: dict) -> str:
    """What two runs must share to be compared: the config less estimator, rank, λ, seed, name."""
    return repr(sorted((k, repr(v)) for k, v in config.items() if k not in _MATCH_IGNORES))


def run_summary(store: RunStore, run_ids, at_step: int | None = None) -> pd.DataFrame:
    """``summarize`` of the given runs, read from ``store``."""
    wanted = {int(i) for i in run_ids}
    records = [r for r in store.list_runs() if r.id in wanted]
    return summarize(records, store.metrics(sorted(wanted), names=list(SUMMARY_METRICS)), at_step)


def summarize(records, metrics: pd.DataFrame, at_step: int | None = None) -> pd.DataFrame:
    """One row per run record: the last value of each summary metric at a step
    ≤ ``at_step`` (default: the end), the step reached, ``config_key``
    (``comparable_key`` of its config) and Δ val loss to the exact run of the same
    seed and comparable config (NaN when there is none). ``metrics`` has the columns
    of ``RunStore.metrics``; rows of other runs or names are ignored."""
    runs = {r.id: r for r in records}
    metrics = metrics[metrics["run_id"].isin(list(runs)) & metrics["name"].isin(SUMMARY_METRICS)]
    if at_step is not None:
        metrics = metrics[metrics["step"] <= at_step]
    last = metrics.sort_values("id").groupby(["run_id", "name"])["value"].last().unstack()
    reached = metrics.groupby("run_id").agg(step=("step", "max"), wall_s=("wall_time", "max"))
    rows = []
    for run_id, r in runs.items():
        row = {
            "run_id": run_id, "name": r.name, "status": r.status, "estimator": r.estimator,
            "rank": r.rank, "lam": r.lam, "seed": r.seed, "preset": r.preset,
            "step": int(reached.at[run_id, "step"]) if run_id in reached.index else 0,
            "wall_s": float(reached.at[run_id, "wall_s"]) if run_id in reached.index else np.nan,
            "config_key": comparable_key(r.config),
        }
        for m in SUMMARY_METRICS:
            row[m] = last.at[run_id, m] if run_id in last.index and m in last.columns else np.nan
        rows.append(row)
    columns = ["run_id", "name", "status", "estimator", "rank", "lam", "seed", "preset", "step", "wall_s", "config_key", *SUMMARY_METRICS]
    frame = pd.DataFrame(rows, columns=columns)
    exact = frame[frame["estimator"] == "exact"].set_index(["config_key", "seed"])["val_loss"]
    exact = exact[~exact.index.duplicated(keep="last")]
    frame["delta_val_vs_exact"] = [
        row.val_loss - exact.get((row.config_key, row.seed), np.nan) for row in frame.itertuples()
    ]
    return frame.sort_values("run_id").reset_index(drop=True)


def table3(summary: pd.DataFrame) -> pd.DataFrame:
    """The paper's Table 3 form, seeds pooled within a comparable config: method,
    rank, λ, memory compression (measured: exact saved bytes / saved bytes), final
    train and validation loss and Δ to exact as mean ± std over seeds, and the
    paper's value at the paper preset."""
    if summary.empty:
        return pd.DataFrame()
    summary = summary.assign(
        rank=summary["rank"].astype("Int64"),
        compression=summary["mem_saved_bytes_exact"] / summary["mem_saved_bytes"],
    )
    groups = summary.groupby(
        ["config_key", "preset", "estimator", "rank", "lam"], dropna=False, sort=True
    )
    out = groups.agg(
        seeds=("seed", "nunique"),
        step=("step", "min"),
        compression=("compression", "mean"),
        train_loss=("train_loss", "mean"),
        train_loss_std=("train_loss", "std"),
        val_loss=("val_loss", "mean"),
        val_loss_std=("val_loss", "std"),
        delta_vs_exact=("delta_val_vs_exact", "mean"),
        delta_vs_exact_std=("delta_val_vs_exact", "std"),
    ).reset_index()
    out["paper_val_loss"] = [
        PAPER_TABLE3.get(None if e == "exact" else (int(r) if pd.notna(r) else None), np.nan)
        if p == "paper" and e in ("exact", "basis") else np.nan
        for p, e, r in zip(out["preset"], out["estimator"], out["rank"])
    ]
    return out
