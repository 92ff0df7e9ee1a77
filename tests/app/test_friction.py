"""The friction a new user met on the pages (issue 29): distinct colours by default, an
honest pooled label while a seed trains, facets that share their x axis, one progress
summary with an ETA instead of a bar per run."""

from __future__ import annotations

import dataclasses

import pytest

from engine.analysis import charts, frames, method_frames
from engine.analysis.summary import summarize
from storage import RunStore
from tests.support.pages import app, button, page, read, store, url  # noqa: F401 (fixtures)
from tests.support.runs import TINY, fake_run

PAPER_RANKS = (1, 8, 16, 32, 64)


@pytest.fixture
def lab(tmp_path):
    store = RunStore(f"sqlite:///{tmp_path / 'p.db'}")
    yield store
    store.close()


def _runs(store, configs, **kw):
    return [store.runs.get_run(fake_run(store, c, **kw)) for c in configs]


def test_every_chart_tells_the_ranks_of_one_estimator_apart_by_default(lab):
    configs = [dataclasses.replace(TINY, estimator="exact")]
    configs += [dataclasses.replace(TINY, rank=r, lam=0.01) for r in PAPER_RANKS]
    records = _runs(lab, configs)
    metrics = lab.metrics([r.id for r in records])
    info = frames.describe_runs(records)
    colours = dict(zip(info["rank"].fillna(0).astype(int), info["color"]))
    assert colours[0] == charts.EXACT_COLOR
    sketched = [colours[r] for r in PAPER_RANKS]
    assert len(set(sketched)) == len(PAPER_RANKS) and charts.EXACT_COLOR not in sketched
    assert sketched == list(charts.METHOD_PALETTE[:len(PAPER_RANKS)])  # R in order: blue, orange, green, red, purple

    curves = charts.line_figure(frames.series(metrics, info, "val_loss"), y_title="loss")
    assert len({t.line.color for t in curves.data}) == len(configs)
    memory = frames.memory_frame(summarize(records, metrics), info)
    assert memory.groupby("trace")["color"].first().nunique() == len(configs)  # the memory bars too
    rank = method_frames.rank_frame(records, metrics, "val_loss")
    by_rank = rank[rank["estimator"] != "exact"].set_index("rank")["color"]
    assert [by_rank[r] for r in PAPER_RANKS] == sketched  # the rank figure's points match the curves
    points = next(t for t in charts.rank_figure(rank, y_title="loss").data if t.error_y.array is not None)
    assert list(points.marker.color) == sketched
    assert charts.method_colors([("basis", 8, 0.01), ("basis", 8.0, 0.01)]) == charts.method_colors([("basis", 8, 0.01)])


def test_a_pooled_curve_says_which_seeds_are_still_training(lab):
    r8 = dataclasses.replace(TINY, rank=8)
    records = _runs(lab, [dataclasses.replace(r8, seed=0)])
    records += _runs(lab, [dataclasses.replace(r8, seed=1)], status="running", steps_done=20)
    records += _runs(lab, [dataclasses.replace(r8, seed=2)], status="queued", steps_done=0)
    info = frames.describe_runs(records)
    metrics = lab.metrics([r.id for r in records])
    metrics = metrics[metrics["run_id"] != records[2].id]
    s = frames.series(metrics, info, "val_loss")
    assert set(s["trace"]) == {"basis R=8 · mean of 2/3 seeds (1 still training, 1 queued)"}
    assert s.loc[s["x"] > 20, "n"].eq(1).all()  # past the running seed's step: one seed
    done = frames.describe_runs([records[0], dataclasses.replace(records[1], status="finished")])
    assert set(frames.trace_labels(done, pool_seeds=True)) == {"basis R=8 · mean of 2 seeds"}


@pytest.mark.parametrize("x", ["step", "wall_time"])
def test_facet_panels_share_their_x_axis(lab, x):
    records = _runs(lab, [dataclasses.replace(TINY, rank=8, lr=lr) for lr in (0.01, 0.02, 0.04, 0.08)])
    info = frames.describe_runs(records)
    metrics = lab.metrics([r.id for r in records])
    panels = {name: frames.series(metrics, part, "val_loss", x=x) for name, part in frames.facets(info, "lr").items()}
    fig = charts.panels_figure(panels, x=x, y_title="loss")
    axes = sorted(k for k in fig.layout.to_plotly_json() if k.startswith("xaxis"))
    assert len(axes) >= 4 and all(fig.layout[a].matches == "x" for a in axes[1:])
    assert fig.layout.xaxis.matches is None


def test_compare_shows_one_progress_summary_with_the_time_left_not_a_bar_per_run(url, store):
    ids = [fake_run(store, dataclasses.replace(TINY, rank=r, seed=s)) for r in (1, 8) for s in (0, 1)]
    ids += [fake_run(store, dataclasses.replace(TINY, rank=32, seed=s), status="running", steps_done=20) for s in (0, 1)]
    ids += [fake_run(store, dataclasses.replace(TINY, rank=64, seed=s), status="queued", steps_done=0) for s in (0, 1)]
    at = page(app(selected=ids).run(), "compare")
    bars = at.get("progress")
    assert len(bars) == 1  # one summary, not one bar per queued or running run
    text = bars[0].proto.text.replace("\\", "")  # markdown escapes of plain text
    assert text.startswith("4 finished · 2 training · 2 queued — 200 of 320 steps (62 %) — about ")
    assert "left at 200 steps/s" in text  # two running runs at 100 steps/s each


def test_compares_run_filter_is_kept_in_the_page_url(url, store):
    ids = [fake_run(store, dataclasses.replace(TINY, rank=r)) for r in (1, 8, 32)]
    at = page(app(selected=ids).run(), "compare")
    at.text_input(key="compare.where").input("rank >= 8").run()
    assert at.session_state["compare.pick"] == ids[1:]
    written = {k: (v[0] if isinstance(v, list) else v) for k, v in dict(at.query_params).items()}
    assert written["where"] == "rank >= 8" and written["runs"] == f"{ids[1]},{ids[2]}"

    linked = _compare_at({"where": "rank >= 8"})  # a link with the filter alone: the runs it matches now
    assert linked.text_input(key="compare.where").value == "rank >= 8"
    assert linked.session_state["compare.pick"] == ids[1:]
    later = fake_run(store, dataclasses.replace(TINY, rank=64))
    reopened = _compare_at(written)  # with its run list: exactly those runs, the filter text shown
    assert reopened.session_state["compare.pick"] == ids[1:] and later not in reopened.session_state["compare.pick"]
    assert reopened.text_input(key="compare.where").value == "rank >= 8"


def _compare_at(query: dict):
    at = app()
    at.query_params.update(query)
    at.switch_page("views/compare.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_the_launch_form_shows_every_error_at_once(url, store):
    at = page(app().run(), "launch")
    at.text_input(key="launch.lams").input("1.5")
    at.text_input(key="launch.seeds").input("zero")
    at.number_input(key="launch.steps").set_value(0).run()
    expected = {"Shrink λ must be in [0, 1) (got 1.5)", "Seeds: 'zero' is not a seed (integers >= 0: 0,1,2 or 0-4)",
                "Steps must be an integer >= 1 (got 0)"}
    shown = [read(e.value) for e in at.error]
    [summary] = [e for e in shown if e.startswith("Fix the")]  # beside the form
    assert {e for e in shown if e != summary} == expected  # and under each field, in its group
    assert summary.startswith("Fix the 3 fields marked in the form:") and all(t in summary for t in expected)
    assert not [b for b in at.button if b.label.startswith("Launch")]


def test_the_launch_form_warns_naming_the_runs_a_launch_would_repeat(url, store):
    from app import form

    repeated = [fake_run(store, c, status="queued", steps_done=0) for c in form.DEFAULT_SWEEP.expand()[:2]]
    at = app().run()
    at.switch_page("views/launch.py").run()  # (page() would refuse its warning)
    again = [read(w.value) for w in at.warning if "already in the database" in w.value]
    assert len(again) == 1 and again[0].startswith(f"2 of the {len(form.DEFAULT_SWEEP.expand())} runs to launch")
    assert all(f"#{i} {store.runs.get_run(i).name} (queued)" in again[0] for i in repeated)
    assert not button(at, "Launch").disabled  # a warning, not a refusal
