"""Issue 43, items 1 and 2 in real Chromium: a Compare link copied from the address bar after
a "Pick the runs where" filter that reaches into an older sweep and a changed equivalence
margin δ, opened in a new browser context (another person: no session, no cookies; here at
420 px), shows exactly the sender's runs (at 1,400 px), the same δ in its control and the
same Table 3 verdicts (read from the "Table 3 as csv" download, which both pages write from
the table they show). The verdicts at δ = 0.05 differ from those at the default δ, so a link
that dropped δ, or dropped runs, gives the recipient another table."""

import dataclasses
import io

import pandas as pd
import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from storage import RunStore
from tests.support.browser import dashboard_page
from tests.support.runs import SWEEP_A, SWEEP_B, TINY, InSweep, fake_run

WHERE = "rank >= 16 or (estimator == exact and seed >= 2)"
MARGIN_LABEL = "Equivalence margin δ (nats)"
# the basis runs' final val loss above exact's (same seed): R = 16 is 0.03 nats worse, R = 32 0.01, each seed jittered
OFFSET = {8: 0.06, 16: 0.03, 32: 0.01}
JITTER = {2: 0.0, 3: 0.004, 4: -0.003}
RANKS = {"nan", "16.0", "32.0"}  # Table 3's rows for the filtered runs: exact (no rank), R = 16, R = 32


def _lab(url: str) -> dict:
    """An older sweep of exact seeds 0-4 and the latest: exact seeds 0-1 and basis R = 8, 16, 32 at seeds 2-4."""
    store = RunStore(url)
    older, latest = InSweep(store, SWEEP_A), InSweep(store, SWEEP_B)
    runs = {"older exact": [fake_run(older, dataclasses.replace(TINY, estimator="exact", seed=s)) for s in range(5)],
            "latest exact": [fake_run(latest, dataclasses.replace(TINY, estimator="exact", seed=s)) for s in range(2)]}
    for rank in OFFSET:
        runs[rank] = [fake_run(latest, dataclasses.replace(TINY, rank=rank, seed=s), final=6.0 + OFFSET[rank] + JITTER[s])
                      for s in JITTER]
    store.close()
    return runs


PICKED = """() => {  // the run ids in the chips of the multiselect labelled Runs ("#12 basis R=16 …"); null: none drawn
  const box = Array.from(document.querySelectorAll('[data-testid="stMultiSelect"]')).find(
    d => (d.querySelector('[data-testid="stWidgetLabel"]')?.innerText || '').trim() === 'Runs');
  return box ? (box.innerText.match(/#[0-9]+/g) || []).map(t => Number(t.slice(1))).sort((a, b) => a - b) : null;
}"""


def _picked(page) -> list[int]:
    page.wait_for_function(f"() => ({PICKED})() !== null")
    return page.evaluate(PICKED)


def _table3(page) -> pd.DataFrame:
    """Table 3 as its csv download holds it. A click that lands while Compare reruns can be lost
    (the button is drawn again): it is clicked again, up to 8 times, 30 s each."""
    for attempt in range(8):
        button = page.get_by_role("button", name="Table 3 as csv")
        button.scroll_into_view_if_needed()
        try:
            with page.expect_download(timeout=30_000) as info:
                button.click()
        except PlaywrightTimeout:
            if attempt == 7:
                raise
            continue
        with open(info.value.path(), encoding="utf-8") as f:
            return pd.read_csv(io.StringIO(f.read()))
    raise AssertionError("unreachable")


def _settled_table3(page, ranks: set[str]) -> list[tuple]:
    """Table 3's rows once they are of ``ranks`` and two downloads a second apart agree (a download
    clicked while Compare is still rerunning can give the table of the run before)."""
    last = None
    for _ in range(60):
        rows = _rows(_table3(page))
        if {r[0] for r in rows} == ranks and rows == last:
            return rows
        last = rows
        page.wait_for_timeout(1_000)
    raise AssertionError(f"Table 3 did not settle on ranks {ranks}: {last}")


def _rows(table: pd.DataFrame) -> list[tuple]:
    """Each row's rank (none for exact), its seed count and its verdict."""
    keep = [c for c in ("rank", "seeds", "verdict") if c in table.columns]
    return [tuple(str(v) for v in row) for row in table[keep].itertuples(index=False)]


def _settled(page, margin: str | None = None) -> None:
    """Compare has drawn its Table 3 (at ``margin`` when given) and stopped running."""
    page.get_by_text("Summary (the paper's Table 3 form)").first.wait_for()
    page.get_by_role("button", name="Table 3 as csv").wait_for()
    if margin is not None:
        page.wait_for_function(
            "m => { const e = document.querySelector('input[aria-label=\"" + MARGIN_LABEL + "\"]') "
            "|| Array.from(document.querySelectorAll('[data-testid=\"stNumberInput\"]')).find(d => "
            "d.innerText.includes('Equivalence margin'))?.querySelector('input'); return e && e.value === m; }",
            arg=margin)
    page.wait_for_function("() => !document.querySelector('[data-testid=\"stStatusWidget\"]')"
                           " || !document.querySelector('[data-testid=\"stStatusWidget\"]').innerText.match(/Running/i)")
    page.wait_for_timeout(500)


def _view(page, margin: str) -> dict:
    _settled(page, margin)
    return {"runs": _picked(page), "margin": page.get_by_role("spinbutton", name=MARGIN_LABEL).input_value(),
            "table3": _settled_table3(page, RANKS)}


@pytest.mark.browser
def test_a_compare_link_opens_the_senders_runs_margin_and_verdicts_in_a_new_browser(tmp_path, token_cache):
    url = f"sqlite:///{tmp_path / 'compare-link.db'}"
    lab = _lab(url)
    expected = sorted(lab["older exact"][2:] + lab[16] + lab[32])  # 9 runs, three of them of the older sweep
    with dashboard_page(url, token_cache, tmp_path / "streamlit.log", width=1400) as (port, page):
        page.goto(f"http://127.0.0.1:{port}/compare")
        _settled(page)
        default_margin = page.get_by_role("spinbutton", name=MARGIN_LABEL).input_value()

        field = page.get_by_role("textbox", name="Pick the runs where", exact=True)
        field.fill(WHERE)
        field.press("Enter")
        page.wait_for_function(f"n => (({PICKED})() || []).length === n", arg=len(expected))
        _settled(page)
        at_default = _settled_table3(page, RANKS)  # the same runs at the default δ: what a link without δ would show

        margin = page.get_by_role("spinbutton", name=MARGIN_LABEL)
        margin.scroll_into_view_if_needed()
        margin.fill("0.050")
        margin.press("Enter")
        page.wait_for_function("() => new URL(location.href).searchParams.get('margin') === '0.05'")
        sent = _view(page, "0.050")
        link = page.url

        other = page.context.browser.new_context(viewport={"width": 420, "height": 1000})  # the recipient
        try:
            recipient = other.new_page()
            recipient.set_default_timeout(120_000)
            recipient.goto(link)
            got = _view(recipient, "0.050")
            warnings = recipient.locator('[data-testid="stAlert"]').filter(has_text="The link's").count()
        finally:
            other.close()

    assert "margin=0.05" in link and "runs=" in link, link
    assert sent["runs"] == expected, (sent, expected)
    assert sent["margin"] == "0.050" and default_margin == "0.020", (sent, default_margin)
    assert sent["table3"] == [("nan", "3", "reference"), ("16.0", "3", "equivalent"), ("32.0", "3", "equivalent")], sent
    assert at_default == [("nan", "3", "reference"), ("16.0", "3", "worse"), ("32.0", "3", "inconclusive")], at_default
    assert got == sent, (sent, got)
    assert warnings == 0
