"""In real Chromium at 1,400 and 420 px: Compare charts a metric picked from every metric
the runs recorded (system metrics too) and keeps it in its URL; Run detail shows the
run's system metrics. ``BASIS_LAB_SHOTS`` (a folder) keeps the screenshots."""

import dataclasses
import os
from pathlib import Path

import pytest

from storage import RunStore
from tests.app.test_browser_zoom import CHART
from tests.support.browser import dashboard_page
from tests.support.runs import TINY, fake_run, wait_for

OVERFLOW = "() => document.documentElement.scrollWidth"
WIDTH = """(title) => Math.max(...Array.from(document.querySelectorAll('.js-plotly-plot'))
    .filter(gd => gd.layout && gd.layout.title && gd.layout.title.text === title)
    .map(gd => gd.getBoundingClientRect().right))"""  # where the chart ends, in px from the left
SETTLED = "() => !document.querySelector('[data-stale=\"true\"]')"  # no element waits to be redrawn


@pytest.mark.browser
def test_compare_charts_a_picked_metric_and_detail_shows_system_metrics(tmp_path, token_cache):
    shots = Path(os.environ.get("BASIS_LAB_SHOTS") or tmp_path)
    url = f"sqlite:///{tmp_path / 'metrics.db'}"
    store = RunStore(url)
    ids = [fake_run(store, dataclasses.replace(TINY, rank=8, seed=s), system=True) for s in range(2)]
    ids.append(fake_run(store, dataclasses.replace(TINY, estimator="exact"), system=True))
    store.close()
    seen = {}
    with dashboard_page(url, token_cache, tmp_path / "streamlit.log") as (port, page):
        page.goto(f"http://127.0.0.1:{port}/compare?runs={','.join(map(str, ids))}&metrics=sys/cpu_percent")
        cpu = wait_for(lambda: page.evaluate(CHART, "Process CPU"), timeout=180, what="the CPU chart")
        seen["cpu traces"] = sorted(t["name"] for t in cpu["traces"] if "std" not in t["name"])
        picker = page.locator('[data-testid="stMultiSelect"]').filter(has_text="Chart metrics").locator("input")
        picker.click()
        picker.fill("rss_mib")
        page.get_by_role("option").filter(has_text="sys/rss_mib").first.click()
        page.wait_for_function(
            "() => new URL(location.href).searchParams.get('metrics') === 'sys/cpu_percent,sys/rss_mib'")
        wait_for(lambda: page.evaluate(CHART, "Process resident memory"), timeout=60, what="the RSS chart")
        page.keyboard.press("Escape")  # the picker's list closes
        page.wait_for_function(SETTLED)
        page.get_by_text("Any metric", exact=True).scroll_into_view_if_needed()
        page.screenshot(path=str(shots / "compare-metrics-1400.png"), full_page=True)
        page.set_viewport_size({"width": 420, "height": 900})  # a phone opens the link
        page.goto(page.url)
        wait_for(lambda: page.evaluate(CHART, "Process resident memory"), timeout=120, what="the RSS chart")
        wait_for(lambda: page.evaluate(CHART, "Process CPU"), timeout=120, what="the CPU chart")
        page.get_by_text("Any metric", exact=True).scroll_into_view_if_needed()
        page.wait_for_function(SETTLED)
        seen["compare width at 420"] = page.evaluate(OVERFLOW)
        seen["chart width at 420"] = page.evaluate(WIDTH, "Process CPU")
        page.screenshot(path=str(shots / "compare-metrics-420.png"), full_page=True)
        for width in (1400, 420):
            page.set_viewport_size({"width": width, "height": 1100})
            page.goto(f"http://127.0.0.1:{port}/detail?run={ids[0]}")
            load = wait_for(lambda: page.evaluate(CHART, "Host load (1 min)"), timeout=120, what="the load chart")
            seen[f"detail {width}"] = (load["plot"]["width"] > 100, page.evaluate(OVERFLOW) <= width)
            page.get_by_text("System", exact=True).scroll_into_view_if_needed()
            page.wait_for_function(SETTLED)
            page.screenshot(path=str(shots / f"detail-system-{width}.png"), full_page=True)
    assert seen["cpu traces"] == ["basis R=8 · mean of 2 seeds", "exact s0"], seen
    assert seen["compare width at 420"] <= 420 and seen["chart width at 420"] <= 420, seen
    assert seen["detail 1400"] == seen["detail 420"] == (True, True), seen
