"""What the CLI and the dashboard read from a ``RunStore`` and compute with the pure
``engine.analysis.summary``: run summaries, the paper's Table 3, and Table 3 as text in
each of ``SUMMARY_FORMATS`` (CSV formula-neutralised by ``storage.export``)."""

from __future__ import annotations

import json

import pandas as pd

from engine.analysis.summary import SUMMARY_METRICS, render, summarize, table3
from engine.config import comparable_key
from engine.core.choices import SUMMARY_FORMATS
from engine.core.stats import MARGIN, PRIOR_DELTA_SD, plan_text
from storage import RunStore
from storage.export import neutralize


def read_runs(store: RunStore, run_ids=None) -> tuple[list, pd.DataFrame]:
    """(run records, their ``SUMMARY_METRICS`` rows) of ``run_ids`` (None: every run)."""
    wanted = None if run_ids is None else {int(i) for i in run_ids}
    records = [r for r in store.list_runs() if wanted is None or r.id in wanted]
    return records, store.metrics(sorted(r.id for r in records), names=list(SUMMARY_METRICS))


def run_summary(store: RunStore, run_ids, at_step: int | None = None) -> pd.DataFrame:
    """``summarize`` of the given runs, read from ``store``."""
    return summarize(*read_runs(store, run_ids), at_step)


def run_table3(store: RunStore, run_ids=None, at_step: int | None = None, margin: float = MARGIN) -> pd.DataFrame:
    """``table3`` of the given runs (None: all), read from ``store``, Δ judged against ±``margin``."""
    return table3(*read_runs(store, run_ids), at_step, margin=margin)


def expected_delta_sd(store: RunStore, configs) -> tuple[float, str]:
    """The seed-to-seed SD of a paired Δ val to expect for ``configs`` (``RunConfig``s): pooled
    over the Table 3 rows with two or more paired seeds among the stored finished runs of the
    same comparable configs, s² = Σ (n−1) s_i² / Σ (n−1), where that is above 0 (runs with no
    seed noise at all, such as replayed or synthetic ones, say nothing about the spread to
    plan for); else ``PRIOR_DELTA_SD``. Also where it came from, in words."""
    keys = {comparable_key(c.to_dict()) for c in configs}
    records = [r for r in store.list_runs() if r.status == "finished" and comparable_key(r.config) in keys]
    if records:
        t = table3(records, store.metrics([r.id for r in records], names=list(SUMMARY_METRICS)))
        rows = t[(t["estimator"] != "exact") & (t["paired_seeds"] >= 2) & t["delta_val_std"].notna()]
        if len(rows):
            df = rows["paired_seeds"] - 1
            sd = float(((df * rows["delta_val_std"] ** 2).sum() / df.sum()) ** 0.5)
            if sd > 0:
                return sd, f"observed over {len(records)} finished runs of this setup"
    return PRIOR_DELTA_SD, "prior: the largest seen in this lab's CPU reproductions"


def seed_plan(store: RunStore, configs, margin: float = MARGIN) -> str | None:
    """When ``configs`` (a grid with exact backprop and sketched methods) has too few seeds per
    method to decide equivalence within ±``margin`` at the expected spread
    (``expected_delta_sd``), what they can decide and the seeds that would (``plan_text``);
    else None (enough seeds, or nothing to compare with exact)."""
    configs = list(configs)
    exact = {c.seed for c in configs if c.is_exact}
    methods: dict[tuple, set] = {}
    for c in configs:
        if not c.is_exact:
            methods.setdefault((c.estimator, c.rank, c.lam), set()).add(c.seed)
    if not exact or not methods:
        return None
    seeds = min(len(s & exact) for s in methods.values())
    sd, source = expected_delta_sd(store, configs)
    return plan_text(seeds, sd, margin, source)


RELAUNCH_STATUSES = ("finished", "queued", "running")  # a run that has, or will have, what a relaunch would train
SHOWN_DUPLICATES = 12  # runs named in a relaunch warning before "and N more"


def _identity(config: dict) -> str:
    return json.dumps({k: v for k, v in config.items() if k != "name"}, sort_keys=True, default=str)


def relaunch_warning(store: RunStore, configs) -> str | None:
    """When some of ``configs`` (``RunConfig``s about to be launched) are already in the
    database with the identical config and seed (every field but the name) as a finished,
    queued or running run, a warning naming those runs; None when none is. A warning, not
    a refusal: another launch of the same seed is a legitimate repeat (a timing or a
    determinism check), and Compare, Table 3 and the report count one run per seed."""
    wanted = {_identity(c.to_dict()) for c in configs}
    same = [r for r in store.list_runs(statuses=list(RELAUNCH_STATUSES)) if _identity(r.config) in wanted]
    if not same:
        return None
    repeated = len({_identity(r.config) for r in same})
    named = ", ".join(f"#{r.id} {r.name} ({r.status})" for r in same[:SHOWN_DUPLICATES])
    more = f" and {len(same) - SHOWN_DUPLICATES} more" if len(same) > SHOWN_DUPLICATES else ""
    return (f"{repeated} of the {len(configs)} runs to launch are already in the database with the same config and "
            f"seed: {named}{more}. Launching trains them again; Compare and Table 3 count the furthest-trained run "
            "of each seed, so change the seeds (or steps) to add new ones.")


def table3_text(table: pd.DataFrame, fmt: str = "table") -> str:
    """``table3`` in ``fmt``: ``csv`` (every column, full precision, NaN empty,
    formula-neutralised), else ``render``'s text for people."""
    if fmt not in SUMMARY_FORMATS:
        raise ValueError(f"unknown summary format {fmt!r}; use one of {', '.join(SUMMARY_FORMATS)}")
    if fmt == "csv":
        return neutralize(table).to_csv(index=False)
    return render(table, fmt)


def runs_where(store: RunStore, where: str | None = None, *, metrics: str = "used") -> pd.DataFrame:
    """``engine.analysis.where.runs_table`` of the runs ``where`` matches (None or empty:
    every run), by id. ``metrics``: ``"used"`` joins the final values of the metrics the
    filter names only, ``"all"`` of every metric. A bad filter or an unknown field raises
    ``WhereError`` (a ``ValueError``) naming the closest known fields."""
    from engine.analysis import where as w

    expr = w.parse(where) if where is not None and str(where).strip() else None
    records = store.list_runs()
    base = w.runs_table(records)
    if metrics == "all":
        finals = store.final_metrics()
    else:
        wanted = [f for f in (w.fields_of(expr) if expr is not None else []) if f not in base.columns]
        finals = store.final_metrics(names=wanted) if wanted else None
    frame = w.runs_table(records, finals) if finals is not None else base
    if expr is None:
        return frame
    known = list(frame.columns)
    if any(f not in known for f in w.fields_of(expr)):
        # a metric some run has, or one every trained run records (none yet here): every row misses it
        known += [*store.metric_names(), *SUMMARY_METRICS]
    return frame[w.evaluate(expr, frame, known)].reset_index(drop=True)


def where_ids(store: RunStore, where: str | None, run_ids=None) -> list[int] | None:
    """The ids among ``run_ids`` (None: all runs) that ``where`` matches, by id; None
    when both are None (every run)."""
    if where is None or not str(where).strip():
        return None if run_ids is None else list(run_ids)
    matched = [int(i) for i in runs_where(store, where)["id"]]
    if run_ids is None:
        return matched
    keep = set(matched)
    return [int(i) for i in run_ids if int(i) in keep]
