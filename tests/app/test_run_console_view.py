"""Run detail's console (issue 43, item 17; ``app.runfiles.log_section``): the run's printed,
warned and logged lines with their source, from a level up, searched; and in real Chromium,
a run's warning shows on Run detail while the page refreshes."""

from __future__ import annotations

import pytest

from app import runfiles
from storage import ALERT, RunStore
from tests.support.pages import app, page, store, url  # noqa: F401 (fixtures)
from tests.support.runs import TINY, fake_run

LINES = [(1.0, "info", "claimed by host:1 (lease 1)", "lab"), (2.0, "info", "hello from the loop", "stdout"),
         (3.0, "warning", "RuntimeWarning: lr looks high (loop.py:9)", "warning"),
         (4.0, "error", "Traceback (most recent call last):", "stderr"),
         (5.0, "debug", "engine.data: cache hit", "engine.data"), (6.0, ALERT, "failed: nan at step 5", "lab")]


def _detail(run_id: int):
    at = app(selected=[run_id])
    at.query_params["run"] = str(run_id)
    return page(at, "detail")


def _shown(at) -> list[str]:
    """The log's lines as drawn: level and text."""
    [code] = [c for c in at.code if "  " in c.value and ("INFO" in c.value or "WARNING" in c.value
                                                         or "ERROR" in c.value or "ALERT" in c.value)]
    return [line.split("  ", 1)[1].strip() for line in code.value.splitlines()]


def test_run_detail_shows_the_console_with_sources_and_filters_and_searches_it(store):
    run_id = fake_run(store, TINY)
    store.logs.add_run_logs(run_id, LINES)
    at = _detail(run_id)
    shown = _shown(at)
    assert [s.split()[0] for s in shown] == ["INFO", "INFO", "WARNING", "ERROR", "ALERT"]  # debug left out
    assert "stdout: hello from the loop" in shown[1] and "stderr: Traceback" in shown[3]
    at.segmented_control(key="detail.log_level").set_value("debug").run()
    assert any("engine.data: cache hit" in s for s in _shown(at))
    at.segmented_control(key="detail.log_level").set_value("warning").run()
    at.text_input(key="detail.log_search").input("LR LOOKS").run()
    assert [s.split(None, 1)[1] for s in _shown(at)] == ["RuntimeWarning: lr looks high (loop.py:9)"]
    at.text_input(key="detail.log_search").input("stdout").run()  # a source, at warning and up: none
    assert any("No log line holds" in c.value and "stdout" in c.value for c in at.caption)
    at.segmented_control(key="detail.log_level").set_value("info").run()
    assert [s.split(None, 1)[1] for s in _shown(at)] == ["stdout: hello from the loop"]


def test_run_detail_draws_the_newest_lines_of_a_long_log(store, monkeypatch):
    monkeypatch.setattr(runfiles, "SHOWN_MAX", 3)
    run_id = fake_run(store, TINY)
    store.logs.add_run_logs(run_id, [(float(i), "info", f"line {i}", "stdout") for i in range(7)])
    at = _detail(run_id)
    assert [s.split(None, 1)[1] for s in _shown(at)] == ["stdout: line 4", "stdout: line 5", "stdout: line 6"]
    assert any("The newest 3 lines" in c.value for c in at.caption)


@pytest.mark.browser
def test_run_detail_shows_a_running_runs_warning_as_it_arrives(tmp_path, token_cache):
    """A running run's log on Run detail in Chromium: a warning stored after the page opened
    appears without a reload (the page's live refresh), and the level filter keeps it."""
    from tests.support.browser import dashboard_page

    url = f"sqlite:///{tmp_path / 'console.db'}"
    st = RunStore(url)
    run_id = fake_run(st, TINY, status="running", steps_done=10)
    st.logs.add_run_logs(run_id, [(1.0, "info", "hello from the loop", "stdout")])
    with dashboard_page(url, token_cache, tmp_path / "streamlit.log") as (port, page_):
        page_.goto(f"http://127.0.0.1:{port}/detail?run={run_id}")
        page_.get_by_text("stdout: hello from the loop").wait_for()
        st.logs.add_run_logs(run_id, [(2.0, "warning", "RuntimeWarning: lr looks high (loop.py:9)", "warning")])
        page_.get_by_text("RuntimeWarning: lr looks high").wait_for(timeout=60_000)
        page_.get_by_text("warnings and errors", exact=True).click()
        page_.get_by_text("stdout: hello from the loop").wait_for(state="detached", timeout=60_000)
        shown = page_.locator('[data-testid="stCode"]').all_inner_texts()
    st.close()
    assert any("WARNING  RuntimeWarning: lr looks high" in s for s in shown), shown
