"""The Launch form in real Chromium at 1,400 and 420 px (issue 43): what the fields show is
what the page reads, so a value the browser's own number field would refuse (past its safe
integers) or a pasted name past the schema's limit is named under its field with the range
or the limit, and the button is gone meanwhile (4, 13); a launch says what it queued where
the user clicked, inside the window, and its button is disarmed, so a double click queues
the sweep once (5)."""

import re

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from app import form
from storage import RunStore
from storage.limits import INT_MAX, NAME_MAX
from tests.support.browser import dashboard_page

HEIGHT = 900
RUNS = len(form.DEFAULT_SWEEP.expand())
IN_VIEW = """(text) => {
  const hit = Array.from(document.querySelectorAll('[data-testid="stAlertContentSuccess"]'))
    .find(e => e.innerText.includes(text));
  if (!hit) return null;
  const r = hit.getBoundingClientRect();
  return r.top >= 0 && r.bottom <= window.innerHeight;
}"""
LAUNCH = re.compile(rf"^(Launch|Queue) {RUNS} runs$")


def _enter(page, label: str, value: str) -> None:
    box = page.get_by_label(label, exact=True)
    box.fill(value)
    box.press("Enter")


def _buttons_once_drawn(page, name: str) -> int:
    """How many ``name`` buttons the page shows once its rerun has drawn it: Streamlit draws a
    refusal before it removes the previous run's elements, so a button still there is given up
    to 10 s to go before it is counted (one that stays is counted)."""
    button = page.get_by_role("button", name=name)
    try:
        button.first.wait_for(state="detached", timeout=10_000)
    except PlaywrightTimeout:
        pass
    return button.count()


@pytest.mark.browser
def test_the_launch_form_launches_what_it_shows_once_and_says_so_in_view(tmp_path, token_cache):
    url = f"sqlite:///{tmp_path / 'launch.db'}"
    seen = {}
    with dashboard_page(url, token_cache, tmp_path / "streamlit.log", height=HEIGHT) as (port, page):
        for i, width in enumerate((1400, 420)):
            page.set_viewport_size({"width": width, "height": HEIGHT})
            page.goto(f"http://127.0.0.1:{port}/launch")
            page.get_by_text(f"{RUNS} runs to launch", exact=True).wait_for()

            _enter(page, "Steps", "99999999999999999999")  # past 2⁵³: a browser integer field keeps its old value
            page.get_by_text(f"Steps must be an integer in [1, {INT_MAX + 1})").first.wait_for()
            seen[f"launch buttons, steps too many, {width}"] = _buttons_once_drawn(page, LAUNCH)
            _enter(page, "Steps", "200")
            page.get_by_text(f"{RUNS} runs to launch", exact=True).wait_for()

            _enter(page, "Name", "n" * 250)  # a paste past the limit: kept in the field, and named
            page.get_by_text(f"Name is 250 characters long; the most is {NAME_MAX}: shorten it").first.wait_for()
            seen[f"name kept, {width}"] = len(page.get_by_label("Name", exact=True).input_value())
            seen[f"launch buttons, name too long, {width}"] = _buttons_once_drawn(page, LAUNCH)
            _enter(page, "Name", "")
            page.get_by_text(f"{RUNS} runs to launch", exact=True).wait_for()

            page.get_by_role("button", name=LAUNCH).wait_for()  # the cleared name is read: the form launches again
            # the preview's switch (nothing trains); the Reproduce expander's, folded, is not visible
            page.locator('p:text-is("Queue for workers"):visible').last.click()
            page.get_by_role("button", name=f"Queue {RUNS} runs").dblclick()
            said = f"Queued {RUNS} runs for workers"
            page.get_by_text(said).first.wait_for()
            page.get_by_role("button", name=re.compile("^Launched")).wait_for()
            page.wait_for_timeout(2_000)  # a second click's rerun, if one came, has run
            seen[f"confirmation in view, {width}"] = page.evaluate(IN_VIEW, said)
            seen[f"disarmed, {width}"] = page.get_by_role("button", name=re.compile("^Launched")).is_disabled()
            store = RunStore(url)
            seen[f"runs queued, {width}"] = len(store.runs.list_runs()) - i * RUNS  # each width's session queues once
            store.close()
            page.screenshot(path=str(tmp_path / f"launched-{width}.png"))
    print(f"screenshots: {tmp_path}")
    assert seen == {k: v for width in (1400, 420) for k, v in {
        f"launch buttons, steps too many, {width}": 0, f"name kept, {width}": 250,
        f"launch buttons, name too long, {width}": 0, f"confirmation in view, {width}": True,
        f"disarmed, {width}": True, f"runs queued, {width}": RUNS}.items()}, seen
