"""In real Chromium: what the pages keep while the reader moves between them (issue 29)."""

import os
import time

import pytest

from storage import RunStore
from tests.support.browser import CHROMIUM_ARGS, dashboard_page, playwright_and_chromium, streamlit_server
from tests.support.runs import TINY, fake_run


@pytest.mark.browser
def test_launch_and_compare_keep_their_values_through_a_visit_to_runs(tmp_path, token_cache):
    """Change Compare's log-y switch and the Launch form, visit Runs for longer than its
    live refresh, come back: both show what the reader set, not their defaults."""
    url = f"sqlite:///{tmp_path / 'form.db'}"
    store = RunStore(url)
    fake_run(store, TINY)
    store.close()
    with dashboard_page(url, token_cache, tmp_path / "streamlit.log") as (port, page):
        page.goto(f"http://127.0.0.1:{port}/compare")
        page.get_by_text("log y", exact=True).click()
        page.wait_for_function("() => new URL(location.href).searchParams.get('log') === '1'")
        page.get_by_role("link", name="Launch").first.click()
        page.get_by_text("Launch a sweep", exact=True).wait_for()
        for label, value in (("Steps", "77"), ("Ranks R (comma list)", "2, 4")):
            box = page.get_by_label(label, exact=True)
            box.fill(value)
            box.press("Enter")
        page.get_by_text("3 runs to launch").wait_for()
        page.get_by_role("link", name="Runs").first.click()
        page.get_by_text("Runs", exact=True).first.wait_for()
        page.locator('[data-testid="stDataFrame"]').first.wait_for()
        time.sleep(13)  # longer than the Runs page's refresh (2 s while runs train, 10 s idle)
        page.get_by_role("link", name="Launch").first.click()
        page.get_by_text("Launch a sweep", exact=True).wait_for()
        page.get_by_text("runs to launch").first.wait_for()
        time.sleep(1)
        kept = {label: page.get_by_label(label, exact=True).input_value()
                for label in ("Steps", "Ranks R (comma list)")}
        page.get_by_role("link", name="Compare").first.click()
        page.get_by_text("Validation loss", exact=True).first.wait_for()
        kept["log y"] = page.locator("label", has_text="log y").locator("input").first.is_checked()
        page.set_viewport_size({"width": 420, "height": 900})  # a phone: the chart toolbar clears the title
        page.wait_for_timeout(2000)
        covered = page.evaluate("""() => Array.from(document.querySelectorAll('.js-plotly-plot')).filter(gd => {
            const [bar, title] = [gd.querySelector('.modebar'), gd.querySelector('.gtitle')];
            if (!bar || !title) return false;  // the toolbar is there, shown on hover or tap
            const [a, b] = [bar.getBoundingClientRect(), title.getBoundingClientRect()];
            return Math.min(a.right, b.right) > Math.max(a.left, b.left)
                && Math.min(a.bottom, b.bottom) > Math.max(a.top, b.top);
        }).map(gd => gd.layout.title.text)""")
    assert kept == {"Steps": "77", "Ranks R (comma list)": "2, 4", "log y": True}, kept
    assert covered == [], f"at 420 px the toolbar covers the title of {covered}"


@pytest.mark.browser
def test_a_zoom_survives_one_run_finishing_and_the_next_starting(tmp_path, token_cache):
    """Compare of a running run and a queued one, the validation chart zoomed: when the first
    finishes and the second starts, the chart is updated in place (its zoom kept: a chart
    that moved on the page was drawn afresh) and nothing above it moves."""
    from tests.app.test_browser_zoom import CHART, LIVE, TITLE, Feeder
    from tests.support.runs import wait_for

    sync_playwright, chromium = playwright_and_chromium()
    url = f"sqlite:///{tmp_path / 'zoom.db'}"
    store = RunStore(url)
    first = fake_run(store, LIVE, status="running", steps_done=200)
    second = fake_run(store, LIVE.replace(estimator="exact"), status="queued", steps_done=0)
    feeder = Feeder(url, [first], step=200)
    env = dict(os.environ, BASIS_LAB_DB_URL=url, BASIS_LAB_CACHE=str(token_cache), HF_HUB_OFFLINE="1")
    try:
        with streamlit_server(env, tmp_path / "streamlit.log") as port:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
                try:
                    page = browser.new_page(viewport={"width": 1400, "height": 1100})
                    page.set_default_timeout(120_000)
                    page.goto(f"http://127.0.0.1:{port}/compare?runs={first},{second}")
                    box = wait_for(lambda: page.evaluate(CHART, TITLE), timeout=180, what="the chart")["plot"]
                    feeder.start()
                    y = box["y"] + box["height"] / 2
                    page.mouse.move(box["x"] + box["width"] * 0.25, y)
                    page.mouse.down()
                    page.mouse.move(box["x"] + box["width"] * 0.75, y, steps=12)
                    page.mouse.up()
                    zoomed = wait_for(lambda: (c := page.evaluate(CHART, TITLE)) and not c["autorange"] and c,
                                      timeout=30, what="the zoom")
                    feeder.halt.set()
                    feeder.join(timeout=10)
                    store.runs.set_status(first, "finished")  # the first ends; the second starts and trains
                    store.runs.set_status(second, "running")
                    feeder = Feeder(url, [second], step=0)
                    feeder.start()
                    wait_for(lambda: (c := page.evaluate(CHART, TITLE)) and any(t["points"] > 1 and t["name"].startswith(
                        "exact") for t in c["traces"]), timeout=60, what="the second run's points")
                    time.sleep(3)
                    after = page.evaluate(CHART, TITLE)
                    page.screenshot(path=str(tmp_path / "compare-next.png"), full_page=True)
                finally:
                    browser.close()
    finally:
        feeder.halt.set()
        store.close()
    assert after["autorange"] is False and after["xrange"] == pytest.approx(zoomed["xrange"]), (zoomed, after)
    assert after["plot"]["y"] == pytest.approx(zoomed["plot"]["y"], abs=2), (zoomed["plot"], after["plot"])  # no jump
