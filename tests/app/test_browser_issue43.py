"""Issue 43, items 6, 7, 9, 10, 11, 12 and 15 in real Chromium at 1,400 and 420 px (900 px
high): what a user sees of each fix that test_links_issue43.py, test_compare_issue43.py and
test_launch_issue43.py check under AppTest. Launch times a new rank from the model's other
ranks and says so (6), and its relaunch warning says only new seeds add runs (7); the Runs
count under a filter is of the rows shown (9); a link's bad value is one line the user can
see (10); interrupted runs are announced with their cause beside Resume all (11); Compare
charting a sys/* metric carries the system-metrics caveat (12); Run detail tells the first
start from the last resume (15)."""

import dataclasses
from datetime import datetime, timedelta, timezone

import pytest

from app import form, metric_charts
from engine.config import RunConfig
from storage import RunStore
from storage.logs import INFO
from tests.support.browser import BESIDE, choose, dashboard_page
from tests.support.runs import SWEEP_A, SWEEP_B, TINY, InSweep, fake_run

WIDTHS = (1400, 420)
HEIGHT = 900
PAPER = RunConfig(preset="paper", steps=40, eval_interval=10, probe_interval=10, lam=0.01)
GRID_ROWS = """() => {  // the first column's run ids of the page's first table
  const grid = document.querySelector('[data-testid="stDataFrame"]');
  if (!grid) return null;
  return Array.from(grid.querySelectorAll('[role="gridcell"][aria-colindex="1"], td[aria-colindex="1"]'))
    .map(c => c.innerText.trim()).filter(t => /^[0-9]+$/.test(t)).length;
}"""
GRID_TEXT = """() => Array.from(document.querySelectorAll('[data-testid="stDataFrame"]'))
  .map(g => Array.from(g.querySelectorAll('[role="gridcell"], td')).map(c => c.innerText.trim()).join(' | '))
  .join(' || ')"""



def _seen(page, text: str) -> bool:
    """``text`` (its first match) is visible, in the viewport or once scrolled to."""
    hit = page.get_by_text(text).filter(visible=True).first  # not a folded expander's copy
    hit.wait_for()
    hit.scroll_into_view_if_needed()
    box = hit.bounding_box()
    return hit.is_visible() and box is not None and box["width"] > 0 and 0 <= box["y"] < HEIGHT


def _enter(page, label: str, value: str) -> None:
    box = page.get_by_label(label, exact=True)
    box.fill(value)
    box.press("Enter")


@pytest.mark.browser
def test_launch_times_a_new_rank_from_other_ranks_and_the_relaunch_warning_names_new_seeds(tmp_path, token_cache):
    url = f"sqlite:///{tmp_path / 'launch.db'}"
    store = RunStore(url)
    for config in [dataclasses.replace(PAPER, estimator="exact", lam=0.0)] + [
            dataclasses.replace(PAPER, rank=r) for r in (1, 8, 16, 32, 64)]:
        fake_run(store, config)  # six finished runs of the paper's model; R = 4 is new
    for config in form.DEFAULT_SWEEP.expand()[:2]:
        fake_run(store, config, status="queued", steps_done=0)  # the default grid, partly in the database already
    store.close()
    seen = {}
    with dashboard_page(url, token_cache, tmp_path / "streamlit.log", height=HEIGHT) as (port, page):
        for width in WIDTHS:
            page.set_viewport_size({"width": width, "height": HEIGHT})
            page.goto(f"http://127.0.0.1:{port}/launch")
            again = page.locator('[data-testid="stAlert"]').filter(has_text="already in the database").first
            again.wait_for()
            text = again.inner_text()
            seen[f"7 new seeds, {width}"] = "new seeds add runs" in text and "(or steps)" not in text
            seen[f"7 visible, {width}"] = _seen(page, "new seeds add runs")

            choose(page, "stSelectbox", "Model preset", "paper")
            _enter(page, "Ranks R (comma list)", "exact, 4")
            scaled = page.get_by_text("Scaled from other ranks: basis R=4: interpolated between R=1 and R=8")
            seen[f"6 scaled, {width}"] = _seen(page, "Scaled from other ranks: basis R=4: interpolated between R=1 "
                                                     "and R=8")
            seen[f"6 known, {width}"] = (page.get_by_text("Estimated time ≈").filter(visible=True).count() >= 1
                                         and page.get_by_text("Estimated time: unknown").filter(visible=True).count()
                                         == 0)
            assert scaled.count() >= 1
    assert seen == {f"{item}, {w}": True for w in WIDTHS for item in ("7 new seeds", "7 visible", "6 scaled",
                                                                       "6 known")}, seen


def _lab(url: str) -> dict:
    store = RunStore(url)
    pilot, ablation = InSweep(store, SWEEP_A, ["pilot"]), InSweep(store, SWEEP_B, ["ablation"])
    runs = {"exact": fake_run(pilot, dataclasses.replace(TINY, estimator="exact")),
            "r8": fake_run(pilot, dataclasses.replace(TINY, rank=8), status="failed", steps_done=20, error="boom"),
            "r32": fake_run(pilot, TINY),
            "s4": fake_run(ablation, dataclasses.replace(TINY, rank=4), system=True),
            "s16": fake_run(ablation, dataclasses.replace(TINY, rank=16), system=True),
            "fresh": fake_run(ablation, dataclasses.replace(TINY, rank=2), status="running", steps_done=0),
            "resumed": fake_run(ablation, dataclasses.replace(TINY, rank=64), status="running", steps_done=10)}
    store.runs.set_status(runs["fresh"], "interrupted", error="interrupted before it started; resume it to train it",
                     cause="signal")
    run_id = runs["resumed"]
    store.runs.set_status(run_id, "interrupted", error="interrupted by a signal", cause="signal")
    first = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    store.logs.add_run_logs(run_id, [(first, INFO, "claimed by host:1 (lease 1)", "lab"),
                                (first + timedelta(seconds=5), INFO, "step 10", "lab")])
    store.queue.requeue([run_id])
    assert store.queue.claim(run_id, "host:2")  # the resume: running again now
    store.logs.add_run_logs(run_id, [(INFO, "claimed by host:2 (lease 3)")])
    store.close()
    return runs


@pytest.mark.browser
def test_runs_compare_and_detail_show_counts_warnings_caveats_and_starts(tmp_path, token_cache):
    url = f"sqlite:///{tmp_path / 'lab.db'}"
    lab = _lab(url)
    seen = {}
    with dashboard_page(url, token_cache, tmp_path / "streamlit.log", height=HEIGHT) as (port, page):
        base = f"http://127.0.0.1:{port}"
        for width in WIDTHS:
            page.set_viewport_size({"width": width, "height": HEIGHT})

            page.goto(f"{base}/runs")  # 11: the notice, its cause, Resume all beside it
            notice = page.locator('[data-testid="stAlert"]').filter(has_text="interrupted").first
            notice.wait_for()
            page.get_by_role("button", name="Resume all").wait_for()
            text = notice.inner_text()
            seen[f"11 cause, {width}"] = ("1 run was interrupted" in text and "process was stopped" in text
                                          and "Resume all continues" in text) or text
            seen[f"11 beside, {width}"] = page.evaluate(BESIDE) is not None
            seen[f"11 visible, {width}"] = _seen(page, "process was stopped")

            page.goto(f"{base}/runs?sweep={SWEEP_A}")  # 9: the count is of the rows shown
            caption = page.get_by_text("runs match the filters").first
            caption.wait_for()
            page.wait_for_function(f"() => ({GRID_ROWS})() === 3")
            seen[f"9 count, {width}"] = caption.inner_text().split(" — ")[0]  # less the time left of the running run
            seen[f"9 rows, {width}"] = page.evaluate(GRID_ROWS)

            for link, said in (  # 10: a bad value of a link is one line the user sees
                    ("runs?status=bogus", "The link's status 'bogus' is not a run status"),
                    ("nosuchpage", "There is no page 'nosuchpage'; the pages are"),
                    (f"compare?runs={lab['s4']},{lab['s16']}&group=nonexistent",
                     "group='nonexistent' is not a field to colour by")):
                page.goto(f"{base}/{link}")
                seen[f"10 {link.split('?')[0]}, {width}"] = _seen(page, said)

            # 12: a sys/* metric charted on Compare carries the caveat under it
            page.goto(f"{base}/compare?runs={lab['s4']},{lab['s16']}&metrics=sys/cpu_percent")
            seen[f"12 caveat, {width}"] = _seen(page, metric_charts.SYSTEM_NOTE[:60])

            page.goto(f"{base}/detail?run={lab['resumed']}")  # 15: first start, last resume
            page.get_by_text("Environment").first.wait_for()
            page.wait_for_function(f"() => ({GRID_TEXT})().includes('last resumed (UTC)')")
            grid = page.evaluate(GRID_TEXT)
            seen[f"15 first, {width}"] = "first started (UTC) | 2026-01-02 03:04:05" in grid
            seen[f"15 last, {width}"] = "last resumed (UTC) | 20" in grid and "never resumed" not in grid
    expected = {}
    for w in WIDTHS:
        expected.update({f"11 cause, {w}": True, f"11 beside, {w}": True, f"11 visible, {w}": True,
                         f"9 count, {w}": "2 finished · 1 failed · 3 of 7 runs match the filters", f"9 rows, {w}": 3,
                         f"10 runs, {w}": True, f"10 nosuchpage, {w}": True, f"10 compare, {w}": True,
                         f"12 caveat, {w}": True, f"15 first, {w}": True, f"15 last, {w}": True})
    assert seen == expected, seen
