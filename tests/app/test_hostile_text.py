"""No page lets user text reach the network: every page (Runs, Compare, Run detail,
Diagnosis, Report, Launch) is loaded in a real Chromium with run names, notes, tags, a
sweep id, errors and a stored report whose title holds a tag, each of which would fetch
an image if it were rendered as markdown or HTML (``![q](http://127.0.0.2:9/x.png)``,
``<img src=…>``). Every request to another host is aborted by route interception and
recorded: none may be attempted. After each page no element built from stored text
(an ``<img>`` or a link to that host) may exist.

The hostile text must be on the page (as text) for the check to mean anything: each
visit waits for it first. The Compare visit includes a running run:
the run picker carries its name; Run detail the link to a report titled by a hostile
tag (an ``st.page_link`` label is markdown); the Launch visit an error that quotes a typed path.
"""

import dataclasses
import os
import re
import time

import pytest

from engine.core.text import WORD_JOINER
from engine.reads import reports
from storage import RunStore
from tests.support.browser import CHROMIUM_ARGS, choose, playwright_and_chromium, streamlit_server
from tests.support.runs import TINY, fake_run

HOST = "http://127.0.0.2:9"
MARKDOWN_NAME = f"![q]({HOST}/x.png)"
HTML_NAME = f"<img src={HOST}/y.png>"
NOTES = f"see [notes]({HOST}/notes) ![n]({HOST}/n.png) <img src='{HOST}/tag.png'>"
ERROR = f"diverged: ![e]({HOST}/e.png) <img src={HOST}/e2.png>"


TAG = f"![t]({HOST}/t.png)"
FOREIGN = '[src*="//127.0.0.2"], [href*="//127.0.0.2"], [srcset*="//127.0.0.2"]'  # a link of our own may carry it encoded


class _Tagged:
    """A store whose new runs carry a hostile tag and sweep id."""

    def __init__(self, store):
        self.store = store

    @property
    def runs(self):
        return self  # store.runs.create_run lands on create_run below

    def __getattr__(self, name):  # the rest of the runs repository, and the other repositories
        return getattr(self.store.runs if hasattr(self.store.runs, name) else self.store, name)

    def create_run(self, **kwargs):
        return self.store.runs.create_run(**kwargs, sweep_id=f"![s]({HOST}/sweep.png)", tags=[TAG])


def _as_shown(text: str) -> re.Pattern:
    """``text`` as a page shows it: as typed, where markdown text may carry the invisible
    joiner that breaks an autolink (``engine.core.text.unlinked``); tables show it bare."""
    j = f"{WORD_JOINER}?"
    return re.compile("".join((j if c == "." else "") + re.escape(c) + (j if c in ":@" else "") for c in text), re.IGNORECASE)


def _outside(requests: list[str], port: int) -> list[str]:
    """Requests to anywhere but the Streamlit server (data: and blob: URLs never leave)."""
    own = (f"http://127.0.0.1:{port}", f"ws://127.0.0.1:{port}")
    return [u for u in requests if not u.startswith(own) and not u.startswith(("data:", "blob:"))]


@pytest.mark.browser
def test_no_page_fetches_anything_a_hostile_name_points_at(tmp_path, token_cache):
    sync_playwright, chromium = playwright_and_chromium()
    db = f"sqlite:///{tmp_path / 'hostile.db'}"
    store = RunStore(db)
    tagged = _Tagged(store)
    live = fake_run(tagged, dataclasses.replace(TINY, steps=400), status="running", steps_done=20)
    failed = fake_run(tagged, dataclasses.replace(TINY, rank=8, steps=400), status="failed", steps_done=20, error=ERROR)
    store.runs.rename_run(live, MARKDOWN_NAME)
    store.runs.rename_run(failed, HTML_NAME)
    store.runs.set_notes(live, NOTES)
    diag = store.diagnostics.create_diagnostic(failed, 0, {"estimators": ["basis"], "ranks": [1], "lams": [0.0]})
    store.diagnostics.set_diagnostic_status(diag, "failed", error=ERROR)
    report = reports.build(store, reports.selection_of(tags=[TAG]))
    reports.save(store, report)
    assert TAG in report.title  # "Runs tagged ![t](…)": the title Run detail links by
    env = dict(os.environ, BASIS_LAB_DB_URL=db, BASIS_LAB_CACHE=str(token_cache), HF_HUB_OFFLINE="1")
    env.pop("BASIS_LAB_PASSWORD", None)
    requests: list[str] = []
    aborted: list[str] = []
    try:
        with streamlit_server(env, tmp_path / "streamlit.log") as port, sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                page.set_default_timeout(60_000)
                page.on("request", lambda r: requests.append(r.url))
                base = f"http://127.0.0.1:{port}"

                def foreign(route):
                    if _outside([route.request.url], port):
                        aborted.append(route.request.url)
                        route.abort()
                    else:
                        route.continue_()

                page.context.route("**/*", foreign)

                def shows(text: str) -> None:
                    page.get_by_text(_as_shown(text)).first.wait_for(state="attached")

                def nothing_rendered() -> None:
                    assert page.locator(FOREIGN).count() == 0, page.locator(FOREIGN).first.evaluate(
                        "e => e.parentElement.outerHTML")

                page.goto(f"{base}/runs")
                shows("2 in all")
                shows(MARKDOWN_NAME)
                shows(HTML_NAME)
                nothing_rendered()

                page.goto(f"{base}/compare")
                page.get_by_role("heading", name="Compare").wait_for()
                shows(f"#{live} {MARKDOWN_NAME}")  # the picker's label of the live run
                shows("1 training")  # the progress summary
                shows("Validation loss")
                nothing_rendered()

                for run_id, name in ((live, MARKDOWN_NAME), (failed, HTML_NAME)):
                    page.goto(f"{base}/detail?run={run_id}")
                    page.get_by_role("heading", name="Run detail").wait_for()
                    shows(name)
                    shows(f"Report: {report.title}")  # the page link's label, as text
                    if run_id == live:
                        shows(NOTES)
                    nothing_rendered()
                shows(f"This run failed: {ERROR}")

                page.goto(f"{base}/diagnosis")
                page.get_by_role("heading", name="Diagnosis").wait_for()
                shows(f"This diagnosis failed: {ERROR}")
                nothing_rendered()

                page.goto(f"{base}/report")
                page.get_by_role("heading", name="Reports").wait_for()
                shows(report.title)
                nothing_rendered()

                page.goto(f"{base}/launch")
                page.get_by_text("Launch a sweep", exact=True).wait_for()
                choose(page, "stSelectbox", "Dataset", "files")
                path = page.get_by_label("Path or glob", exact=True)
                path.fill(MARKDOWN_NAME)
                path.press("Enter")
                page.get_by_role("button", name="Check data").click()
                shows(f"No file matches path='{MARKDOWN_NAME}'")  # an error quoting what was typed
                time.sleep(2)  # let any image or prefetch the pages started arrive
                nothing_rendered()
            finally:
                browser.close()
    finally:
        store.close()
    assert requests, "the request log is empty: the check saw nothing"
    assert aborted == [], "\n".join(aborted)
    assert _outside(requests, port) == [], "\n".join(_outside(requests, port))
