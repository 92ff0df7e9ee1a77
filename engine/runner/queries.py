"""What the CLI and the dashboard read from a ``RunStore`` and compute with the pure
``engine.analysis.summary``: run summaries, the paper's Table 3, and Table 3 as text in
each of ``SUMMARY_FORMATS`` (CSV formula-neutralised by ``storage.export``)."""

from __future__ import annotations

import pandas as pd

from engine.analysis.summary import SUMMARY_METRICS, render, summarize, table3
from engine.core.choices import SUMMARY_FORMATS
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


def run_table3(store: RunStore, run_ids=None, at_step: int | None = None) -> pd.DataFrame:
    """``table3`` of the given runs (None: all), read from ``store``."""
    return table3(*read_runs(store, run_ids), at_step)


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
