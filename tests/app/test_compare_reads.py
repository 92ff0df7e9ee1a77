"""What the Compare page reads: only the metrics its charts draw (the loss, mean-cosine,
memory, rank and Table 3 ones, each layer's cosine while "per layer" is on, and the metrics
chosen under "Any metric"), the names it offers from one query, and Table 3 computed once
per state of the data, not again for each control."""

import dataclasses

from engine.analysis import method_frames, summary
from tests.support.pages import app, figures, page, store, url  # noqa: F401 (fixtures)
from tests.support.runs import LAYERS, TINY, fake_run

SYSTEM = {"sys/cpu_percent", "sys/rss_mib"}  # recorded, drawn only when chosen (sys/load1 is Table 3's)


def _feed(at):
    """The metrics feed the page read its rows from (one of a name list)."""
    feeds = [v for k, v in at.session_state.items() if k.startswith("metrics_feed::") and k.endswith("::named")]
    assert len(feeds) == 1
    return feeds[0]


def _lab(store):
    return [fake_run(store, dataclasses.replace(TINY, estimator=e, rank=8, seed=s), system=True, breakdown=True)
            for e in ("exact", "basis") for s in (0, 1)]


def test_compare_reads_the_drawn_metrics_only_and_offers_every_recorded_one(url, store):
    ids = _lab(store)
    at = page(app(selected=ids).run(), "compare")
    read = set(_feed(at).frame["name"])
    recorded = set(store.metrics.metric_names(ids))
    assert {"val_loss", "train_loss", "cos_mean", "mem_saved_bytes", "mem_bytes/nonlinearity", "sys/load1"} <= read
    assert not read & SYSTEM and not any(n.startswith(("cos/", "rel_err")) for n in read)
    assert set(at.multiselect(key="compare.metrics").options) == recorded  # offered: every name recorded
    assert "Saved for backward, by category" in figures(at)  # the breakdown still drawn

    at.multiselect(key="compare.metrics").set_value(["sys/cpu_percent"]).run()
    assert not at.exception
    assert set(_feed(at).frame["name"]) == read | {"sys/cpu_percent"}
    drawn = figures(at)
    assert any("CPU" in title for title in drawn)
    at.toggle(key="compare.per_layer").set_value(True).run()
    assert {f"cos/{n}" for n in LAYERS} <= set(_feed(at).frame["name"])
    assert "Cosine per sketched layer" in figures(at)


def test_table3_is_computed_once_per_state_of_the_data(url, store, monkeypatch):
    ids = _lab(store)
    at = page(app(selected=ids).run(), "compare")
    calls = []
    made = summary.table3

    def counted(*args, **kwargs):
        calls.append(1)
        return made(*args, **kwargs)

    monkeypatch.setattr(summary, "table3", counted)  # the page imports it afresh each run
    monkeypatch.setattr(method_frames, "table3", counted)  # the rank figure's
    shown = at.dataframe[0].value
    at.slider(key="compare.smoothing").set_value(0.5).run()  # a control that changes no number of the table
    assert not at.exception and at.dataframe[0].value.equals(shown)
    assert calls == []  # neither the table nor the rank figure recomputed it
    at.number_input(key="compare.margin").set_value(0.5).run()  # a new margin: the table anew, the figure kept
    assert not at.exception and len(calls) == 1


def test_a_render_reads_the_runs_once(url, store, monkeypatch):
    from storage.runs import RunsRepository

    ids = _lab(store)
    at = page(app(selected=ids).run(), "compare")
    calls = []
    made = RunsRepository.list_runs

    def counted(self, *args, **kwargs):
        calls.append(1)
        return made(self, *args, **kwargs)

    monkeypatch.setattr(RunsRepository, "list_runs", counted)
    shown = at.dataframe[0].value
    at.slider(key="compare.smoothing").set_value(0.5).run()  # a rerun of the whole page
    assert not at.exception and at.dataframe[0].value.equals(shown)
    assert len(calls) == 1  # the page's read, handed to its live part (before: read there again)
