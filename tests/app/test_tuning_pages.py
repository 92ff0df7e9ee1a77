"""A tuning campaign on the dashboard: Launch's "Tune, then compare" mode (its inputs, its
one-line errors under the field, its plan before anything is written, a launch that stores the
campaign and its trials for workers), Compare's section for a campaign (the sensitivity figure,
the chosen values, Table 3 tuned and untuned a tab apart) and the report's protocol section.
Under AppTest, and in real Chromium at 1,400 and 420 px; ``BASIS_LAB_SHOTS`` (a folder, e.g.
docs/screenshots) keeps the browser's screenshots (``tune-<page>-<width>.png``)."""

import os
from pathlib import Path

import pytest

from app.text import plain
from engine.analysis.tuning_charts import CHOSEN, DIVERGED
from engine.reads import reports
from storage import RunStore
from tests.app.test_browser_zoom import CHART as ZOOM_CHART
from tests.engine.test_tuning_report import make_campaign
from tests.support.browser import dashboard_page
from tests.support.pages import app, button, figures, page, store, url  # noqa: F401  (fixtures)
from tests.support.runs import wait_for

FIGURE = "Validation loss against lr, each method's trials"
OVERFLOW = "() => document.documentElement.scrollWidth"
SETTLED = "() => !document.querySelector('[data-stale=\"true\"]')"
TALL = "() => document.querySelector('[data-testid=\"stMain\"]').scrollHeight"
# the zoom test's chart reader, with a title a narrow page wraps (<br>) read as one line
CHART = ZOOM_CHART.replace(".replace(/<[^>]*>/g, '')", ".replace(/<br>/g, ' ').replace(/<[^>]*>/g, '')")


def _tune(at):
    at.segmented_control(key="launch.mode").set_value("tune").run()
    at.text_input(key="launch.ranks").input("8")
    at.number_input(key="launch.steps").set_value(20)
    at.number_input(key="launch.tune.trials").set_value(3)
    at.text_input(key="launch.tune.eval_seeds").input("0, 1")
    return at.run()


def test_the_tune_mode_shows_its_plan_and_says_a_bad_input_under_its_field(url, store):
    at = _tune(page(app().run(), "launch"))
    assert not at.exception and not at.error
    assert "Tune, then compare: 6 trial runs" in [s.value for s in at.subheader]
    plan = plain("2 methods × 3 trials × 1 tuning seed(s) = 6 trial runs; budget 60 steps per method")
    assert any(plan in m.value for m in at.markdown)
    assert not [t for t in at.text_input if t.key == "launch.seeds"]  # the protocol's seeds replace the grid's
    tuning = next(e for e in at.expander if e.label.startswith("Tuning"))
    for key, bad, said in (("launch.tune.fields", "lr=0.1:0.01", "Fields to tune: lr=0.1:0.01: a range is LOW:HIGH"),
                           ("launch.tune.eval_seeds", "1000", "tuning and evaluation seeds overlap (1000)"),
                           ("launch.tune.tune_seeds", "x", "Tuning seeds: 'x' is not a seed")):
        before = at.text_input(key=key).value
        at.text_input(key=key).input(bad).run()
        tuning = next(e for e in at.expander if e.label.startswith("Tuning"))
        [under] = [e.value for e in tuning.error]  # one line, under its field
        assert plain(said) in under and "\n" not in under, under
        assert not [b for b in at.button if b.label.startswith(("Launch", "Queue"))]
        at.text_input(key=key).input(before).run()
    assert not at.error and button(at, "Launch 6 trial runs")
    assert store.runs.list_runs() == [] and store.campaigns.list() == []


def test_a_campaign_launched_from_the_form_for_workers_is_stored_with_its_trials(url, store):
    at = _tune(page(app().run(), "launch"))
    at.toggle(key="launch.tune.queue_only").set_value(True).run()
    button(at, "Queue 6 trial runs").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    [campaign] = store.campaigns.list()
    trials, comparison = store.campaigns.runs_of(campaign.id)
    assert len(trials) == 6 and comparison == [] and campaign.stage == "tuning"
    runs = [store.runs.get_run(i) for i in trials]
    assert {r.status for r in runs} == {"queued"} and {r.owner for r in runs} == {None}  # for any worker
    assert campaign.spec["eval_seeds"] == [0, 1] and campaign.spec["trials"] == 3
    assert any(f"Campaign {campaign.id}: queued 6 trial runs for workers" in s.value for s in at.success)


def test_compare_shows_a_campaigns_sensitivity_figure_choices_and_both_tables(url, store):
    cid, spec = make_campaign(store)
    ids = store.campaigns.runs_of(cid)[1]
    at = page(app(selected=ids).run(), "compare")
    assert plain(f"Tuning campaign {cid}: lr fair fight") in [s.value for s in at.subheader]
    fig = figures(at)[FIGURE]
    assert fig["layout"]["xaxis"]["type"] == "log"
    names = [t["name"] for t in fig["data"] if t.get("showlegend") is not False]
    assert names == ["exact", "basis R=8", CHOSEN, DIVERGED]
    assert [t.label for t in at.tabs] == ["Each at its best value (tuned)", "At the untuned value"]
    chosen = next(d.value for d in at.dataframe if "tuning val loss" in d.value.columns)
    assert list(chosen["method"]) == ["exact", "basis R=8"]
    table = next(d.value for d in at.dataframe if "tuned" in d.value.columns)
    assert set(table["split"]) == {"test"}
    at = page(app(selected=store.campaigns.runs_of(cid)[0]).run(), "compare")  # its trials show it too
    assert FIGURE in figures(at)


def _shot(page_, path: Path, width: int) -> None:
    """The whole page: the window as tall as Streamlit's main area, so nothing scrolls inside it."""
    tall = page_.evaluate(TALL)
    page_.set_viewport_size({"width": width, "height": min(int(tall) + 40, 16_000)})
    page_.wait_for_timeout(1_500)
    page_.screenshot(path=str(path), full_page=True)
    page_.set_viewport_size({"width": width, "height": 1000})


def _launch(page_, port, seen, width, shots):
    page_.goto(f"http://127.0.0.1:{port}/launch")
    page_.get_by_text("Launch a sweep", exact=True).wait_for()
    page_.get_by_text("Tune, then compare", exact=True).click()
    page_.get_by_text("Trials per method", exact=True).wait_for()
    for label, value in (("Ranks R (comma list)", "8"), ("Steps", "20"), ("Trials per method", "3"),
                         ("Evaluation seeds", "0, 1")):
        box = page_.get_by_label(label, exact=True)
        box.fill(value)
        box.press("Enter")
    page_.get_by_text("Tune, then compare: 6 trial runs").wait_for()
    page_.wait_for_function(SETTLED)
    seen[f"launch width {width}"] = page_.evaluate(OVERFLOW) <= width
    if width == 1400:
        page_.get_by_text("Queue for workers", exact=True).click()
        page_.get_by_role("button", name="Queue 6 trial runs").click()
        page_.get_by_text("queued 6 trial runs for workers").wait_for()
    page_.wait_for_function(SETTLED)
    _shot(page_, shots / f"tune-launch-{width}.png", width)


def _compare(page_, port, seen, width, shots, sweep):
    page_.goto(f"http://127.0.0.1:{port}/compare?sweep={sweep}")
    fig = wait_for(lambda: page_.evaluate(CHART, FIGURE), timeout=180, what="the sensitivity figure")
    seen[f"compare traces {width}"] = [t["name"] for t in fig["traces"] if not t["name"].endswith("trials")]
    seen[f"compare width {width}"] = page_.evaluate(OVERFLOW) <= width and fig["plot"]["width"] > 150
    page_.get_by_role("tab", name="At the untuned value").click()
    page_.wait_for_function(SETTLED)
    page_.get_by_role("tab", name="Each at its best value (tuned)").click()
    page_.wait_for_function(SETTLED)
    _shot(page_, shots / f"tune-compare-{width}.png", width)


def _report(page_, port, seen, width, shots, report_id, cid):
    page_.goto(f"http://127.0.0.1:{port}/report?id={report_id}")
    page_.get_by_text(f"Protocol: tuning campaign {cid}").first.wait_for()
    fig = wait_for(lambda: page_.evaluate(CHART, FIGURE), timeout=180, what="the report's sensitivity figure")
    page_.get_by_text("Table 3, every method at the untuned value").first.wait_for()
    page_.wait_for_function(SETTLED)
    seen[f"report {width}"] = page_.evaluate(OVERFLOW) <= width and fig["plot"]["width"] > 150
    _shot(page_, shots / f"tune-report-{width}.png", width)


@pytest.mark.browser
def test_the_tune_mode_compare_and_the_report_in_chromium_at_1400_and_420(tmp_path, token_cache):
    shots = Path(os.environ.get("BASIS_LAB_SHOTS") or tmp_path)
    url = f"sqlite:///{tmp_path / 'tune.db'}"
    store = RunStore(url)
    cid, _ = make_campaign(store)
    sweep = store.campaigns.get(cid).eval_sweep_id
    report_id = reports.save(store, reports.build(store, reports.selection_of(sweep=sweep)))
    store.close()
    seen: dict = {}
    with dashboard_page(url, token_cache, tmp_path / "streamlit.log") as (port, page_):
        for width in (1400, 420):
            page_.set_viewport_size({"width": width, "height": 1000})
            _launch(page_, port, seen, width, shots)
            _compare(page_, port, seen, width, shots, sweep)
            _report(page_, port, seen, width, shots, report_id, cid)
    store = RunStore(url)
    launched = [c for c in store.campaigns.list() if c.id != cid]
    assert len(launched) == 1 and len(store.campaigns.runs_of(launched[0].id)[0]) == 6
    store.close()
    expected = ["exact", "basis R=8", CHOSEN, DIVERGED]
    assert seen == {"launch width 1400": True, "compare traces 1400": expected, "compare width 1400": True,
                    "report 1400": True, "launch width 420": True, "compare traces 420": expected,
                    "compare width 420": True, "report 420": True}, seen
