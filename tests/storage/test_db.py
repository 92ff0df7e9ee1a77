"""Opening a database (``storage.db``): bad files and locations refused untouched, URLs
from the environment and arguments, read-only opens, and a busy database.

Tests that take the ``store`` or ``db_url`` fixture run on SQLite and on a throwaway
PostgreSQL (tests/conftest.py; skipped with the reason where no server can be started);
the rest are about SQLite files. Every database lives in tmp_path or that cluster."""

from __future__ import annotations

import os

import pytest
from sqlalchemy import update

from storage import (
    DEFAULT_DB_PATH,
    ENV_URL,
    DatabaseBusyError,
    RunStore,
    StorageError,
    make_engine,
    resolve_url,
)
from storage import db as storage_db
from storage.db import write_engine
from storage.models import Run
from tests.support.runs import new_run
from tests.support.sqlite import sqlite_url


def test_garbage_file_is_refused_and_left_unchanged(tmp_path):
    path = tmp_path / "garbage.db"
    payload = b"this is not sqlite\x00\xff" * 500
    path.write_bytes(payload)
    with pytest.raises(StorageError) as info:
        make_engine(f"sqlite:///{path}")
    assert "not a SQLite database" in str(info.value) and ENV_URL in str(info.value) and "--db" in str(info.value)
    with pytest.raises(StorageError):
        RunStore(str(path))  # a bare path is a SQLite file too
    assert path.read_bytes() == payload
    assert sorted(p.name for p in tmp_path.iterdir()) == ["garbage.db"]  # no -wal/-shm created


def test_unopenable_locations_raise_storage_error(tmp_path):
    blocker = tmp_path / "plain-file"
    blocker.write_text("keep me")
    with pytest.raises(StorageError, match=f"{ENV_URL} or pass --db"):
        make_engine(f"sqlite:///{blocker}/sub/lab.db")  # a directory under a regular file
    assert blocker.read_text() == "keep me"
    with pytest.raises(StorageError, match="directory"):
        make_engine(f"sqlite:///{tmp_path}")
    with pytest.raises(StorageError, match=f"malformed.*{ENV_URL}"):
        make_engine("not a url://???")
    with pytest.raises(StorageError, match=ENV_URL):
        make_engine("nosuchdialect://user@host/db")


def test_env_url_honoured_and_explicit_url_wins(tmp_path, monkeypatch):
    env_url, arg_url = sqlite_url(tmp_path, "env.db"), sqlite_url(tmp_path, "arg.db")
    monkeypatch.delenv(ENV_URL, raising=False)
    assert resolve_url() == f"sqlite:///{DEFAULT_DB_PATH}"
    assert str(DEFAULT_DB_PATH).endswith(".local/share/basis-lab/basis-lab.db")
    monkeypatch.setenv(ENV_URL, env_url)
    assert resolve_url() == env_url
    assert resolve_url(arg_url) == arg_url
    assert resolve_url(str(tmp_path / "plain.db")) == f"sqlite:///{tmp_path / 'plain.db'}"

    env_store = RunStore()
    new_run(env_store, "from-env")
    arg_store = RunStore(arg_url)
    assert env_store.url == env_url and arg_store.url == arg_url
    assert [r.name for r in env_store.runs.list_runs()] == ["from-env"]
    assert arg_store.runs.list_runs() == []
    assert (tmp_path / "env.db").exists() and (tmp_path / "arg.db").exists()
    env_store.close()
    arg_store.close()


def test_default_path_directory_is_created(tmp_path, monkeypatch):
    target = tmp_path / "deep" / "er" / "basis-lab.db"
    monkeypatch.setattr(storage_db, "DEFAULT_DB_PATH", target)
    monkeypatch.delenv(ENV_URL, raising=False)
    st = RunStore()
    assert target.exists() and st.url == f"sqlite:///{target}"
    st.close()


def test_read_only_open_of_a_missing_database_creates_nothing(tmp_path):
    target = tmp_path / "no" / "such" / "lab.db"
    for opener in (lambda: make_engine(f"sqlite:///{target}", create=False), lambda: RunStore(str(target), create=False)):
        with pytest.raises(StorageError) as info:
            opener()
        assert str(info.value) == f"no database at {target}; check the path or set {ENV_URL} (or --db)"
    assert list(tmp_path.iterdir()) == []
    RunStore(sqlite_url(tmp_path, "there.db")).close()
    RunStore(sqlite_url(tmp_path, "there.db"), create=False).close()  # an existing one opens fine


def test_read_only_database_file_and_directory_name_the_fix(tmp_path):
    path = tmp_path / "lab.db"
    RunStore(str(path)).close()
    path.chmod(0o444)
    if os.access(path, os.W_OK):
        path.chmod(0o644)
        pytest.skip("this user ignores file permissions (root with CAP_DAC_OVERRIDE), so chmod cannot make "
                    "a read-only database")
    with pytest.raises(StorageError, match="read-only; make it writable"):
        RunStore(str(path))
    path.chmod(0o644)
    tmp_path.chmod(0o555)
    try:
        with pytest.raises(StorageError, match="not writable.*make it writable"):
            RunStore(str(path))
    finally:
        tmp_path.chmod(0o755)


def test_a_held_lock_raises_database_busy_error(db_url, monkeypatch):
    a_store = RunStore(db_url)
    rid = new_run(a_store, "a")
    a_store.close()
    if db_url.startswith("sqlite"):
        monkeypatch.setattr(storage_db, "BUSY_TIMEOUT_S", 0.2)
    else:
        monkeypatch.setenv("PGOPTIONS", "-c lock_timeout=200")
    st = RunStore(db_url)
    holder = RunStore(db_url.replace("?", "?application_name=holder&") if "?" in db_url else db_url)
    with write_engine(holder.engine).begin() as con:
        con.execute(update(Run).where(Run.id == rid).values(notes="held"))
        with pytest.raises(DatabaseBusyError, match="busy.*try again") as info:
            st.runs.heartbeat(rid, 5)
        assert isinstance(info.value, StorageError) and "\n" not in str(info.value)
    st.runs.heartbeat(rid, 5)  # the retry succeeds once the lock is gone
    assert st.runs.get_run(rid).steps_done == 5
    st.close()
    holder.close()


@pytest.mark.postgres
def test_a_postgresql_server_that_is_down_is_unreachable_and_a_refusal_is_not(pg_cluster, pg_url):
    """A server gone (restarting, its socket absent) is a transient DatabaseUnreachableError,
    a kind of busy that the runner retries; a server that refuses (no such role) is not."""
    from storage import DatabaseUnreachableError

    store = RunStore(pg_url)
    rid = new_run(store, "a")
    pg_cluster.stop_server()
    try:
        with pytest.raises(DatabaseUnreachableError, match="cannot be reached.*try again") as info:
            store.runs.heartbeat(rid, 1)
        assert isinstance(info.value, DatabaseBusyError) and "\n" not in str(info.value)
        with pytest.raises(DatabaseUnreachableError):
            RunStore(pg_url)
    finally:
        pg_cluster.start_server()
    store.runs.heartbeat(rid, 2)  # the same store works again once the server is back
    assert store.runs.get_run(rid).steps_done == 2
    with pytest.raises(StorageError) as info:
        RunStore(pg_url.replace("basislab@", "nosuchrole@"))
    assert not isinstance(info.value, DatabaseBusyError)
    store.close()


def test_a_full_sqlite_disk_is_database_full_error_and_writes_nothing(tmp_path):
    """SQLite's "database or disk is full" (here: the file may not grow past its size)."""
    from sqlalchemy import event

    from storage import DatabaseFullError

    store = RunStore(sqlite_url(tmp_path, "lab.db"))
    rid = new_run(store, "a")

    @event.listens_for(store.engine, "connect")
    def _no_room(dbapi_conn, _record):
        pages = dbapi_conn.execute("PRAGMA page_count").fetchone()[0]
        dbapi_conn.execute(f"PRAGMA max_page_count = {pages}")

    store.engine.dispose()
    rows = [(step, 0.0, f"metric_{i}", 1.0) for step in range(50) for i in range(40)]
    with pytest.raises(DatabaseFullError, match="disk is full.*free space") as info:
        store.metrics.add_metrics(rid, rows)
    assert not isinstance(info.value, DatabaseBusyError) and "\n" not in str(info.value)
    assert len(store.metrics([rid])) == 0


def test_a_sqlite_file_that_cannot_be_opened_for_now_is_unreachable(tmp_path):
    """SQLite's "unable to open database file" (its folder gone for a while: an unmounted
    disk, a network share dropping) is a transient DatabaseUnreachableError, as a lost
    PostgreSQL connection is."""
    from storage import DatabaseUnreachableError

    folder = tmp_path / "share"
    folder.mkdir()
    store = RunStore(sqlite_url(folder, "lab.db"))
    rid = new_run(store, "a")
    store.engine.dispose()  # no connection left open: the next write opens the file anew
    folder.rename(tmp_path / "away")
    try:
        with pytest.raises(DatabaseUnreachableError, match="cannot be reached.*try again"):
            store.runs.heartbeat(rid, 1)
    finally:
        (tmp_path / "away").rename(folder)
    store.runs.heartbeat(rid, 1)
    assert store.runs.get_run(rid).steps_done == 1
