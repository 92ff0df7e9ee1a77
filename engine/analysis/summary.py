"""Run summaries and the paper's Table 3, comparing seeds at the same step only.

A run's value "at step S" is
* for the metrics recorded at evaluation boundaries (``EVAL_METRICS``: train and
  validation loss, tokens/s): the value recorded AT step S. A run without a
  validation loss at S has not reached S: it is missing there, never replaced by
  its last value;
* for the dW cosine (``cos_mean``, probed every probe interval): the last probe at
  or before S (runs of one config probe at the same steps);
* for the memory figures (``MEMORY_METRICS``, properties of the compiled step): the
  last value recorded.

``table3`` pools the seeds of each method (estimator, rank, λ) within a comparable
config group (``comparable_key``: the config less estimator, rank, λ, seed, name).
Every row of a group is read at one step S, chosen by ``engine.analysis.reads.read_group``
(``at_step`` when given, else the latest step every live run of the group has validated at;
failed and cancelled runs are out; step 0 reads "not trained yet"), and each row says where
and why (``read``). Δ vs exact is the paired difference over seeds,
d_s = val(method, s) − val(exact, s), over the seeds where both reached S;
``engine.core.stats.paired_delta`` gives its mean, std, 95 % interval (from the seeds and,
where the per-batch validation losses are stored, the validation batches), the 90 % interval
of its equivalence test (TOST) against ±δ (``margin``, default ``engine.core.stats.MARGIN``)
and the p-values behind the verdict: equivalent, better, worse, not equivalent or
inconclusive, read over the whole table at a 5 % family-wise error (Holm) unless asked not
to. A method that diverged in a seed where exact did not reads "diverged" unless its other
seeds already read it worse or not equivalent. Memory ratios are run ÷ exact everywhere.

The paper's own Table 3 (``PAPER_TABLE3``) is not a row of this table: it comes from
50,000 steps on FineWeb-edu, one run per method, and no run of the lab is comparable with
it; ``paper_note`` states it beside the table when the paper preset is shown.

Pure functions of run records and metric frames (as ``RunStore.list_runs`` and
``RunStore.metrics`` return them); ``engine.runner.queries`` reads them from a store.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from tabulate import tabulate

from engine.analysis.reads import LEFT_STATUSES, NOT_TRAINED, Read, diverged, read_group, read_text
from engine.config import comparable_key, differing_fields, seed_group_key
from engine.core.choices import SUMMARY_FORMATS
from engine.core.stats import (
    DECIDED,
    INCONCLUSIVE,
    MARGIN,
    NOT_EQUIVALENT,
    TESTS,
    WORSE,
    PairedDelta,
    check_margin,
    holm,
    paired_delta,
    verdict_from,
)

MIB = 2**20

# Table 3 of the paper: final validation loss after 50,000 steps on FineWeb-edu, one run per
# method (exact: None), at the paper preset.
PAPER_TABLE3 = {None: 6.616, 64: 6.573, 32: 6.575, 16: 6.675, 8: 6.762, 1: 7.221}
PAPER_SETTING = "50,000 steps on FineWeb-edu, one run per method"

EVAL_METRICS = ("train_loss", "val_loss", "tokens_per_s")
PROBE_METRICS = ("cos_mean",)
MEMORY_METRICS = ("mem_saved_bytes", "mem_saved_bytes_exact", "mem_saved_ratio", "mem_temp_bytes", "mem_peak_bytes")
SUMMARY_METRICS = (*EVAL_METRICS, *PROBE_METRICS, *MEMORY_METRICS)

# The leading columns are the CSV contract of ``python -m engine summary --format csv``.
TABLE3_COLUMNS = [
    "estimator", "rank", "lam", "seeds", "step", "val_loss_mean", "val_loss_std",
    "delta_val_mean", "delta_val_ci95_low", "delta_val_ci95_high", "verdict",
    "delta_val_std", "paired_seeds", "train_loss_mean", "train_loss_std", "cos_mean",
    "mem_saved_bytes_mean", "mem_saved_bytes_exact_mean", "mem_saved_ratio",
    "missing_seeds", "preset", "setup", "run_ids",
    "delta_val_ci90_low", "delta_val_ci90_high", "tost_p", "margin", "delta_val_by_seed", "duplicates",
    "diff_p", "noneq_p", "tost_p_holm", "diff_p_holm", "noneq_p_holm", "holm_tests", "delta_val_se_seed",
    "delta_val_se_batch", "val_batches", "delta_val_df", "diverged", "read", "read_whole",
]
REFERENCE, MISSING, DIVERGED = "reference", "missing", "diverged"
TEXT_FORMATS = tuple(f for f in SUMMARY_FORMATS if f != "csv")  # ``render``'s; CSV is an export


def _val_steps(metrics: pd.DataFrame) -> dict[int, set[int]]:
    val = metrics[metrics["name"] == "val_loss"]
    return {int(r): {int(s) for s in g} for r, g in val.groupby("run_id")["step"]}


def summarize(records, metrics: pd.DataFrame, at_step: int | None = None) -> pd.DataFrame:
    """One row per run record, its metrics at one step (module docstring): at
    ``at_step`` when given (``reached`` False and the step's metrics NaN for a run
    without a validation loss there), else at the run's last validation step.
    Columns: ``run_id, name, status, estimator, rank, lam, seed, preset, step``
    (nullable), ``reached, wall_s, config_key`` (``comparable_key`` of the config),
    the ``SUMMARY_METRICS``, and ``delta_val_vs_exact``: val loss minus that of the
    exact run of the same seed and comparable config AT THE SAME STEP (NaN when there
    is none). ``metrics`` has the columns of ``RunStore.metrics``; rows of other runs
    or names are ignored."""
    runs = {r.id: r for r in records}
    metrics = metrics[metrics["run_id"].isin(list(runs)) & metrics["name"].isin(SUMMARY_METRICS)].sort_values("id")
    val_steps = _val_steps(metrics)
    per_run = {int(k): g for k, g in metrics.groupby("run_id")}
    rows = []
    for run_id, r in runs.items():
        mine = per_run.get(run_id, metrics.iloc[:0])
        steps = val_steps.get(run_id, set())
        if at_step is None:
            step = max(steps) if steps else None
        else:
            step = int(at_step) if int(at_step) in steps else None
        row = {
            "run_id": run_id, "name": r.name, "status": r.status, "estimator": r.estimator,
            "rank": r.rank, "lam": r.lam, "seed": r.seed, "preset": r.preset,
            "step": step, "reached": step is not None,
            "wall_s": float(mine.loc[mine["step"] == step, "wall_time"].max()) if step is not None else np.nan,
            "config_key": comparable_key(r.config),
        }
        for m in SUMMARY_METRICS:
            if m in MEMORY_METRICS:
                values = mine.loc[mine["name"] == m, "value"]
            elif step is None:
                values = ()
            elif m in PROBE_METRICS:
                values = mine.loc[(mine["name"] == m) & (mine["step"] <= step), "value"]
            else:
                values = mine.loc[(mine["name"] == m) & (mine["step"] == step), "value"]
            row[m] = float(values.iloc[-1]) if len(values) else np.nan
        rows.append(row)
    columns = ["run_id", "name", "status", "estimator", "rank", "lam", "seed", "preset", "step", "reached",
               "wall_s", "config_key", *SUMMARY_METRICS]
    frame = pd.DataFrame(rows, columns=columns).astype({"step": "Int64", "reached": bool})
    exact = frame[(frame["estimator"] == "exact") & frame["reached"]].sort_values("run_id")
    exact = exact.drop_duplicates(["config_key", "seed", "step"], keep="last")
    exact = exact.set_index(["config_key", "seed", "step"])["val_loss"]
    frame["delta_val_vs_exact"] = [
        row.val_loss - exact.get((row.config_key, row.seed, row.step), np.nan) if row.reached else np.nan
        for row in frame.itertuples()
    ]
    return frame.sort_values("run_id").reset_index(drop=True)


def one_per_seed(records) -> tuple[list, dict[int, int]]:
    """(one run record per seed of each setup, in the order given; duplicate run id → the
    id of the run that stands for it). Runs are duplicates when they share a seed group
    (``seed_group_key``: the config less seed and bookkeeping such as steps and name) and
    a seed: the same experiment launched twice. The one that stands for them is the
    furthest trained (most steps done; of equals, the newest), so pooling counts each
    seed once and a shorter relaunch does not pull the common step down."""
    records = list(records)
    best: dict[tuple, Any] = {}
    for r in records:
        key = (seed_group_key(r.config), r.seed)
        if key not in best or (r.steps_done, r.id) > (best[key].steps_done, best[key].id):
            best[key] = r
    kept = {r.id for r in best.values()}
    duplicates = {r.id: best[(seed_group_key(r.config), r.seed)].id for r in records if r.id not in kept}
    return [r for r in records if r.id in kept], duplicates


def _setups(configs: dict[str, dict]) -> dict[str, str]:
    """``key=value`` of the config fields that differ between the groups ("" for one group)."""
    varying = differing_fields(configs.values())
    return {g: ", ".join(f"{k}={c.get(k)}" for k in varying) for g, c in configs.items()}


def paper_note(table: pd.DataFrame) -> str | None:
    """The paper's Table 3 as a labelled note, when ``table`` holds paper-preset rows
    (None otherwise): its setting, and why its numbers are not compared with the rows."""
    if table.empty or not (table["preset"] == "paper").any():
        return None
    values = "; ".join(("exact" if r is None else f"basis R={r}") + f" {v:.3f}"
                       for r, v in sorted(PAPER_TABLE3.items(), key=lambda kv: -1 if kv[0] is None else kv[0]))
    return (f"The paper's Table 3 ({PAPER_SETTING}), final validation loss: {values}. It is not compared with the "
            "rows above: other data, another length, and no seed spread to test against.")


def _by_seed_text(deltas: pd.Series) -> str:
    """``s0 +0.0012, s1 −0.0003``: each paired seed's Δ, by seed."""
    return ", ".join(f"s{int(s)} {v:+.4f}" for s, v in deltas.sort_index().items())


def _duplicates_text(duplicates: dict[int, int], kept: set[int]) -> str:
    """``25 (see 1), 26 (see 2)``: the duplicates that a run of ``kept`` stands for."""
    return ", ".join(f"{d} (see {k})" for d, k in sorted(duplicates.items()) if k in kept)


def duplicates_note(table: pd.DataFrame) -> str | None:
    """Which runs ``table3`` left out as duplicates (None: none), in one sentence."""
    if table.empty or "duplicates" not in table or not table["duplicates"].fillna("").astype(bool).any():
        return None
    listed = ", ".join(d for d in table["duplicates"].fillna("") if d)
    return (f"Left out as duplicates (the same setup and seed as a run that trained further, which stands for each): "
            f"runs {listed}.")


def _seeds_text(seeds) -> str:
    return ", ".join(str(s) for s in sorted(seeds))


def table3(records, metrics: pd.DataFrame, at_step: int | None = None, margin: float = MARGIN,
           batches: pd.DataFrame | None = None, adjust: bool = True) -> pd.DataFrame:
    """The paper's Table 3: one row per method (estimator, rank, λ) of each comparable
    config group, every row of a group read at the step ``engine.analysis.reads.read_group``
    chooses (never a verdict at step 0; failed and cancelled runs out), Δ judged against the
    equivalence margin ±``margin`` nats. ``batches`` (``RunStore.eval_losses``: run_id,
    step, losses) puts the validation batches' sampling error into Δ's interval
    (``engine.core.stats.paired_delta``); ``adjust`` reads the verdicts of the whole table
    at a 5 % family-wise error (``engine.core.stats.holm``). Columns ``TABLE3_COLUMNS``:

    * ``seeds``: seeds with a validation loss at ``step`` (the latest run of a seed
      counts once); ``missing_seeds``: the method's seeds that have not reached it;
    * ``val_loss_mean/std``, ``train_loss_mean/std`` over those seeds (std ddof=1,
      NaN for one seed), ``cos_mean`` their mean dW cosine;
    * ``delta_val_*``, ``verdict``, ``paired_seeds``: ``paired_delta`` of
      val(method, s) − val(exact, s) over the ``paired_seeds`` seeds both reached; the
      exact row has NaN deltas and verdict "reference", a row without seeds "missing", every
      row of a group read at step 0 "not trained yet"; ``delta_val_ci90_low/high``,
      ``tost_p``, ``diff_p``, ``noneq_p``, ``margin``: the tests against ±margin and 0, and
      ``*_holm`` their Holm-adjusted p-values (NaN unadjusted); ``holm_tests``: the family's
      size (0 unadjusted); ``delta_val_se_seed``, ``delta_val_se_batch``, ``val_batches``,
      ``delta_val_df``: the interval's two standard-error components, the validation batches
      behind the second (0: seed noise only) and its degrees of freedom; ``delta_val_by_seed``:
      each paired seed's Δ (``s0 +0.0012, s1 …``);
    * ``diverged``: the seeds where the method diverged and exact did not (``1 of 5 seeds
      (s3)``); such a method reads "diverged" unless its surviving seeds read it worse or not
      equivalent: never equivalent or better;
    * ``read``: the group's read (``engine.analysis.reads.read_text``): its step and why;
      ``read_whole``: whether nothing held it back or is missing from it (``Read.whole``);
    * ``mem_saved_bytes_mean``, ``mem_saved_bytes_exact_mean``, ``mem_saved_ratio``:
      saved-for-backward bytes and their ratio run ÷ exact (mean over seeds);
    * ``preset``, ``setup`` (the config fields in which the groups differ),
      ``run_ids`` (the runs counted), ``duplicates``: the runs left out as duplicates
      of a counted one (``one_per_seed``), ``25 (see 1), …``.

    Ordered by setup, exact first, then estimator, rank and λ."""
    margin = check_margin(margin)
    records, duplicates = one_per_seed(records)
    if not records:
        return pd.DataFrame(columns=TABLE3_COLUMNS)
    metrics = metrics[metrics["run_id"].isin([r.id for r in records])]
    val_steps = _val_steps(metrics)
    groups: dict[str, list] = {}
    for r in records:
        groups.setdefault(comparable_key(r.config), []).append(r)
    setups = _setups({k: rs[0].config for k, rs in groups.items()})
    losses = _batch_losses(batches)
    group_of = {r.id: key for key, members in groups.items() for r in members}
    parts = dict(list(metrics.groupby(metrics["run_id"].map(group_of), sort=False)))  # each group reads its own rows
    rows = []
    for key, members in groups.items():
        read = read_group(members, val_steps, at_step)
        rows += _group_rows(members, parts.get(key, metrics.iloc[:0]), read, setups[key], duplicates, margin, losses)
    out = pd.DataFrame(rows, columns=TABLE3_COLUMNS)
    out = out.astype({"rank": "Int64", "step": "Int64", "seeds": "int64", "paired_seeds": "int64",
                      "val_batches": "int64", "holm_tests": "int64"})
    out = holm_verdicts(out, adjust)
    out["_not_exact"] = (out["estimator"] != "exact").astype(int)
    out = out.sort_values(["setup", "_not_exact", "estimator", "rank", "lam"], kind="stable", na_position="first")
    return out.drop(columns="_not_exact").reset_index(drop=True)


def _batch_losses(batches: pd.DataFrame | None) -> dict[tuple[int, int], np.ndarray]:
    """(run id, step) → that validation's per-batch losses."""
    if batches is None or batches.empty:
        return {}
    return {(int(r), int(s)): np.asarray(v, dtype=float) for r, s, v in zip(batches["run_id"], batches["step"],
                                                                             batches["losses"])}


def _pair_batches(pairs: pd.DataFrame, step, losses: dict) -> np.ndarray | None:
    """The S × B per-batch differences of the paired runs ``pairs`` (columns run_id and
    exact_id, one row per seed) at ``step``; None unless every run has its B losses there."""
    rows = []
    for mine, exact in zip(pairs["run_id"], pairs["exact_id"]):
        a, b = losses.get((int(mine), int(step))), losses.get((int(exact), int(step)))
        if a is None or b is None or a.shape != b.shape or not np.isfinite(a - b).all():
            return None
        rows.append(a - b)
    return np.stack(rows) if rows and len({len(r) for r in rows}) == 1 else None


def _diverged_text(method_runs: pd.DataFrame, lost: set, exact_lost: set) -> str:
    """``2 of 5 seeds (s1, s3)``: the seeds of ``method_runs`` that diverged where exact did not ("" for none)."""
    seeds = sorted({int(s) for s in method_runs["seed"].dropna()})
    bad = [s for s in seeds if s in lost and s not in exact_lost]
    return f"{len(bad)} of {len(seeds)} seeds ({', '.join(f's{s}' for s in bad)})" if bad else ""


def _counted(word: str, diverged_seeds: str) -> str:
    """``word`` with divergence counted against the method: a method that diverged where exact did
    not reads "diverged" unless its other seeds already read it worse or not equivalent."""
    return DIVERGED if diverged_seeds and word not in (WORSE, NOT_EQUIVALENT) else word


def _delta(method: str, done: pd.DataFrame, exact: pd.DataFrame, read: Read, margin: float,
           losses: dict) -> tuple[PairedDelta, pd.Series]:
    """The paired Δ of one method's ``done`` runs against the ``exact`` runs (by seed), and Δ by seed."""
    if not read.trained and read.step is not None:
        return paired_delta([], margin)._replace(verdict=REFERENCE if method == "exact" else NOT_TRAINED), \
            pd.Series(dtype=float)
    if done.empty:
        return paired_delta([], margin)._replace(verdict=MISSING), pd.Series(dtype=float)
    if method == "exact":
        return paired_delta([], margin)._replace(verdict=REFERENCE), pd.Series(dtype=float)
    pairs = done.set_index("seed")[["val_loss", "run_id"]].join(exact.rename(columns={
        "val_loss": "exact_val", "run_id": "exact_id"}), how="inner").dropna()
    deltas = pairs["val_loss"] - pairs["exact_val"]
    return paired_delta(deltas, margin, batches=_pair_batches(pairs, read.step, losses)), deltas


def _group_rows(members: list, metrics: pd.DataFrame, read: Read, setup: str, duplicates: dict[int, int],
                margin: float, losses: dict) -> list[dict[str, Any]]:
    """The Table 3 rows of one comparable group ``members``, each method read at ``read.step``
    (None: no live run of the group has validated; read at step -1, which none has reached)."""
    s = summarize(members, metrics, at_step=read.step if read.step is not None else -1)
    s["saved_ratio"] = s["mem_saved_bytes"] / s["mem_saved_bytes_exact"]
    s["method"] = [(e, None if pd.isna(r) else int(r), None if pd.isna(lam) else float(lam))
                   for e, r, lam in zip(s["estimator"], s["rank"], s["lam"])]
    lost = {r.id for r in members if diverged(r)}
    live = s["reached"] & ~s["status"].isin(LEFT_STATUSES)
    reached = s[live].sort_values("run_id").drop_duplicates(["method", "seed"], keep="last")
    exact = reached[reached["estimator"] == "exact"].drop_duplicates("seed", keep="last").set_index("seed")
    exact_lost = {int(x) for x in s.loc[(s["estimator"] == "exact") & s["run_id"].isin(lost), "seed"]}
    rows = []
    for (estimator, rank, lam), method in s.groupby("method", sort=False):
        done = reached[reached["method"] == (estimator, rank, lam)]
        delta, deltas = _delta(estimator, done, exact[["val_loss", "run_id"]], read, margin, losses)
        diverged_text = _diverged_text(method, {int(x) for x in method.loc[method["run_id"].isin(lost), "seed"]},
                                       exact_lost)
        rows.append({
            "estimator": estimator, "rank": rank, "lam": np.nan if lam is None else lam, "seeds": len(done),
            "step": read.step, "val_loss_mean": done["val_loss"].mean(), "val_loss_std": done["val_loss"].std(ddof=1),
            **_delta_columns(delta, deltas), "diverged": diverged_text,
            "verdict": _counted(delta.verdict, diverged_text),
            "train_loss_mean": done["train_loss"].mean(), "train_loss_std": done["train_loss"].std(ddof=1),
            "cos_mean": done["cos_mean"].mean(),
            "mem_saved_bytes_mean": done["mem_saved_bytes"].mean(),
            "mem_saved_bytes_exact_mean": done["mem_saved_bytes_exact"].mean(),
            "mem_saved_ratio": done["saved_ratio"].mean(),
            "missing_seeds": _seeds_text(set(method["seed"].dropna()) - set(done["seed"])),
            "preset": members[0].preset, "setup": setup,
            "run_ids": ", ".join(str(i) for i in sorted(done["run_id"])),
            "duplicates": _duplicates_text(duplicates, set(method["run_id"])), "read": read_text(read),
            "read_whole": read.whole,
        })
    return rows


def _delta_columns(delta: PairedDelta, deltas: pd.Series) -> dict[str, Any]:
    return {
        "delta_val_mean": delta.mean, "delta_val_ci95_low": delta.ci_low, "delta_val_ci95_high": delta.ci_high,
        "verdict": delta.verdict, "delta_val_std": delta.std, "paired_seeds": delta.n,
        "delta_val_ci90_low": delta.ci90_low, "delta_val_ci90_high": delta.ci90_high,
        "tost_p": delta.tost_p, "margin": delta.margin, "delta_val_by_seed": _by_seed_text(deltas),
        "diff_p": delta.diff_p, "noneq_p": delta.noneq_p, "delta_val_se_seed": delta.se_seed,
        "delta_val_se_batch": delta.se_batch, "val_batches": delta.batches, "delta_val_df": delta.df,
        "holm_tests": 0, **{f"{t}_holm": np.nan for t in TESTS},
    }


def holm_verdicts(table: pd.DataFrame, adjust: bool) -> pd.DataFrame:
    """With ``adjust``, the verdicts of the rows with a test read from Holm-adjusted p-values over
    every test of the table (``engine.core.stats.holm``); a diverged method stays "diverged"."""
    tested = table["verdict"].isin([*DECIDED, INCONCLUSIVE, DIVERGED]) & table["tost_p"].notna()
    if not adjust or not tested.any():
        return table
    table = table.copy()
    family = table.loc[tested, list(TESTS)]
    adjusted = holm(family.to_numpy().ravel()).reshape(family.shape)
    for j, name in enumerate(TESTS):
        table.loc[tested, f"{name}_holm"] = adjusted[:, j]
    table.loc[tested, "holm_tests"] = int(np.isfinite(family.to_numpy()).sum())
    for i in table.index[tested]:
        row = table.loc[i]
        word = verdict_from(row["delta_val_mean"], *(row[f"{t}_holm"] for t in TESTS))
        table.at[i, "verdict"] = _counted(word, row["diverged"])
    return table


# ----------------------------------------------------------------------------- rendering

def _num(value, spec: str) -> str:
    return "—" if value is None or pd.isna(value) else format(value, spec)


def _ci90_heading(table: pd.DataFrame) -> str:
    margins = sorted({float(m) for m in table["margin"].dropna()})
    return "90% CI" + (f" vs ±{margins[0]:g}" if len(margins) == 1 else "")


def display_frame(table: pd.DataFrame) -> pd.DataFrame:
    """``table3`` as text for people: ``mean ± std``, the interval as ``[low, high]``,
    ``—`` for what is unknown; ``setup`` (first, so a row says which setup it is) only
    when the groups differ. The equivalence interval is headed by its margin."""
    t = table
    out = pd.DataFrame({
        "setup": t["setup"],
        "method": t["estimator"],
        "rank": [_num(r, "d") for r in t["rank"]],
        "λ": ["—" if e == "exact" else _num(v, "g") for e, v in zip(t["estimator"], t["lam"])],  # exact shrinks nothing
        "seeds": t["seeds"],
        "step": [_num(v, "d") for v in t["step"]],
        "val loss": [_num(m, ".4f") + ("" if pd.isna(sd) else f" ± {sd:.4f}") for m, sd in zip(t["val_loss_mean"], t["val_loss_std"])],
        "Δ val vs exact": [_num(m, "+.4f") for m in t["delta_val_mean"]],
        "verdict": t["verdict"],
        "95% CI": ["—" if pd.isna(lo) else f"[{lo:+.4f}, {hi:+.4f}]" for lo, hi in zip(t["delta_val_ci95_low"], t["delta_val_ci95_high"])],
        _ci90_heading(t): ["—" if pd.isna(lo) else f"[{lo:+.4f}, {hi:+.4f}]"
                           for lo, hi in zip(t["delta_val_ci90_low"], t["delta_val_ci90_high"])],
        "SE seeds / val": ["—" if pd.isna(a) else f"{a:.4f} / " + ("—" if pd.isna(n) or not n else _num(b, ".4f"))
                           for a, b, n in zip(t["delta_val_se_seed"], t["delta_val_se_batch"], t["val_batches"])],
        "diverged": [v or "—" for v in t["diverged"].fillna("")] if "diverged" in t else "—",
        "Δ per seed": [v or "—" for v in t["delta_val_by_seed"]],
        "train loss": [_num(m, ".4f") + ("" if pd.isna(sd) else f" ± {sd:.4f}") for m, sd in zip(t["train_loss_mean"], t["train_loss_std"])],
        "cos": [_num(c, ".3f") for c in t["cos_mean"]],
        "saved MiB": [_num(b / MIB if pd.notna(b) else b, ".3f") for b in t["mem_saved_bytes_mean"]],
        "saved ÷ exact": [_num(r, ".4f") for r in t["mem_saved_ratio"]],
        "missing seeds": [m or "—" for m in t["missing_seeds"]],
    })
    if (t["setup"] == "").all():
        out = out.drop(columns="setup")
    if "diverged" not in t or not t["diverged"].fillna("").astype(bool).any():
        out = out.drop(columns="diverged")
    return out


def read_notes(table: pd.DataFrame, whole: bool | None = None) -> list[str]:
    """Where each setup of ``table3`` was read and why (``read``), one sentence a setup; with
    ``whole`` True / False, only the setups whose read is / is not whole (``read_whole``)."""
    if table.empty or "read" not in table:
        return []
    reads = table.drop_duplicates("setup")
    if whole is not None:
        reads = reads[reads["read_whole"].fillna(False).astype(bool) == whole]
    return [(f"[{setup}] " if setup else "") + text for setup, text in zip(reads["setup"], reads["read"]) if text]


def holm_note(table: pd.DataFrame) -> str | None:
    """How the verdicts of ``table3`` were read: over the table at a family-wise 5 % (Holm),
    or each row at its own level when some row has a test and none was adjusted."""
    tests = int(table["holm_tests"].max()) if len(table) and "holm_tests" in table else 0
    if tests:
        return (f"The verdicts hold at 5 % for the whole table: Holm's adjustment over its {tests} tests (each row's "
                "TOST, difference and non-equivalence tests), so a row whose 90 % interval lies inside ±δ can still "
                "read inconclusive; --no-adjust reads each row at its own 5 % level.")
    if len(table) and table["tost_p"].notna().sum() > 1:
        return "Each row's verdict is read at its own 5 % level (not adjusted for the table's several rows)."
    return None


def noise_note(table: pd.DataFrame) -> str | None:
    """What Δ's interval holds: seed noise and, where per-batch losses were stored, the
    validation batches' sampling error (``SE seeds / val``)."""
    tested = table[table["delta_val_se_seed"].notna()] if len(table) and "delta_val_se_seed" in table else table
    if tested.empty:
        return None
    seeds_only = tested[tested["val_batches"] == 0]
    text = ("Δ's intervals hold two sources of noise, the seeds and the validation set's own batches (column "
            "'SE seeds / val': the two standard errors; t on Satterthwaite's degrees of freedom)")
    if len(seeds_only):
        text += ("; rows with '—' for val have no per-batch validation losses stored (runs of an older version): "
                 "their interval holds the seed noise alone")
    return text + "."


def notes(table: pd.DataFrame) -> list[str]:
    """Every note printed under ``table3`` on every surface (summary, report, Compare)."""
    found = [*read_notes(table), holm_note(table), noise_note(table), duplicates_note(table), paper_note(table)]
    return [n for n in found if n]


def render(table: pd.DataFrame, fmt: str = "table") -> str:
    """``table3`` as text for people: ``table`` (aligned plain text), ``markdown`` or
    ``latex`` (``TEXT_FORMATS``), followed by its ``notes``."""
    if fmt not in TEXT_FORMATS:
        raise ValueError(f"unknown summary format {fmt!r}; use one of {', '.join(TEXT_FORMATS)}")
    if table.empty:
        return "no runs to summarise\n"
    shown = display_frame(table)
    said = notes(table)
    if fmt == "table":
        return shown.to_string(index=False) + "\n" + "".join(f"\nNote: {n}" for n in said) + ("\n" if said else "")
    if fmt == "markdown":
        # tabulate itself: pandas' to_markdown asks for tabulate >= 0.9
        text = tabulate(shown.astype(str).values.tolist(), headers=list(shown.columns), tablefmt="pipe",
                        disable_numparse=True) + "\n"
        return text + "".join(f"\n*Note: {n}*\n" for n in said)
    styler = shown.style.hide(axis="index").format(escape="latex").format_index(escape="latex", axis=1)
    return styler.to_latex(hrules=True, column_format="l" * shown.shape[1]) + "".join(f"% Note: {n}\n" for n in said)
