"""Revision 0014 (issue 43, item 17): every run-log line gets a source; the lines stored before
keep their id, run, time, level and text (source ""), and the log reads, filters and searches
old and new lines alike. Each migration test runs on SQLite and on a throwaway PostgreSQL."""

from __future__ import annotations

from datetime import datetime, timezone

import sqlalchemy as sa
from sqlalchemy import text

from storage import head_revision, schema_revision
from storage import logs as run_logs
from tests.storage.test_migration_0012 import RUN
from tests.storage.test_migrations import _at_revision, _migrated
from tests.support.runs import new_run

OLD_LINES = [  # (run, time, level, text) as 0009-0013 stored them: lifecycle lines and what a thread logged
    (1, datetime(2024, 5, 1, 12, 0, 0), "info", "claimed by host:1 (lease 1)"),
    (1, datetime(2024, 5, 1, 12, 0, 5), "warning", "UserWarning: careful (x.py:3)"),
    (2, datetime(2024, 5, 1, 12, 1, 0), "alert", "failed: nan at step 5"),
    (1, datetime(2024, 5, 1, 12, 2, 0), "info", "finished"),
]


def _database_at_0013(url: str) -> None:
    eng = _at_revision(url, "0013")
    with eng.begin() as con:
        con.execute(text(RUN), [{"uid": f"{i:032x}", "name": f"r{i}", "config": "{}"} for i in (1, 2)])
        con.execute(text("INSERT INTO run_logs (run_id, time, level, text) VALUES (:r, :t, :l, :x)"),
                    [{"r": r, "t": t, "l": level, "x": x} for r, t, level, x in OLD_LINES])
    eng.dispose()


def test_old_lines_are_kept_with_an_empty_source(empty_db_url):
    _database_at_0013(empty_db_url)
    st = _migrated(empty_db_url)
    assert schema_revision(st.engine) == head_revision() == "0014"
    got = {x.id: (x.run_id, x.time, x.level, x.text, x.source) for x in st.logs.run_logs(1) + st.logs.run_logs(2)}
    assert got == {i: (r, t.replace(tzinfo=timezone.utc), level, x, "") for i, (r, t, level, x) in enumerate(OLD_LINES, 1)}
    assert [x.text for x in st.logs.alerts_after(0)] == ["failed: nan at step 5"]
    st.logs.add_run_logs(1, [(1_700_000_000.0, "warning", "slow disk", "stderr")])  # new lines after the old ones
    last = st.logs.run_logs(1)[-1]
    assert (last.id, last.level, last.source, last.shown) == (5, "warning", "stderr", "stderr: slow disk")
    assert [x.text for x in st.logs.run_logs(1, levels=["warning"])] == ["UserWarning: careful (x.py:3)", "slow disk"]
    st.close()
    eng = sa.create_engine(empty_db_url)
    with eng.connect() as con:  # in the database, not only on read: NOT NULL with the default
        assert con.execute(text("SELECT count(*) FROM run_logs WHERE source = ''")).scalar() == 4
    eng.dispose()


def test_search_level_and_tail_read_the_lines_a_reader_asks_for(store):
    a, b = new_run(store, "a"), new_run(store, "b")
    store.logs.add_run_logs(a, [(1.0, "info", "step 10/100: val_loss 3.2", "lab"),
                           (2.0, "info", "Hello from the loop", "stdout"),
                           (3.0, "warning", "jax._src.xla_bridge: no GPU found", "jax._src.xla_bridge"),
                           (4.0, "debug", "engine.data: cache hit", "engine.data"),
                           (5.0, "error", "100% of 50% done", "stderr")])
    store.logs.add_run_logs(b, [(1.0, "info", "hello from b", "stdout")])
    assert [x.text for x in store.logs.run_logs(a, search="HELLO")] == ["Hello from the loop"]  # any case, this run's
    assert [x.source for x in store.logs.run_logs(a, search="stdout")] == ["stdout"]  # the source is searched too
    assert [x.text for x in store.logs.run_logs(a, search="xla_BRIDGE", levels=["warning", "error"])] == [
        "jax._src.xla_bridge: no GPU found"]
    assert [x.text for x in store.logs.run_logs(a, search="0% of")] == ["100% of 50% done"]  # % and _ are literal
    assert store.logs.run_logs(a, search="_src_") == []
    assert [x.level for x in store.logs.run_logs(a, tail=2)] == ["debug", "error"]  # the newest, oldest first
    assert [x.level for x in store.logs.run_logs(a, levels=run_logs.LOG_LEVELS[1:])] == ["info", "info", "warning", "error"]
    assert store.logs.run_logs(a)[1].shown == "stdout: Hello from the loop" and store.logs.run_logs(a)[2].shown.startswith("jax.")


def test_a_long_source_is_cut_and_stored(store):
    a = new_run(store, "a")
    store.logs.add_run_logs(a, [(1.0, "info", "x", "s" * 500)])
    [line] = store.logs.run_logs(a)
    assert len(line.source) == run_logs.SOURCE_MAX and line.source.endswith("…")
