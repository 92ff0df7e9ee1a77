"""Run logs (``storage.logs``): lines in order, bounded per run and per line, fenced by the
lease, alerts after a watermark, and gone with their run. SQLite and PostgreSQL."""

from __future__ import annotations

import pytest

from storage import ALERT, LeaseLostError
from storage import logs as run_logs
from tests.support.runs import new_run


def test_lines_come_back_in_order_with_their_level_and_time(store):
    a, b = new_run(store, "a"), new_run(store, "b")
    store.logs.add_run_logs(a, [("info", "claimed"), (1_700_000_000.5, "warning", "slow step")])
    store.logs.add_run_logs(b, [("error", "boom")])
    lines = store.logs.run_logs(a)
    assert [(x.level, x.text) for x in lines] == [("info", "claimed"), ("warning", "slow step")]
    assert lines[1].time.timestamp() == pytest.approx(1_700_000_000.5) and lines[1].time.tzinfo is not None
    assert lines[0].id < lines[1].id
    assert [x.text for x in store.logs.run_logs(a, after_id=lines[0].id)] == ["slow step"]
    assert [x.text for x in store.logs.run_logs(a, levels=["warning", "error"])] == ["slow step"]


def test_a_bad_level_writes_nothing(store):
    a = new_run(store, "a")
    with pytest.raises(ValueError, match="log level 'loud' is not one of debug, info, warning, error, alert"):
        store.logs.add_run_logs(a, [("info", "fine"), ("loud", "x")])
    assert store.logs.run_logs(a) == []


def test_a_run_keeps_its_newest_lines_and_long_lines_are_cut(store, monkeypatch):
    monkeypatch.setattr(run_logs, "LOG_LINES_MAX", 5)
    a, b = new_run(store, "a"), new_run(store, "b")
    store.logs.add_run_logs(b, [("info", "other run")])
    store.logs.add_run_logs(a, [("info", f"line {i}") for i in range(4)])
    store.logs.add_run_logs(a, [("info", f"line {i}") for i in range(4, 8)])
    assert [x.text for x in store.logs.run_logs(a)] == [f"line {i}" for i in range(3, 8)]
    assert [x.text for x in store.logs.run_logs(b)] == ["other run"]  # another run's lines are not its
    store.logs.add_run_logs(a, [("info", "x" * (run_logs.LOG_TEXT_MAX + 10))])
    last = store.logs.run_logs(a)[-1].text
    assert len(last) == run_logs.LOG_TEXT_MAX and last.endswith("…")


def test_an_owner_that_lost_the_lease_writes_no_line(store):
    a = new_run(store, "a")
    epoch = store.queue.claim(a, "host:1")
    store.logs.add_run_logs(a, [("info", "mine")], epoch=epoch)
    with pytest.raises(LeaseLostError):
        store.logs.add_run_logs(a, [("info", "stale")], epoch=epoch - 1)
    assert [x.text for x in store.logs.run_logs(a)] == ["mine"]


def test_alerts_after_a_watermark_and_lines_go_with_their_run(store):
    a, b = new_run(store, "a"), new_run(store, "b")
    start = store.logs.last_log_id()
    store.logs.add_run_logs(a, [("info", "started"), (ALERT, "failed: nan at step 5")])
    store.logs.add_run_logs(b, [(ALERT, "failed: boom")])
    alerts = store.logs.alerts_after(start)
    assert [(x.run_id, x.text) for x in alerts] == [(a, "failed: nan at step 5"), (b, "failed: boom")]
    assert store.logs.alerts_after(alerts[0].id) == alerts[1:]
    assert store.logs.alerts_after(store.logs.last_log_id()) == []
    assert [x.text for x in store.logs.alerts_after(start, limit=1)] == ["failed: boom"]  # the newest
    store.runs.delete_run(a)
    assert store.logs.run_logs(a) == [] and [x.run_id for x in store.logs.alerts_after(start)] == [b]
