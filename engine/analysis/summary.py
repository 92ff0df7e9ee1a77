"""Run summaries and the paper's Table 3, comparing seeds at the same step only.

A run's value "at step S" is
* for the metrics recorded at evaluation boundaries (``EVAL_METRICS``: train, validation
  and test loss, tokens/s): the value recorded AT step S. A run without a
  validation loss at S has not reached S: it is missing there, never replaced by
  its last value;
* for the dW cosine (``cos_mean``, probed every probe interval): the last probe at
  or before S (runs of one config probe at the same steps);
* for the memory figures (``MEMORY_METRICS``, properties of the compiled step): the
  last value recorded.

``table3`` pools the seeds of each method (estimator, rank, λ) within a comparable
config group (``comparable_key``: the config less estimator, rank, λ, seed, name, and the
``free`` fields such as a tuned lr, which belong to the method).
Every row of a group is read at one step S, chosen by ``engine.analysis.reads.read_group``
(``at_step`` when given, else the latest step every live run of the group has validated at;
failed and cancelled runs are out; step 0 reads "not trained yet"), and each row says where
and why (``read``); at S the group reads the held-out test split where every counted run
recorded one there (``split``, ``engine.analysis.split_read``), else validation. Δ vs exact is
the paired difference over seeds,
d_s = val(method, s) − val(exact, s), over the seeds where both reached S;
``engine.core.stats.paired_delta`` gives its mean, std, 95 % interval (from the seeds and,
where the per-batch losses of the split read are stored, its batches), the 90 % interval
of its equivalence test (TOST) against ±δ (``margin``, default ``engine.core.stats.MARGIN``)
and the p-values behind the verdict: equivalent, better, worse, not equivalent or
inconclusive, read over the whole table at a 5 % family-wise error (Holm) unless asked not
to. A method that diverged in a seed where exact did not reads "diverged" unless its other
seeds already read it worse or not equivalent. Memory ratios are run ÷ exact everywhere.

The paper's own Table 3 (``PAPER_TABLE3``) is not a row of this table: it comes from
50,000 steps on FineWeb-edu, one run per method, and no run of the lab is comparable with
it; ``paper_note`` states it beside the table when the paper preset is shown. The text
(``display_frame``, ``notes``, ``render``) is ``engine.analysis.table3_text``'s, re-exported here.

Pure functions of run records and metric frames (as ``RunsRepository.runs.list_runs`` and
``RunStore.metrics`` return them); ``engine.reads.queries`` reads them from a store.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from engine.analysis.reads import LEFT_STATUSES, NOT_TRAINED, Read, diverged, read_group, read_text
from engine.analysis.split_read import TEST, SplitRead, check_split, split_read, tuned_text
from engine.analysis.table3_text import (  # re-exported: Table 3's rendering lived here
    MIB,
    PAPER_SETTING,
    PAPER_TABLE3,
    TEXT_FORMATS,
    display_frame,
    duplicates_note,
    holm_note,
    noise_note,
    notes,
    paper_note,
    read_notes,
    render,
    split_notes,
)
from engine.config import comparable_key, differing_fields, seed_group_key
from engine.config.identity import check_free
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

EVAL_METRICS = ("train_loss", "val_loss", "tokens_per_s", "test_loss")
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
    "delta_val_se_batch", "val_batches", "delta_val_df", "diverged", "read", "read_whole", "split", "split_note",
    "tuned",
]
REFERENCE, MISSING, DIVERGED = "reference", "missing", "diverged"
__all__ = ["DIVERGED", "EVAL_METRICS", "MEMORY_METRICS", "MIB", "MISSING", "PAPER_SETTING", "PAPER_TABLE3",
           "PROBE_METRICS", "REFERENCE", "SUMMARY_METRICS", "TABLE3_COLUMNS", "TEXT_FORMATS", "display_frame",
           "duplicates_note", "holm_note", "holm_verdicts", "noise_note", "notes", "one_per_seed", "paper_note",
           "read_notes", "render", "split_notes", "summarize", "table3"]


def _val_steps(metrics: pd.DataFrame, name: str = "val_loss") -> dict[int, set[int]]:
    """Run id → the steps it recorded metric ``name`` at."""
    rows = metrics[metrics["name"] == name]
    return {int(r): {int(s) for s in g} for r, g in rows.groupby("run_id")["step"]}


def _steps_read(runs: dict, val_steps: dict[int, set[int]], at_step: int | None) -> dict[int, int]:
    """Run id → the step ``summarize`` reads it at (``at_step``, or its last validation step);
    runs not read at any step (not reached) are left out."""
    out = {}
    for run_id in runs:
        steps = val_steps.get(run_id, set())
        if at_step is None and steps:
            out[run_id] = max(steps)
        elif at_step is not None and int(at_step) in steps:
            out[run_id] = int(at_step)
    return out


def _values_at(metrics: pd.DataFrame, step_of: dict[int, int]) -> tuple[dict[tuple[int, str], float], dict[int, float]]:
    """((run id, metric) → its value as ``summarize`` reads it, run id → the latest wall
    time at its step) from ``metrics`` (ordered by id, ``SUMMARY_METRICS`` only): a memory
    figure's last value, an eval metric's last value at the step, a probe's last at or
    before it; runs without a step only their memory figures."""
    step = metrics["run_id"].map(step_of)  # NaN for a run read at no step: no comparison holds
    at = metrics["step"] == step
    names = metrics["name"]
    picked = metrics[names.isin(MEMORY_METRICS) | (at & names.isin(EVAL_METRICS))
                     | ((metrics["step"] <= step) & names.isin(PROBE_METRICS))]
    picked = picked.drop_duplicates(["run_id", "name"], keep="last")
    values = {(int(r), str(n)): float(v) for r, n, v in zip(picked["run_id"], picked["name"], picked["value"])}
    wall = metrics[at].groupby("run_id")["wall_time"].max()
    return values, {int(r): float(w) for r, w in wall.items()}


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
    step_of = _steps_read(runs, _val_steps(metrics), at_step)
    values, wall = _values_at(metrics, step_of)
    rows = []
    for run_id, r in runs.items():
        step = step_of.get(run_id)
        row = {
            "run_id": run_id, "name": r.name, "status": r.status, "estimator": r.estimator,
            "rank": r.rank, "lam": r.lam, "seed": r.seed, "preset": r.preset,
            "step": step, "reached": step is not None,
            "wall_s": wall.get(run_id, np.nan) if step is not None else np.nan,
            "config_key": comparable_key(r.config),
        }
        rows.append(row | {m: values.get((run_id, m), np.nan) for m in SUMMARY_METRICS})
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


def _setups(groups: dict[str, list], free: tuple[str, ...] = ()) -> dict[str, str]:
    """``key=value`` of the config fields other than ``free`` that differ between the groups (their first
    runs' configs; "" for one group)."""
    configs = {k: rs[0].config for k, rs in groups.items()}
    varying = [k for k in differing_fields(configs.values()) if k not in free]
    return {g: ", ".join(f"{k}={c.get(k)}" for k in varying) for g, c in configs.items()}


def _by_seed_text(deltas: pd.Series) -> str:
    """``s0 +0.0012, s1 −0.0003``: each paired seed's Δ, by seed."""
    return ", ".join(f"s{int(s)} {v:+.4f}" for s, v in deltas.sort_index().items())


def _duplicates_text(duplicates: dict[int, int], kept: set[int]) -> str:
    """``25 (see 1), 26 (see 2)``: the duplicates that a run of ``kept`` stands for."""
    return ", ".join(f"{d} (see {k})" for d, k in sorted(duplicates.items()) if k in kept)


def _seeds_text(seeds) -> str:
    return ", ".join(str(s) for s in sorted(seeds))


def table3(records, metrics: pd.DataFrame, at_step: int | None = None, margin: float = MARGIN,
           batches: pd.DataFrame | None = None, adjust: bool = True, *, split: str = "auto",
           free: tuple[str, ...] = (), test_batches: pd.DataFrame | None = None) -> pd.DataFrame:
    """The paper's Table 3: one row per method (estimator, rank, λ) of each comparable
    config group, every row of a group read at the step ``engine.analysis.reads.read_group``
    chooses on validation (never a verdict at step 0; failed and cancelled runs out), Δ judged
    against the equivalence margin ±``margin`` nats. ``split`` ("val", "test", "auto"): what a
    group reads there (``engine.analysis.split_read``). ``batches`` / ``test_batches``
    (``RunStore.eval_losses`` of split "val" / "test") put the evaluated batches' sampling error
    into Δ's interval (``engine.core.stats.paired_delta``); ``adjust`` reads the verdicts of the
    table at a 5 % family-wise error (``engine.core.stats.holm``). ``free``: run fields of the
    method, not the setup (``("lr",)``: each method at its own tuned lr, paired with exact at
    exact's; ``comparable_key``). Columns ``TABLE3_COLUMNS`` (on the test split, the ``val_*``
    and ``delta_val_*`` columns hold test values):

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
      of a counted one (``one_per_seed``), ``25 (see 1), …``;
    * ``split``: "val" or "test", what the row read, ``split_note`` why ("": nothing to say);
      ``tuned``: the values of the ``free`` fields its runs used (``lr=0.01, 0.0316``).

    Ordered by setup, exact first, then estimator, rank and λ."""
    margin, split, free = check_margin(margin), check_split(split), check_free(free)
    records, duplicates = one_per_seed(records)
    if not records:
        return pd.DataFrame(columns=TABLE3_COLUMNS)
    metrics = metrics[metrics["run_id"].isin([r.id for r in records])]
    val_steps, test_steps, groups = _val_steps(metrics), _val_steps(metrics, "test_loss"), _groups(records, free)
    setups, losses = _setups(groups, free), {"val": _batch_losses(batches), TEST: _batch_losses(test_batches)}
    reads = {key: read_group(members, val_steps, at_step) for key, members in groups.items()}
    ons = {key: split_read(split, members, reads[key], val_steps, test_steps) for key, members in groups.items()}
    runs = _run_rows(groups, reads, ons, metrics)
    rows = []
    for key, members in groups.items():
        rows += _group_rows(members, runs[key], reads[key], ons[key], setups[key], duplicates, margin,
                            losses[ons[key].split], free)
    return _ordered(holm_verdicts(_typed(pd.DataFrame(rows, columns=TABLE3_COLUMNS)), adjust))


def _run_rows(groups: dict[str, list], reads: dict[str, Read], ons: dict[str, SplitRead],
              metrics: pd.DataFrame) -> dict[str, list[dict[str, Any]]]:
    """Group key → its runs' ``summarize`` rows at the group's read step (None: step -1, which no
    run has reached), in run id order, as dicts with ``val_loss`` the read split's (test: its
    ``test_loss``), ``saved_ratio`` (run ÷ exact) and ``method`` (estimator, rank or None, λ or
    None). One ``summarize`` of all the groups read at the same step, not one a group."""
    by_step: dict[int, list[str]] = {}
    for key, read in reads.items():
        by_step.setdefault(-1 if read.step is None else int(read.step), []).append(key)
    out: dict[str, list[dict[str, Any]]] = {key: [] for key in groups}
    for step, keys in by_step.items():
        group_of = {r.id: key for key in keys for r in groups[key]}
        s = summarize([r for key in keys for r in groups[key]], metrics, at_step=step)
        s["group"] = s["run_id"].map(group_of)
        s["val_loss"] = s["val_loss"].where(~s["group"].isin([k for k in keys if ons[k].split == TEST]), s["test_loss"])
        s["saved_ratio"] = s["mem_saved_bytes"] / s["mem_saved_bytes_exact"]
        s["method"] = [(e, None if pd.isna(r) else int(r), None if pd.isna(lam) else float(lam))
                       for e, r, lam in zip(s["estimator"], s["rank"], s["lam"])]
        for row in s.to_dict("records"):
            out[row["group"]].append(row)
    return out


def _groups(records, free: tuple[str, ...]) -> dict[str, list]:
    """The comparable groups of ``records`` (``comparable_key`` less the ``free`` fields), in order."""
    groups: dict[str, list] = {}
    for r in records:
        groups.setdefault(comparable_key(r.config, free), []).append(r)
    return groups


def _typed(out: pd.DataFrame) -> pd.DataFrame:
    return out.astype({"rank": "Int64", "step": "Int64", "seeds": "int64", "paired_seeds": "int64",
                       "val_batches": "int64", "holm_tests": "int64"})


def _ordered(out: pd.DataFrame) -> pd.DataFrame:
    """``out`` by setup, exact first, then estimator, rank and λ."""
    out = out.assign(_not_exact=(out["estimator"] != "exact").astype(int))
    out = out.sort_values(["setup", "_not_exact", "estimator", "rank", "lam"], kind="stable", na_position="first")
    return out.drop(columns="_not_exact").reset_index(drop=True)


def _batch_losses(batches: pd.DataFrame | None) -> dict[tuple[int, int], np.ndarray]:
    """(run id, step) → that evaluation's per-batch losses."""
    if batches is None or batches.empty:
        return {}
    return {(int(r), int(s)): np.asarray(v, dtype=float) for r, s, v in zip(batches["run_id"], batches["step"],
                                                                             batches["losses"])}


def _mean(values: list[float]) -> float:
    """The mean of ``values`` less their NaNs (NaN for none), summed as ``pandas.Series.mean`` sums them."""
    a = np.asarray(values, dtype=float)
    nan = np.isnan(a)
    count = a.size - int(nan.sum())
    return float(np.where(nan, 0.0, a).sum() / count) if count else np.nan


def _std(values: list[float]) -> float:
    """The sample standard deviation (ddof 1) of ``values`` less their NaNs (NaN for fewer than two),
    by ``pandas.Series.std``'s two passes."""
    a = np.asarray(values, dtype=float)
    nan = np.isnan(a)
    count = a.size - int(nan.sum())
    if count < 2:
        return np.nan
    filled = np.where(nan, 0.0, a)
    squares = np.where(nan, 0.0, (filled.sum() / count - filled) ** 2)
    return float(np.sqrt(squares.sum() / (count - 1)))


def _seed(value):
    """A seed as a key: None for a missing one."""
    return None if pd.isna(value) else value


def _pair_batches(pairs: list[tuple[int, int]], step, losses: dict) -> np.ndarray | None:
    """The S × B per-batch differences of the paired runs ``pairs`` ((run id, exact run id), one
    pair per seed) at ``step``; None unless every run has its B losses there."""
    rows = []
    for mine, exact in pairs:
        a, b = losses.get((int(mine), int(step))), losses.get((int(exact), int(step)))
        if a is None or b is None or a.shape != b.shape or not np.isfinite(a - b).all():
            return None
        rows.append(a - b)
    return np.stack(rows) if rows and len({len(r) for r in rows}) == 1 else None


def _diverged_text(method_runs: list[dict], lost: set, exact_lost: set) -> str:
    """``2 of 5 seeds (s1, s3)``: the seeds of ``method_runs`` that diverged where exact did not ("" for none)."""
    seeds = sorted({int(r["seed"]) for r in method_runs if not pd.isna(r["seed"])})
    bad = [s for s in seeds if s in lost and s not in exact_lost]
    return f"{len(bad)} of {len(seeds)} seeds ({', '.join(f's{s}' for s in bad)})" if bad else ""


def _counted(word: str, diverged_seeds: str) -> str:
    """``word`` with divergence counted against the method: a method that diverged where exact did
    not reads "diverged" unless its other seeds already read it worse or not equivalent."""
    return DIVERGED if diverged_seeds and word not in (WORSE, NOT_EQUIVALENT) else word


def _delta(method: str, done: list[dict], exact: dict, read: Read, margin: float,
           losses: dict) -> tuple[PairedDelta, pd.Series]:
    """The paired Δ of one method's ``done`` runs against the ``exact`` runs (seed → row), and Δ by
    seed: over the seeds both have, where neither value nor run id is missing, in seed order."""
    if not read.trained and read.step is not None:
        return paired_delta([], margin)._replace(verdict=REFERENCE if method == "exact" else NOT_TRAINED), \
            pd.Series(dtype=float)
    if not done:
        return paired_delta([], margin)._replace(verdict=MISSING), pd.Series(dtype=float)
    if method == "exact":
        return paired_delta([], margin)._replace(verdict=REFERENCE), pd.Series(dtype=float)
    pairs = sorted(((r, exact[_seed(r["seed"])]) for r in done if _seed(r["seed"]) in exact),
                   key=lambda pair: (_seed(pair[0]["seed"]) is None, _seed(pair[0]["seed"]) or 0))  # by seed
    pairs = [(r, e) for r, e in pairs if not pd.isna([r["val_loss"], r["run_id"], e["val_loss"], e["run_id"]]).any()]
    deltas = pd.Series([r["val_loss"] - e["val_loss"] for r, e in pairs], index=[r["seed"] for r, _ in pairs],
                       dtype=float)
    batches = _pair_batches([(r["run_id"], e["run_id"]) for r, e in pairs], read.step, losses)
    return paired_delta(deltas, margin, batches=batches), deltas


def _group_rows(members: list, runs: list[dict], read: Read, on: SplitRead, setup: str,
                duplicates: dict[int, int], margin: float, losses: dict, free: tuple[str, ...]) -> list[dict[str, Any]]:
    """The Table 3 rows of one comparable group ``members`` from ``runs`` (``_run_rows``: their
    values at ``read.step``, on the split ``on`` says), with ``losses`` that split's per-batch
    losses."""
    configs = {r.id: r.config for r in members}
    lost = {r.id for r in members if diverged(r)}
    reached: dict[tuple, dict] = {}  # (method, seed) → its latest live run that reached the step
    for r in runs:
        if r["reached"] and r["status"] not in LEFT_STATUSES:
            reached.pop((r["method"], _seed(r["seed"])), None)
            reached[(r["method"], _seed(r["seed"]))] = r
    exact = {seed: r for (method, seed), r in reached.items() if method[0] == "exact"}
    exact_lost = {int(r["seed"]) for r in runs if r["estimator"] == "exact" and r["run_id"] in lost}
    methods: dict[tuple, list[dict]] = {}
    for r in runs:
        methods.setdefault(r["method"], []).append(r)
    rows = []
    for (estimator, rank, lam), method in methods.items():
        done = [r for (m, _), r in reached.items() if m == (estimator, rank, lam)]
        delta, deltas = _delta(estimator, done, exact, read, margin, losses)
        diverged_text = _diverged_text(method, {int(r["seed"]) for r in method if r["run_id"] in lost}, exact_lost)
        rows.append({
            "estimator": estimator, "rank": rank, "lam": np.nan if lam is None else lam, "seeds": len(done),
            "step": read.step, **_means(done), **_delta_columns(delta, deltas), "diverged": diverged_text,
            "verdict": _counted(delta.verdict, diverged_text),
            "missing_seeds": _seeds_text({r["seed"] for r in method if not pd.isna(r["seed"])}
                                         - {r["seed"] for r in done}),
            "preset": members[0].preset, "setup": setup, "run_ids": ", ".join(str(r["run_id"]) for r in done),
            "duplicates": _duplicates_text(duplicates, {r["run_id"] for r in method}), "read": read_text(read),
            "read_whole": read.whole, "split": on.split, "split_note": on.note,
            "tuned": tuned_text([configs[r["run_id"]] for r in (done or method)], free),
        })
    return rows


def _means(done: list[dict]) -> dict[str, float]:
    """The columns of a Table 3 row that are means (and stds) over its counted runs ``done``."""
    def values(name: str) -> list[float]:
        return [r[name] for r in done]

    return {"val_loss_mean": _mean(values("val_loss")), "val_loss_std": _std(values("val_loss")),
            "train_loss_mean": _mean(values("train_loss")), "train_loss_std": _std(values("train_loss")),
            "cos_mean": _mean(values("cos_mean")), "mem_saved_bytes_mean": _mean(values("mem_saved_bytes")),
            "mem_saved_bytes_exact_mean": _mean(values("mem_saved_bytes_exact")),
            "mem_saved_ratio": _mean(values("saved_ratio"))}


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

