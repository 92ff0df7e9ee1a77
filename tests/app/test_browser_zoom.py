"""A live chart keeps what the reader did to it: in real Chromium, on the Compare page of
two running runs that keep writing validation losses, zoom the validation-loss chart and
hide a run by its legend entry, let the page refresh live at least twice (the new points
drawn), and find the zoom and the hidden run as they were left; they also outlast a full
rerun (the sidebar's download format set to SVG), after which the chart's camera
downloads an SVG. plotly.js comes from this server, once for the page.

Plotly keeps a reader's zoom and legend choices across new data only when the same plot
is updated in place (``Plotly.react`` with an unchanged ``layout.uirevision``); a chart
that is mounted afresh on every refresh forgets them.
"""

import dataclasses
import math
import os
import threading
import time

import pytest

from storage import RunStore
from tests.support.browser import CHROMIUM_ARGS, playwright_and_chromium, streamlit_server
from tests.support.runs import TINY, fake_run, wait_for

LIVE = dataclasses.replace(TINY, steps=100_000, eval_interval=10, probe_interval=10)
TITLE = "Validation loss"

CHART = """(title) => {
  for (const gd of document.querySelectorAll('.js-plotly-plot')) {
    const text = ((gd.layout && gd.layout.title && gd.layout.title.text) || '').replace(/<[^>]*>/g, '');
    if (text !== title || !gd._fullLayout || !gd._fullData) continue;
    const box = gd.querySelector('.nsewdrag').getBoundingClientRect();
    return {
      xrange: Array.from(gd._fullLayout.xaxis.range), autorange: gd._fullLayout.xaxis.autorange,
      traces: gd._fullData.map(t => ({name: t.name, visible: t.visible, points: Array.from(t.x || []).length,
                                      last: Math.max(...Array.from(t.x || [0]))})),
      plot: {x: box.x, y: box.y, width: box.width, height: box.height},
    };
  }
  return null;
}"""

HIDE_FIRST = """(title) => {
  for (const gd of document.querySelectorAll('.js-plotly-plot')) {
    const text = ((gd.layout && gd.layout.title && gd.layout.title.text) || '').replace(/<[^>]*>/g, '');
    if (text !== title) continue;
    const box = gd.querySelector('.legend .traces .legendtoggle').getBoundingClientRect();
    return {x: box.x + box.width / 2, y: box.y + box.height / 2};
  }
  return null;
}"""


class Feeder(threading.Thread):
    """Writes the next validation and train losses of each run, and a heartbeat, every
    ``period`` seconds, as live workers would, until stopped."""

    def __init__(self, url, run_ids, step, period=0.7):
        super().__init__(daemon=True)
        self.url, self.run_ids, self.step, self.period = url, run_ids, step, period
        self.halt = threading.Event()

    def run(self):
        store = RunStore(self.url)
        try:
            while not self.halt.wait(self.period):
                self.step += LIVE.eval_interval
                for i, run_id in enumerate(self.run_ids):
                    v = 6.0 + 4.8 * math.exp(-self.step / 10) - 1e-3 * (self.step - 200) + 0.01 * i
                    store.metrics.add_metrics(run_id, [(self.step, 1.0, "val_loss", v), (self.step, 1.0, "train_loss", v - 0.1)])
                    store.runs.heartbeat(run_id, self.step)
        finally:
            store.close()


@pytest.mark.browser
def test_a_live_refresh_keeps_the_zoom_and_the_hidden_runs(tmp_path, token_cache):
    sync_playwright, chromium = playwright_and_chromium()
    url = f"sqlite:///{tmp_path / 'zoom.db'}"
    store = RunStore(url)
    ids = [fake_run(store, dataclasses.replace(LIVE, estimator=e), status="running", steps_done=200)
           for e in ("exact", "basis")]
    store.close()
    feeder = Feeder(url, ids, step=200)

    env = dict(os.environ, BASIS_LAB_DB_URL=url, BASIS_LAB_CACHE=str(token_cache), HF_HUB_OFFLINE="1")
    with streamlit_server(env, tmp_path / "streamlit.log") as port:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 1100})
                page.set_default_timeout(120_000)
                scripts = []
                page.on("request", lambda r: r.resource_type == "script" and "plotly" in r.url and scripts.append(r.url))
                page.goto(f"http://127.0.0.1:{port}/compare?runs={ids[0]},{ids[1]}")  # a link to these runs
                first = wait_for(lambda: page.evaluate(CHART, TITLE), timeout=180, what="the validation-loss chart")
                assert all(t["points"] == 21 for t in first["traces"]), first
                page.screenshot(path=str(tmp_path / "compare.png"), full_page=True)
                feeder.start()

                box = first["plot"]  # drag across the middle half, level: an x-only zoom
                y = box["y"] + box["height"] / 2
                page.mouse.move(box["x"] + box["width"] * 0.25, y)
                page.mouse.down()
                page.mouse.move(box["x"] + box["width"] * 0.5, y, steps=8)
                page.mouse.move(box["x"] + box["width"] * 0.75, y, steps=8)
                page.mouse.up()
                toggle = page.evaluate(HIDE_FIRST, TITLE)
                page.mouse.click(toggle["x"], toggle["y"])
                zoomed = wait_for(lambda: (c := page.evaluate(CHART, TITLE)) and not c["autorange"]
                                  and any(t["visible"] == "legendonly" for t in c["traces"]) and c,
                                  timeout=30, what="the zoom and the hidden run")
                hidden = [t["name"] for t in zoomed["traces"] if t["visible"] == "legendonly"]
                assert len(hidden) == 1, zoomed
                last = max(t["last"] for t in zoomed["traces"])

                for _ in range(2):  # two live refreshes, each drawing newer points
                    later = wait_for(lambda: (c := page.evaluate(CHART, TITLE)) and max(t["last"] for t in c["traces"])
                                     > last and c, timeout=60, what="newer points on the chart")
                    last = max(t["last"] for t in later["traces"])
                time.sleep(1.0)
                after = page.evaluate(CHART, TITLE)
                page.screenshot(path=str(tmp_path / "compare-live.png"), full_page=True)

                page.get_by_text("svg", exact=True).click()  # a full rerun of the page
                time.sleep(3.0)
                rerun = page.evaluate(CHART, TITLE)
                chart = page.locator(".js-plotly-plot", has_text=TITLE).first
                chart.hover()
                with page.expect_download() as download:
                    chart.locator("button[data-title='Download plot']").click()
                filename = download.value.suggested_filename
                image = open(download.value.path(), "rb").read()
            finally:
                feeder.halt.set()
                browser.close()
    feeder.join(timeout=10)
    assert max(t["last"] for t in after["traces"]) > max(t["last"] for t in zoomed["traces"])
    assert after["autorange"] is False and after["xrange"] == pytest.approx(zoomed["xrange"]), (zoomed, after)
    assert [t["name"] for t in after["traces"] if t["visible"] == "legendonly"] == hidden, after
    assert rerun["xrange"] == pytest.approx(zoomed["xrange"]), (zoomed, rerun)
    assert [t["name"] for t in rerun["traces"] if t["visible"] == "legendonly"] == hidden, rerun
    assert filename == "basis-lab-val.svg" and image.lstrip().startswith(b"<svg"), (filename, image[:100])
    assert len(scripts) == 1 and "/_stcore/" in scripts[0], scripts  # served here, not from a CDN; loaded once
    print(f"screenshots: {tmp_path / 'compare.png'}, {tmp_path / 'compare-live.png'}")
