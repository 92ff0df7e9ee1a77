"""A tuning campaign read from its runs: the trials, the value each method chose, the budget spent.

Pure functions of a ``TuneSpec`` (``engine.config.tuning``), run records and metric frames (as
``RunsRepository.runs.list_runs`` and ``RunStore.metrics`` return them). The runs are the record of truth:
a trial's value is read from its stored config, its loss from its stored metrics.

* ``trial_frame``: one row per trial run: method, trial index, seed, the tuned values, status,
  steps run, the validation loss at the last step (NaN until then; +inf for a diverged run) and
  whether a pruner stopped it (``engine.analysis.pruning``).
* ``choose``: per method, the trial whose mean final validation loss over the tuning seeds is
  lowest (a trial with a seed that diverged, failed or was cancelled is never chosen), the values
  it used, and whether that is the smallest or largest value tried of a field ("at the range's
  edge": the optimum may lie outside the range, so widen it). Every method's budget is
  trials × tuning seeds × steps; ``spent`` counts the steps its trials ran.
* ``settled``: whether every trial has ended (finished, failed or cancelled): the moment the
  comparison can be chosen. An interrupted trial is not settled: it resumes.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from engine.analysis.pruning import PRUNED, REDUCTION
from engine.analysis.reads import diverged
from engine.config.identity import stored
from engine.config.tuning import TuneSpec

SETTLED_STATUSES = ("finished", "failed", "cancelled")
TRIAL_COLUMNS = ["run_id", "method", "trial", "seed", "status", "steps_done", "val_loss", "diverged", "pruned"]
CHOICE_COLUMNS = ["method", "chosen", "trial", "val_loss", "seeds", "edge", "budget_steps", "spent_steps", "trials"]


def _method_and_trial(spec: TuneSpec, config) -> tuple[str, int] | None:
    """(the method label, the trial index) of a trial's stored config, None for a run that is not one."""
    run = stored(config)
    if run is None:
        return None
    values = {f: getattr(run, f) for f in spec.fields if spec.applies(run, f)}
    for i, point in enumerate(spec.points):
        if all(math.isclose(values[f], point[f], rel_tol=1e-12) for f in values):
            return spec.at_base(run).method(), i
    return None


def trial_frame(spec: TuneSpec, records, metrics: pd.DataFrame) -> pd.DataFrame:
    """The trials among ``records`` (module docstring), by method then trial then seed."""
    val = metrics[metrics["name"] == "val_loss"] if len(metrics) else metrics
    rows = []
    for r in records:
        found = _method_and_trial(spec, r.config)
        if found is None:
            continue
        mine = val[(val["run_id"] == r.id) & (val["step"] == r.steps)] if len(val) else val
        lost = diverged(r)
        loss = math.inf if lost else (float(mine["value"].iloc[-1]) if len(mine) else math.nan)
        rows.append({"run_id": r.id, "method": found[0], "trial": found[1], "seed": r.seed, "status": r.status,
                     "steps_done": int(r.steps_done or 0), "val_loss": loss, "diverged": lost,
                     "pruned": r.status == "cancelled" and (r.error or "").startswith(PRUNED),
                     **{f: r.config.get(f) for f in spec.fields}})
    frame = pd.DataFrame(rows, columns=[*TRIAL_COLUMNS, *spec.fields])
    return frame.sort_values(["method", "trial", "seed"], kind="stable").reset_index(drop=True)


def settled(trials: pd.DataFrame) -> bool:
    """Whether every trial has ended for good (module docstring)."""
    return bool(len(trials)) and bool(trials["status"].isin(SETTLED_STATUSES).all())


def _edge(spec: TuneSpec, values: dict[str, float], config) -> str:
    """The fields whose chosen value is the smallest or largest tried, as ``lr (lowest tried)``
    (not a field that means nothing to the method, such as exact backprop's λ)."""
    out = []
    for f, v in values.items():
        if not spec.applies(config, f):
            continue
        tried = [p[f] for p in spec.points]
        if len(tried) > 1 and v <= min(tried):
            out.append(f"{f} (lowest tried)")
        elif len(tried) > 1 and v >= max(tried):
            out.append(f"{f} (highest tried)")
    return ", ".join(out)


def _choice(spec: TuneSpec, config, mine: pd.DataFrame) -> dict[str, Any]:
    """The choice row of one method's trials ``mine`` (``config``: the method's, from ``spec.methods()``)."""
    method = config.method()
    means = {}
    for i, t in mine.groupby("trial"):
        complete = (t["status"] == "finished").all() and len(t) == len(spec.tune_seeds)
        mean = float(t["val_loss"].mean()) if complete else math.inf
        means[int(i)] = mean if math.isfinite(mean) else math.inf
    best = min(means, key=lambda i: (means[i], i)) if means else -1
    ok = best in means and math.isfinite(means[best])
    sample = mine[mine["trial"] == best].iloc[0] if ok else None
    values = {f: float(sample[f]) for f in spec.fields if sample is not None and pd.notna(sample[f])}
    return {"method": method, "chosen": values if ok else {}, "trial": best if ok else None,
            "val_loss": means[best] if ok else np.nan, "seeds": len(spec.tune_seeds),
            "edge": _edge(spec, values, config) if ok else "", "budget_steps": spec.budget_steps(),
            "spent_steps": int(mine["steps_done"].sum()), "trials": int(mine["trial"].nunique())}


def choose(spec: TuneSpec, trials: pd.DataFrame) -> pd.DataFrame:
    """Per method of ``spec`` (in grid order), the chosen trial and values (module docstring); a
    method none of whose trials finished on every seed has ``chosen`` {} and NaN loss."""
    rows = []
    for config in spec.methods():
        rows.append(_choice(spec, config, trials[trials["method"] == config.method()]))
    return pd.DataFrame(rows, columns=CHOICE_COLUMNS)


def stored_choices(choices: pd.DataFrame) -> list[dict[str, Any]]:
    """``choose``'s rows as JSON can hold them: NaN as None, the trial an int or None."""
    out = []
    for row in choices.to_dict(orient="records"):
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}
        trial = clean.get("trial")
        clean["trial"] = None if trial is None else int(trial)
        out.append(clean)
    return out


def chosen_values(spec: TuneSpec, choices: pd.DataFrame) -> dict[str, dict[str, float]]:
    """Method label → the values the comparison trains it at: the chosen ones, or the base
    values for a method with no finished trial (said by ``choices``' NaN loss)."""
    base = {f: spec.base_value(f) for f in spec.fields}
    return {row.method: (dict(row.chosen) or base) for row in choices.itertuples()}


def protocol(spec: TuneSpec, choices: pd.DataFrame | None = None, split: str | None = None) -> list[tuple[str, str]]:
    """The protocol as (what, how) lines for a report: search space, trials, budget, sampler,
    seeds, selection, the split the verdict reads and, with ``choices``, what was spent."""
    steps = spec.grid.base.steps
    lines = [
        ("search space", "; ".join(r.text() for r in spec.ranges)),
        ("trials", f"{spec.trials} per method, the same points for every method"),
        ("sampler", f"Optuna QMCSampler (scrambled Sobol), seed {spec.sampler_seed}"),
        ("pruner", {"none": "none: every trial runs to its last step",
                    "halving": f"Optuna SuccessiveHalvingPruner (rungs from one eval interval, reduction factor "
                               f"{REDUCTION})",
                    "hyperband": f"Optuna HyperbandPruner (one eval interval to {steps:,} steps, reduction factor "
                                 f"{REDUCTION})"}[spec.pruner]),
        ("budget", f"{spec.budget_steps():,} steps per method ({spec.trials} trials × {len(spec.tune_seeds)} tuning "
                   f"seed(s) × {steps:,} steps)"),
        ("tuning seeds", ", ".join(map(str, spec.tune_seeds))),
        ("evaluation seeds", ", ".join(map(str, spec.eval_seeds))),
        ("selection", "lowest mean validation loss at the last step over the tuning seeds"),
        ("verdict read on", split or "the held-out test split (validation where a run recorded no test loss)"),
    ]
    if choices is not None and len(choices):
        spent = ", ".join(f"{r.method} {int(r.spent_steps):,}" for r in choices.itertuples())
        lines.append(("steps spent", spent))
    return lines


def _values_text(values: dict) -> str:
    return ", ".join(f"{k}={v:.4g}" for k, v in values.items()) or "—"


def choice_table(choices: pd.DataFrame) -> pd.DataFrame:
    """``choose``'s rows for people: the method, its chosen values, its mean validation loss over
    the tuning seeds, the edge flag, the budget and the steps its trials ran."""
    return pd.DataFrame({
        "method": choices["method"],
        "chosen": [_values_text(c) if c else "— (no trial finished: untuned values)" for c in choices["chosen"]],
        "tuning val loss": ["—" if pd.isna(v) else f"{v:.4f}" for v in choices["val_loss"]],
        "at the range's edge": [f"{e}: widen it" if e else "—" for e in choices["edge"]],
        "budget (steps)": [f"{int(b):,}" for b in choices["budget_steps"]],
        "spent (steps)": [f"{int(s):,}" for s in choices["spent_steps"]],
    })


def split_comparison(spec: TuneSpec, chosen: dict[str, dict[str, float]], records) -> tuple[list, list]:
    """(the comparison's runs at their method's chosen values, those at the base values) of
    ``records``; a run whose chosen values are the base values is in both."""
    tuned, untuned = [], []
    for r in records:
        run = stored(r.config)
        if run is None:
            continue
        values = {f: getattr(run, f) for f in spec.fields if spec.applies(run, f)}
        mine = chosen.get(spec.at_base(run).method(), {})
        if all(math.isclose(values[f], mine.get(f, math.nan), rel_tol=1e-12) for f in values):
            tuned.append(r)
        if all(math.isclose(values[f], spec.base_value(f), rel_tol=1e-12) for f in values):
            untuned.append(r)
    return tuned, untuned
