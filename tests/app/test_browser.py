"""End to end in a real browser: start `streamlit run app/main.py` on a free port, drive
headless Chromium (Debian's, through Playwright) to launch a tiny sweep from the form,
and wait until the Compare page's validation-loss chart shows every run's points.

Chromium comes from ``scripts/install_browser.sh`` (``make test`` runs it; this test runs
it too when no browser is found). The test skips, saying why, only when no Chromium can
be found or installed, or Playwright is missing.
"""

import os
import re
import time

import pytest

from storage import RunStore
from tests.support.browser import CHROMIUM_ARGS, playwright_and_chromium, streamlit_server

STEPS, EVAL = 4, 2  # two runs (exact and basis R=1), validation at steps 0, 2, 4
EXPECTED = [["basis R=1 s0", 3], ["exact s0", 3]]


VALIDATION_POINTS = """() => {
  for (const gd of document.querySelectorAll('.js-plotly-plot')) {
    const title = ((gd.layout && gd.layout.title && gd.layout.title.text) || '').replace(/<[^>]*>/g, '');
    if (title !== 'Validation loss') continue;
    const traces = (gd._fullData || []).map(t => [t.name, Array.from(t.y || []).filter(Number.isFinite).length]);
    return {traces: traces, drawn: gd.querySelectorAll('.scatterlayer .trace .points path').length};
  }
  return null;
}"""


@pytest.mark.browser
def test_launch_a_tiny_sweep_and_watch_it_on_compare(tmp_path, token_cache):
    sync_playwright, chromium = playwright_and_chromium()

    url = f"sqlite:///{tmp_path / 'browser.db'}"
    env = dict(os.environ, BASIS_LAB_DB_URL=url, BASIS_LAB_CACHE=str(token_cache), HF_HUB_OFFLINE="1")
    screenshot = tmp_path / "compare.png"
    with streamlit_server(env, tmp_path / "streamlit.log") as port:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 1100})
                page.set_default_timeout(120_000)
                page.goto(f"http://127.0.0.1:{port}/launch")
                page.get_by_text("Launch a sweep", exact=True).wait_for()
                for label, value in (("Ranks R (comma list)", "1"), ("Steps", STEPS), ("Eval interval", EVAL),
                                     ("Probe interval", EVAL), ("Validation batches", 2)):
                    box = page.get_by_label(label, exact=True)
                    box.fill(str(value))
                    box.press("Enter")
                page.get_by_text("2 runs to launch").wait_for()
                page.get_by_role("button", name=re.compile(r"Launch 2 runs")).click()
                page.get_by_text("Queued 2 runs").wait_for(timeout=600_000)
                page.get_by_role("link", name="Watch them on Compare").click()
                page.get_by_text("Validation loss", exact=True).first.wait_for()

                store = RunStore(url)
                ids = [r.id for r in store.runs.list_runs()]
                assert len(ids) == 2
                deadline = time.monotonic() + 900
                points = None
                while time.monotonic() < deadline:
                    done = all(store.runs.get_run(i).status == "finished" for i in ids)
                    points = page.evaluate(VALIDATION_POINTS)
                    if done and points and sorted(points["traces"]) == EXPECTED and points["drawn"] == 6:
                        break
                    time.sleep(1)
                assert [store.runs.get_run(i).status for i in ids] == ["finished", "finished"]
                assert points and sorted(points["traces"]) == EXPECTED, points
                assert points["drawn"] == 6, points  # every validation point is on the chart
                store.close()
                page.screenshot(path=str(screenshot), full_page=True)
            finally:
                browser.close()
    assert screenshot.stat().st_size > 10_000
    print(f"screenshot: {screenshot}")
