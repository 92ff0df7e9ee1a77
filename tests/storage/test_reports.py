"""Stored reports (``storage.reports``): saved, listed, read back exactly, replaced in place
by key, deleted; on SQLite and PostgreSQL, and in a database upgraded from revision 0002."""

import json
import threading

import pytest
import sqlalchemy
from alembic import command
from sqlalchemy import inspect

from storage import RunStore, StorageError
from storage import db as storage_db


def _run(store, sweep_id="sw-1"):
    return store.runs.create_run(name="r", config={}, estimator="exact", rank=None, lam=0.0, seed=0, preset="tiny",
                            steps=1, sweep_id=sweep_id)


def test_a_report_is_stored_listed_read_back_and_deleted(store):
    a, b = _run(store), _run(store, "sw-2")
    content = json.dumps({"numbers": [1.5, 2.25], "text": "λ ±"})
    first = store.reports.save_report(title="sweep sw-1", content=content, run_ids=[a], selection={"sweep": "sw-1"},
                              at_step=40, sweep_id="sw-1")
    second = store.reports.save_report(title="two runs", content="{}", run_ids=[a, b], selection={"runs": [a, b]})
    assert second > first
    listed = store.reports.list_reports()
    assert [r.id for r in listed] == [second, first] and all(r.content is None for r in listed)
    assert [r.id for r in store.reports.list_reports(sweep_id="sw-1")] == [first]
    assert [r.id for r in store.reports.list_reports(run_id=b)] == [second]
    got = store.reports.get_report(first)
    assert (got.title, got.content, got.run_ids, got.selection, got.at_step, got.sweep_id, got.key) == (
        "sweep sw-1", content, [a], {"sweep": "sw-1"}, 40, "sw-1", None)
    assert got.created_at.tzinfo is not None
    store.runs.delete_run(a)  # a report is a snapshot: the run's deletion leaves it
    assert store.reports.get_report(first).run_ids == [a]
    store.reports.delete_report(first)
    with pytest.raises(StorageError, match=f"no report {first}; list the stored reports"):
        store.reports.get_report(first)
    with pytest.raises(StorageError, match="no report"):
        store.reports.delete_report(first)
    assert [r.id for r in store.reports.list_reports()] == [second]


def test_saving_under_a_key_replaces_that_report_in_place(store):
    a = _run(store)
    first = store.reports.save_report(title="old", content="1", run_ids=[a], selection={}, key="sweep:sw-1", sweep_id="sw-1")
    other = store.reports.save_report(title="other", content="3", run_ids=[a], selection={})
    again = store.reports.save_report(title="new", content="2", run_ids=[a], selection={"at": 1}, key="sweep:sw-1",
                              sweep_id="sw-1")
    assert again == first != other
    got = store.reports.get_report(first)
    assert (got.title, got.content, got.selection, got.key) == ("new", "2", {"at": 1}, "sweep:sw-1")
    assert len(store.reports.list_reports()) == 2


def test_two_processes_saving_one_key_at_once_leave_one_report(store):
    a = _run(store)
    errors = []

    def save(i):
        try:
            store.reports.save_report(title=f"t{i}", content=str(i), run_ids=[a], selection={}, key="sweep:race")
        except StorageError as e:  # busy is allowed to surface; a duplicate never is
            errors.append(e)

    threads = [threading.Thread(target=save, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not [e for e in errors if "unique" in str(e).lower()]
    assert len(store.reports.list_reports()) == 1


@pytest.mark.parametrize("content", ["", None])
def test_a_report_without_content_is_refused_and_nothing_is_stored(store, content):
    with pytest.raises(ValueError, match="content must be non-empty text"):
        store.reports.save_report(title="x", content=content, run_ids=[], selection={})
    assert store.reports.list_reports() == []


def test_a_database_at_revision_0002_gains_the_reports_table_and_keeps_its_runs(tmp_path):
    """Build a database at 0002 (Alembic's own upgrade to that revision), then open it."""
    url = f"sqlite:///{tmp_path / 'old.db'}"
    raw = sqlalchemy.create_engine(url)
    with raw.begin() as con:
        cfg = storage_db._alembic_config(con)
        command.upgrade(cfg, "0002")
        con.exec_driver_sql("INSERT INTO runs (uid, name, status, config, tags, history_version) "
                            "VALUES ('u1', 'kept', 'finished', '{}', '[]', 0)")
    assert "reports" not in inspect(raw).get_table_names()
    raw.dispose()
    store = RunStore(url)
    assert [r.name for r in store.runs.list_runs()] == ["kept"]
    rid = store.reports.save_report(title="t", content="{}", run_ids=[1], selection={})
    assert store.reports.get_report(rid).title == "t"
    store.close()
