"""Issue 43, items 3, 9, 10 and 11 in real Chromium: a link copied from the address bar of
Runs, Diagnosis and Report, opened in a new browser context (another person: no session, no
cookies; here at 420 px), shows the same rows (run ids) and the same settings as the sender
saw at 1,400 px; the Runs count is of those rows; the interrupted runs are announced with
Resume all beside the notice; an address that names no page says so."""

import dataclasses

import pytest

from storage import RunStore
from tests.support.browser import BESIDE, choose, dashboard_page
from tests.support.runs import SWEEP_A, SWEEP_B, TINY, InSweep, fake_run

RESULT = {"layer": "all", "estimator": "basis", "rank": 4, "lam": 0.0, "bias2": 1e-3, "bias2_se": 1e-3,
          "variance": 0.5, "mse": 0.5, "cos_mean": 0.7, "keys": 8, "batches": 1}
GRID_IDS = """() => {
  const grid = document.querySelector('[data-testid="stDataFrame"]');
  if (!grid) return null;
  return Array.from(grid.querySelectorAll('[role="gridcell"][aria-colindex="1"], td[aria-colindex="1"]'))
    .map(c => c.innerText.trim()).filter(t => /^[0-9]+$/.test(t)).map(Number);
}"""





def _lab(url: str) -> dict:
    store = RunStore(url)
    pilot, ablation = InSweep(store, SWEEP_A, ["pilot"]), InSweep(store, SWEEP_B, ["ablation"])
    runs = {"exact": fake_run(pilot, dataclasses.replace(TINY, estimator="exact")),
            "r8": fake_run(pilot, dataclasses.replace(TINY, rank=8), status="failed", steps_done=20, error="boom"),
            "r32": fake_run(pilot, TINY),
            "b8": fake_run(ablation, dataclasses.replace(TINY, rank=8)),
            "fresh": fake_run(ablation, dataclasses.replace(TINY, rank=2), status="running", steps_done=0)}
    store.runs.set_status(runs["fresh"], "interrupted", error="interrupted before it started", cause="signal")
    diag = store.diagnostics.create_diagnostic(runs["r32"], 0, {"estimators": ["basis"], "ranks": [4, 8], "lams": [0.0], "keys": 8,
                                                    "batches": 1})
    store.diagnostics.add_diagnostic_results(diag, [RESULT, {**RESULT, "rank": 8}, {**RESULT, "layer": "head"},
                                        {**RESULT, "layer": "head", "rank": 8}])
    store.diagnostics.set_diagnostic_status(diag, "finished")
    store.close()
    return {**runs, "diag": diag}


def _ids(page) -> list[int]:
    page.wait_for_function(f"() => ({GRID_IDS})() !== null && ({GRID_IDS})().length > 0")
    page.wait_for_timeout(1_000)  # the grid lays out every row
    return page.evaluate(GRID_IDS)


def _box(page, testid: str, label: str) -> str:
    """What a selectbox or multiselect labelled ``label`` shows (its chips or its value)."""
    box = page.locator(f'[data-testid="{testid}"]').filter(has_text=label).first
    return box.evaluate("e => [e.innerText, ...Array.from(e.querySelectorAll('input')).map(i => i.value)]"
                        ".join(' ').replace(/\\s+/g, ' ').trim()")


def _runs_settings(page) -> dict:
    page.get_by_text("runs match the filters").first.wait_for()
    return {"ids": _ids(page), "count": page.get_by_text("runs match the filters").first.inner_text(),
            "search": page.get_by_role("textbox", name="Search", exact=True).input_value(),
            "filter": page.get_by_role("textbox", name="Filter", exact=True).input_value(),
            **{label: _box(page, "stMultiSelect", label) for label in ("Status", "Estimator", "Sweep", "Tag")}}


def _wait_url(page, **params) -> None:
    checks = " && ".join(f"q.getAll({name!r}).length === {n}" for name, n in params.items())
    page.wait_for_function(f"() => {{ const q = new URL(location.href).searchParams; return {checks}; }}")


@pytest.mark.browser
def test_a_link_from_runs_diagnosis_and_report_opens_the_same_view_in_a_new_browser(tmp_path, token_cache):
    url = f"sqlite:///{tmp_path / 'links.db'}"
    lab = _lab(url)
    sent, got = {}, {}
    with dashboard_page(url, token_cache, tmp_path / "streamlit.log", width=1400) as (port, page):
        base = f"http://127.0.0.1:{port}"
        other = page.context.browser.new_context(viewport={"width": 420, "height": 1000})  # the recipient
        recipient = other.new_page()
        recipient.set_default_timeout(120_000)

        page.goto(f"{base}/runs")
        notice = page.get_by_text("1 run was interrupted before its first step")
        notice.wait_for()
        sent["notice"] = notice.inner_text()
        page.get_by_role("button", name="Resume all").wait_for()
        sent["resume beside"] = page.evaluate(BESIDE)  # 2: the alert, its element, the row that holds both
        for label, option in (("Status", "finished"), ("Status", "failed"), ("Sweep", SWEEP_A), ("Tag", "pilot")):
            choose(page, "stMultiSelect", label, option)
            page.keyboard.press("Escape")
        for label, text in (("Search", "R="), ("Filter", "rank >= 8")):
            field = page.get_by_role("textbox", name=label, exact=True)
            field.fill(text)
            field.press("Enter")
        _wait_url(page, status=2, sweep=1, tag=1, search=1, where=1)
        page.wait_for_timeout(2_000)
        sent["runs"] = _runs_settings(page)
        recipient.goto(page.url)
        got["runs"] = _runs_settings(recipient)

        page.goto(f"{base}/diagnosis?run={lab['r32']}")
        page.get_by_text("Relative MSE against R", exact=False).first.wait_for()
        choose(page, "stSelectbox", "Layer", "head")
        _wait_url(page, run=1, diag=1, layer=1)
        page.wait_for_function("() => new URL(location.href).searchParams.get('layer') === 'head'")
        sent["diagnosis"] = {label: _box(page, "stSelectbox", label) for label in ("Run", "Diagnosis", "Layer")}
        recipient.goto(page.url)
        recipient.get_by_text("Relative MSE against R", exact=False).first.wait_for()
        got["diagnosis"] = {label: _box(recipient, "stSelectbox", label) for label in ("Run", "Diagnosis", "Layer")}

        page.goto(f"{base}/report")
        page.get_by_text("Runs with tags").first.click()
        choose(page, "stMultiSelect", "Tags", "pilot")
        page.keyboard.press("Escape")
        margin = page.get_by_role("spinbutton", name="Equivalence margin δ (nats)")
        margin.fill("0.050")
        margin.press("Enter")
        _wait_url(page, tags=1, margin=1)
        sent["report"] = {"tags": _box(page, "stMultiSelect", "Tags"), "margin": margin.input_value()}
        recipient.goto(page.url)
        recipient.get_by_text("Build a report").first.wait_for()
        got["report"] = {"tags": _box(recipient, "stMultiSelect", "Tags"),
                         "margin": recipient.get_by_role("spinbutton", name="Equivalence margin δ (nats)").input_value()}

        recipient.goto(f"{base}/nosuchpage")
        said = recipient.get_by_text("There is no page 'nosuchpage'; the pages are")
        said.wait_for()
        got["no page"] = said.is_visible()
        other.close()

    assert sent["runs"]["ids"] == [lab["r32"], lab["r8"]], sent
    assert sent["runs"]["count"] == "1 finished · 1 failed · 2 of 5 runs match the filters", sent
    assert got == {**{k: sent[k] for k in ("runs", "diagnosis", "report")}, "no page": True}, (sent, got)
    assert sent["diagnosis"]["Layer"].endswith("head"), sent
    assert sent["resume beside"] == 2 and "Resume all continues it" in sent["notice"], sent
