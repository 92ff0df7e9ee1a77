"""The Diagnosis page's controls: Enter in a field starts nothing (a real
Chromium), the cost is shown before anything starts, a cancelled diagnosis shows its
partial results, and Cancel, Run again and Delete act on the chosen diagnosis.

Diagnoses are written the way a worker would (``RunStore``), so nothing is computed
except where a test starts one on purpose."""

import os
import time

import pytest

from engine.runner.diagnosis import SKETCHED
from storage import RunStore
from tests.support.browser import CHROMIUM_ARGS, playwright_and_chromium, streamlit_server
from tests.support.pages import app, button, page, store, url  # noqa: F401  (fixtures)
from tests.support.runs import TINY, fake_run

RESULT = {"layer": "all", "estimator": "basis", "rank": 4, "lam": 0.0, "bias2": 1e-3, "bias2_se": 1e-3,
          "variance": 0.5, "mse": 0.5, "cos_mean": 0.7, "keys": 8, "batches": 1}


def _partial(store, run_id) -> int:
    """A diagnosis cancelled after one of its two batches, with that batch's rows."""
    diag = store.diagnostics.create_diagnostic(run_id, 0, {"step": 0, "initial": True, "estimators": ["basis"], "ranks": [4],
                                               "lams": [0.0], "keys": 8, "batches": 2, "chunk": 4, "seed": 0})
    store.diagnostics.claim_diagnostic(diag, "elsewhere:1")
    store.diagnostics.add_diagnostic_results(diag, [RESULT, {**RESULT, "layer": "block_0/mlp/fc"}])
    store.diagnostics.set_diagnostic_status(diag, "cancelled", error="cancelled after 1 of 2 (batch, estimator, rank, λ) steps")
    return diag


def test_the_cost_shows_before_a_start_and_a_cancelled_diagnosis_keeps_its_results(url, store):
    run_id = fake_run(store, TINY)
    diag = _partial(store, run_id)
    at = app(selected=[run_id]).run()
    at.switch_page("views/diagnosis.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert any(f"Cost: {len(SKETCHED)} estimators × 4 ranks × 1 λ × 81 keys × 4 batches" in c.value.replace("\\", "")
               for c in at.caption)
    assert at.selectbox(key="diagnosis.diag").value == diag
    assert any("cancelled after 1 of 2" in w.value.replace("\\", "") for w in at.warning)  # said, not hidden
    assert set(at.dataframe[0].value["estimator"]) == {"basis"}  # and its results are shown
    assert button(at, "Cancel diagnosis").disabled  # it has ended

    button(at, "Delete diagnosis").click().run()
    assert store.diagnostics.diagnostic_results(diag).shape[0] == 2  # nothing before the confirmation
    at.button(key="diagnosis.delete.cancel").click().run()
    assert diag in set(store.frames.diagnostics_frame()["id"])
    button(at, "Delete diagnosis").click().run()
    at.button(key="diagnosis.delete.ok").click().run()
    assert store.frames.diagnostics_frame().empty and store.diagnostics.diagnostic_results(diag).empty


def test_cancel_on_the_page_asks_the_running_diagnosis_to_stop(url, store):
    run_id = fake_run(store, TINY)
    diag = store.diagnostics.create_diagnostic(run_id, 0, {"estimators": ["basis"], "ranks": [4], "lams": [0.0], "keys": 8,
                                               "batches": 2})
    store.diagnostics.claim_diagnostic(diag, "elsewhere:1")
    store.diagnostics.set_diagnostic_status(diag, "running")
    at = page(app(selected=[run_id]).run(), "diagnosis")
    assert not button(at, "Cancel diagnosis").disabled and button(at, "Delete diagnosis").disabled
    button(at, "Cancel diagnosis").click().run()
    assert store.diagnostics.diagnostic_cancel_requested(diag)


@pytest.mark.browser
def test_enter_in_a_diagnosis_field_starts_nothing_in_a_real_browser(tmp_path, token_cache):
    sync_playwright, chromium = playwright_and_chromium()
    db = f"sqlite:///{tmp_path / 'enter.db'}"
    store = RunStore(db)
    fake_run(store, TINY)
    env = dict(os.environ, BASIS_LAB_DB_URL=db, BASIS_LAB_CACHE=str(token_cache), HF_HUB_OFFLINE="1")
    env.pop("BASIS_LAB_PASSWORD", None)
    try:
        with streamlit_server(env, tmp_path / "streamlit.log") as port, sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
            try:
                page_ = browser.new_page(viewport={"width": 1400, "height": 1000})
                page_.set_default_timeout(60_000)
                page_.goto(f"http://127.0.0.1:{port}/estimators")  # the page's old address leads to it
                page_.get_by_role("heading", name="Diagnosis").wait_for()
                page_.get_by_text(f"Cost: {len(SKETCHED)} estimators × 4 ranks").wait_for()
                for label, value in (("Ranks R", "2"), ("Shrink λ", "0")):
                    box = page_.get_by_label(label, exact=True)
                    box.fill(value)
                    box.press("Enter")
                page_.get_by_text(f"Cost: {len(SKETCHED)} estimators × 1 rank").wait_for()  # Enter applied the value…
                time.sleep(3)
                assert store.frames.diagnostics_frame().empty  # …and started nothing
                assert page_.get_by_role("button", name="Run diagnosis").is_enabled()
            finally:
                browser.close()
    finally:
        store.close()
