"""What the CLI and the dashboard read from a ``RunStore`` and compute with the pure
``engine.analysis.summary``: run summaries, the paper's Table 3, and Table 3 as text in
each of ``SUMMARY_FORMATS`` (CSV formula-neutralised by ``storage.export``)."""

from __future__ import annotations

import json
from typing import NamedTuple

import pandas as pd

from engine.analysis.split_read import check_split
from engine.analysis.summary import SUMMARY_METRICS, render, summarize, table3
from engine.config import comparable_key
from engine.core.choices import SUMMARY_FORMATS
from engine.core.stats import MARGIN, PRIOR_DELTA_SD, SeedPlan, plan_text
from storage import RunStore
from storage.export import neutralize


def read_runs(store: RunStore, run_ids=None) -> tuple[list, pd.DataFrame]:
    """(run records, their ``SUMMARY_METRICS`` rows) of ``run_ids`` (None: every run)."""
    wanted = None if run_ids is None else {int(i) for i in run_ids}
    records = [r for r in store.runs.list_runs() if wanted is None or r.id in wanted]
    return records, store.metrics(sorted(r.id for r in records), names=list(SUMMARY_METRICS))


def run_summary(store: RunStore, run_ids, at_step: int | None = None) -> pd.DataFrame:
    """``summarize`` of the given runs, read from ``store``."""
    return summarize(*read_runs(store, run_ids), at_step)


def run_table3(store: RunStore, run_ids=None, at_step: int | None = None, margin: float = MARGIN,
               adjust: bool = True, *, split: str = "auto", free: tuple[str, ...] = ()) -> pd.DataFrame:
    """``table3`` of the given runs (None: all), read from ``store`` with their per-batch
    validation losses (and test losses, where ``split`` may read the test split and some run
    recorded a test loss), Δ judged against ±``margin``, the verdicts Holm-adjusted over the
    table unless not ``adjust``; ``split`` and ``free`` as ``table3`` takes them."""
    records, metrics = read_runs(store, run_ids)
    batches, test_batches = split_batches(store, [r.id for r in records], metrics, split)
    return table3(records, metrics, at_step, margin=margin, adjust=adjust, split=split, free=free,
                  batches=batches, test_batches=test_batches)


def split_batches(store: RunStore, ids, metrics: pd.DataFrame,
                  split: str = "auto") -> tuple[pd.DataFrame, pd.DataFrame | None]:
    """(the per-batch validation losses, the per-batch test losses or None) of runs ``ids`` that
    ``table3`` reads at ``split``: the test split's are read only where ``split`` may read it and
    some run of ``metrics`` recorded a test loss (one query less for the runs of older versions)."""
    ids = list(ids)
    tested = check_split(split) != "val" and bool((metrics["name"] == "test_loss").any())
    return store.eval_losses(ids), store.eval_losses(ids, split="test") if tested else None


PRIOR_SOURCE = "prior: the largest seen in this lab's CPU reproductions"


class Method(NamedTuple):
    """A sketched method of a grid in its setup: the ``comparable_key`` of its config, its
    estimator, R (the effective rank, as runs store it) and λ."""

    key: str
    estimator: str
    rank: int
    lam: float


def method_of(config) -> Method:
    """The ``Method`` of a sketched ``RunConfig``."""
    return Method(comparable_key(config.to_dict()), config.estimator, int(config.effective_rank),
                  float(config.lam or 0.0))


def expected_delta_sd(store: RunStore, configs) -> dict[Method, tuple[float, str]]:
    """The seed-to-seed SD of the paired Δ val to expect for each sketched method of ``configs``
    (``RunConfig``s), with where it came from in words: the method's own Table 3
    ``delta_val_std`` among the stored finished runs of the same comparable config, where it
    has two or more paired seeds and an SD above 0 (runs with no seed noise at all, such as
    replayed or synthetic ones, say nothing about the spread to plan for); else
    ``PRIOR_DELTA_SD``. Never pooled over methods: a rank's spread is not another's."""
    methods = {method_of(c) for c in configs if not c.is_exact}
    keys = {m.key for m in methods}
    records = [r for r in store.runs.list_runs() if r.status == "finished" and comparable_key(r.config) in keys]
    observed: dict[Method, tuple[float, str]] = {}
    if records:
        key_of = {r.id: comparable_key(r.config) for r in records}
        t = table3(records, store.metrics(list(key_of), names=list(SUMMARY_METRICS)))
        rows = t[(t["estimator"] != "exact") & (t["paired_seeds"] >= 2) & (t["delta_val_std"] > 0)]
        for r in rows.itertuples():
            key = key_of[int(str(r.run_ids).split(", ")[0])]
            lam = 0.0 if pd.isna(r.lam) else float(r.lam)
            observed[Method(key, r.estimator, int(r.rank), lam)] = (
                float(r.delta_val_std), f"observed over {r.paired_seeds} paired seeds of its finished runs")
    return {m: observed.get(m, (PRIOR_DELTA_SD, PRIOR_SOURCE)) for m in methods}


def seed_plan(store: RunStore, configs, margin: float = MARGIN) -> str | None:
    """When some sketched method of ``configs`` (a grid with exact backprop) has too few seeds
    paired with exact (of the same comparable config) to decide equivalence within ±``margin``
    at its own expected spread (``expected_delta_sd``), one sentence naming those methods, what
    their seeds can decide and the seeds each would need (``plan_text``); else None (enough
    seeds for every method, or nothing to compare with exact)."""
    configs = list(configs)
    exact: dict[str, set] = {}
    methods: dict[Method, tuple[str, set]] = {}
    for c in configs:
        if c.is_exact:
            exact.setdefault(comparable_key(c.to_dict()), set()).add(c.seed)
        else:
            methods.setdefault(method_of(c), (c.method(), set()))[1].add(c.seed)
    methods = {m: named for m, named in methods.items() if m.key in exact}
    if not methods:
        return None
    spreads = expected_delta_sd(store, configs)
    return plan_text([SeedPlan(name, len(seeds & exact[m.key]), *spreads[m]) for m, (name, seeds) in methods.items()],
                     margin)


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
    same = [r for r in store.runs.list_runs(statuses=list(RELAUNCH_STATUSES)) if _identity(r.config) in wanted]
    if not same:
        return None
    repeated = len({_identity(r.config) for r in same})
    named = ", ".join(f"#{r.id} {r.name} ({r.status})" for r in same[:SHOWN_DUPLICATES])
    more = f" and {len(same) - SHOWN_DUPLICATES} more" if len(same) > SHOWN_DUPLICATES else ""
    return (f"{repeated} of the {len(configs)} runs to launch are already in the database with the same config and "
            f"seed: {named}{more}. Launching trains them again; Compare and Table 3 count one run per seed (the "
            "furthest-trained), so only new seeds add runs to the comparison: other steps train the same seeds "
            "again, to another length, and Compare keeps whichever trained further.")


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
    records = store.runs.list_runs()
    base = w.runs_table(records)
    if metrics == "all":
        finals = store.metrics.final_metrics()
    else:
        wanted = [f for f in (w.fields_of(expr) if expr is not None else []) if f not in base.columns]
        finals = store.metrics.final_metrics(names=wanted) if wanted else None
    frame = w.runs_table(records, finals) if finals is not None else base
    if expr is None:
        return frame
    known = list(frame.columns)
    if any(f not in known for f in w.fields_of(expr)):
        # a metric some run has, or one every trained run records (none yet here): every row misses it
        known += [*store.metrics.metric_names(), *SUMMARY_METRICS]
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
