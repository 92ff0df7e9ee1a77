"""Compare over many runs computes what it shows once (issue 42): one Table 3 a render,
shared by the rank figure and the table; none again for a rerun that changes nothing it
reads; the rank figure draws the rows of the Table 3 it is given; Table 3 summarizes the
runs of all the groups read at one step at once, not group by group; the Table 3 files are
written when a download is asked for, not on every render."""

import dataclasses

import pandas as pd
import pytest

from engine.analysis import method_frames, summary
from engine.analysis.summary import table3
from tests.support.pages import app, downloads, figures, page, store, url  # noqa: F401 (fixtures)
from tests.support.runs import TINY, fake_run
from tests.support.setups import write_setups


def _lab(store) -> list[int]:
    """exact, basis R=1 and R=8 at seeds 0 and 1."""
    return [fake_run(store, dataclasses.replace(TINY, estimator=e, rank=r, seed=s), final=f + 0.02 * s)
            for e, r, f in (("exact", 8, 6.6), ("basis", 1, 7.1), ("basis", 8, 6.8)) for s in (0, 1)]


@pytest.fixture
def counted(monkeypatch):
    """Function name → how often it ran: ``table3`` (wherever Compare or the rank figure calls
    it from) and ``summarize`` (as Table 3 calls it)."""
    calls = {"table3": 0, "summarize": 0}

    def counting(name, fn):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(summary, "table3", counting("table3", summary.table3))
    monkeypatch.setattr(method_frames, "table3", counting("table3", method_frames.table3))
    monkeypatch.setattr(summary, "summarize", counting("summarize", summary.summarize))
    return calls


def test_compare_computes_table3_once_a_render_for_the_figure_and_the_table(url, store, counted, downloads):
    ids = _lab(store)
    at = app(selected=ids).run()
    counted["table3"] = 0
    page(at, "compare")
    assert counted["table3"] == 1
    rank = figures(at)["Validation loss against rank R"]
    assert [t["name"] for t in rank["data"] if t.get("showlegend") is not False] == ["exact (mean ± std of 2 seeds)",
                                                                                     "basis"]
    assert len(at.dataframe[0].value) == 3  # exact, basis R=1, basis R=8
    assert {"basis-table3.md", "basis-table3.tex", "basis-table3.csv"} <= set(downloads)  # deferred: not written yet
    at.run()  # a rerun that changes nothing the table reads
    assert counted["table3"] == 1
    at.number_input(key="compare.margin").set_value(0.05).run()  # a new margin: the table again, once
    assert counted["table3"] == 2 and "90% CI vs ±0.05" in at.dataframe[0].value

def test_the_rank_figure_draws_the_rows_of_the_table3_it_is_given(tmp_path):
    from storage import RunStore

    store = RunStore(f"sqlite:///{tmp_path / 'given.db'}")
    ids = _lab(store)
    records, metrics = store.runs.list_runs(), store.metrics(ids)
    for quantity in method_frames.RANK_QUANTITIES:
        own = method_frames.rank_frame(records, metrics, quantity, 20)
        given = table3(records, metrics, 20, margin=0.5, adjust=False)  # another margin: the same rows
        pd.testing.assert_frame_equal(method_frames.rank_frame(records, metrics, quantity, 20, table=given), own)
    fewer = given[given["estimator"] != "exact"]
    shown = method_frames.rank_frame(records, metrics, "val_loss", 20, table=fewer)
    assert "exact" not in set(shown["estimator"]) and len(shown) == len(own) - 1
    store.close()


def test_table3_summarizes_all_groups_read_at_one_step_at_once(tmp_path, counted):
    from storage import RunStore

    store = RunStore(f"sqlite:///{tmp_path / 'setups.db'}")
    write_setups(store, 30)  # 30 setups, one run each, all read at their last step
    records = store.runs.list_runs()
    table = summary.table3(records, store.metrics([r.id for r in records]))
    assert len(table) == 30 and set(table["step"]) == {100}
    assert counted["summarize"] == 1
    store.close()
