"""In real Chromium at 1,400 and 420 px, what the new-user walk through the README found
(issue 29's checks): a bad filter's message shows the syntax it asks for (``rank >= 8``,
not Streamlit's typeset ``rank ≥ 8``, which no filter parses); the grid's hover toolbar
leaves "Back up the database" clear; and an offline workbench offers no "Deploy" (to
Streamlit's cloud) in its header."""

import dataclasses

import pytest

from storage import RunStore
from tests.support.browser import dashboard_page
from tests.support.runs import TINY, fake_run

OVERLAP = """() => {
  const bar = document.querySelector('[data-testid="stElementToolbar"]');
  const button = Array.from(document.querySelectorAll('[data-testid="stDownloadButton"] button'))
    .find(b => b.innerText.includes('Back up the database') && b.getBoundingClientRect().width > 0);
  if (!bar || !button) return null;
  const a = bar.getBoundingClientRect(), b = button.getBoundingClientRect();
  if (!a.width || !a.height) return null;
  const x = Math.min(a.right, b.right) - Math.max(a.left, b.left), y = Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top);
  return x > 0 && y > 0 ? Math.round(x * y) : 0;
}"""  # the area (px²) the grid's toolbar covers of the button; null while the toolbar is not shown


@pytest.mark.browser
def test_the_runs_page_shows_its_filter_syntax_keeps_backup_clear_and_offers_no_deploy(tmp_path, token_cache):
    url = f"sqlite:///{tmp_path / 'walk.db'}"
    store = RunStore(url)
    for rank in (1, 8):
        fake_run(store, dataclasses.replace(TINY, rank=rank))
    store.close()
    seen = {}
    with dashboard_page(url, token_cache, tmp_path / "streamlit.log") as (port, page):
        for width in (1400, 420):
            page.set_viewport_size({"width": width, "height": 1000})
            page.goto(f"http://127.0.0.1:{port}/runs")
            grid = page.locator('[data-testid="stDataFrame"]').first
            grid.wait_for()
            page.wait_for_timeout(2_000)  # the grid lays out
            grid.hover()
            page.wait_for_function(f"() => ({OVERLAP})() !== null")
            page.wait_for_timeout(1_500)  # the toolbar slides into its place
            seen[f"covered at {width}"] = page.evaluate(OVERLAP)
            seen[f"deploy at {width}"] = page.get_by_text("Deploy", exact=True).count()
        box = page.get_by_label("Filter", exact=True)
        box.fill("rank >> 8")
        box.press("Enter")
        error = page.get_by_text("Filter not applied", exact=False)
        error.wait_for()
        text = error.inner_text()
        seen["asks for >="] = "write it like: rank >= 8 and lam == 0" in text.replace("\u2060", "")
        example = text.split("write it like: ", 1)[1].strip()
        box.fill(example.replace("6.5", "99"))  # the example, copied from the page (joiners and all), applies
        box.press("Enter")
        page.wait_for_function("() => new URL(location.href).searchParams.get('where') !== null")
        page.wait_for_timeout(2_000)
        seen["copied filter refused"] = page.get_by_text("Filter not applied", exact=False).count()
    assert seen == {"covered at 1400": 0, "deploy at 1400": 0, "covered at 420": 0, "deploy at 420": 0,
                    "asks for >=": True, "copied filter refused": 0}, seen
