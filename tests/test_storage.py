"""Tests for the storage package: concurrency, incremental reads, run lifecycle (CSV export is in
test_export.py), bad databases, schema versions/migrations and URL resolution.  Every database lives in tmp_path."""

from __future__ import annotations

import math
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta, timezone

import pandas as pd
import pytest
from sqlalchemy import inspect, text, update

import storage
from storage import (
    DEFAULT_DB_PATH,
    ENV_URL,
    SCHEMA_VERSION,
    RunNotFoundError,
    RunStore,
    StorageError,
    current_owner,
    make_engine,
    resolve_url,
    schema_version,
)
from storage import db as storage_db
from storage.models import Run


def _url(tmp_path, name="lab.db"):
    return f"sqlite:///{tmp_path / name}"


@pytest.fixture
def store(tmp_path):
    s = RunStore(_url(tmp_path))
    yield s
    s.close()


def _new_run(store, name="run", **kw):
    args = dict(
        name=name,
        config={"estimator": "ep", "model": {"width": 64, "depth": 2}, "lr": 1e-3, "layers": [1, 2]},
        estimator="ep",
        rank=8,
        lam=0.25,
        seed=0,
        preset="tiny",
        steps=100,
    )
    args.update(kw)
    return store.create_run(**args)


def _dead_pid():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()  # exited and reaped: the pid is free
    return proc.pid


# ----------------------------------------------------------------------------- concurrency


def test_concurrent_writers_and_polling_reader_lose_nothing(tmp_path):
    url = _url(tmp_path)
    setup = RunStore(url)
    run_ids = [_new_run(setup, name=f"w{i}") for i in range(2)]
    n_rows, batch = 4000, 40
    names = ("train_loss", "val_loss")
    errors: list[BaseException] = []
    done = threading.Event()
    seen: list[pd.DataFrame] = []

    def expected(w, i):
        return (i // 2, 0.5 * i, names[i % 2], w * 1e6 + i + 0.125)

    def writer(w, run_id):
        st = RunStore(url)  # own engine and connections, like a separate process
        try:
            for start in range(0, n_rows, batch):
                st.add_metrics(run_id, [expected(w, i) for i in range(start, start + batch)])
                st.heartbeat(run_id, start + batch)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)
        finally:
            st.close()

    def reader():
        st = RunStore(url)
        last = 0
        try:
            while True:
                finished = done.is_set()
                frame = st.metrics(run_ids, after_id=last)
                if len(frame):
                    assert frame["id"].is_monotonic_increasing and frame["id"].iloc[0] > last
                    last = int(frame["id"].iloc[-1])
                    seen.append(frame)
                if finished:
                    return
                time.sleep(0.005)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)
        finally:
            st.close()

    threads = [threading.Thread(target=writer, args=(w, rid)) for w, rid in enumerate(run_ids)]
    rt = threading.Thread(target=reader)
    rt.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    done.set()
    rt.join(60)
    assert not errors, errors
    assert len(seen) > 2  # the reader really polled while writing

    got = pd.concat(seen, ignore_index=True)
    assert got["id"].is_unique and got["id"].is_monotonic_increasing
    assert len(got) == 2 * n_rows
    everything = setup.metrics(run_ids)
    assert everything["id"].tolist() == got["id"].tolist()
    for w, run_id in enumerate(run_ids):
        mine = got[got["run_id"] == run_id]
        assert len(mine) == n_rows
        rows = list(zip(mine["step"], mine["wall_time"], mine["name"], mine["value"]))
        assert rows == [expected(w, i) for i in range(n_rows)]
    assert setup.get_run(run_ids[0]).steps_done == n_rows
    setup.close()


# ----------------------------------------------------------------------------- reads


def test_incremental_reads_return_exactly_the_newer_rows(store):
    a, b = _new_run(store, "a"), _new_run(store, "b")
    store.add_metrics(a, [(s, float(s), "train_loss", s / 10) for s in range(5)])
    store.add_metrics(b, [(s, float(s), "train_loss", -s) for s in range(5)])
    first = store.metrics([a, b])
    assert list(first.columns) == ["id", "run_id", "step", "wall_time", "name", "value"]
    assert len(first) == 10 and first["id"].is_monotonic_increasing
    last = int(first["id"].max())
    assert store.metrics([a, b], after_id=last).empty

    store.add_metrics(a, [(5, 5.0, "train_loss", 0.5), (5, 5.0, "val_loss", 0.7)])
    store.add_metrics(b, [(5, 5.0, "train_loss", -5.0)])
    newer = store.metrics([a, b], after_id=last)
    assert list(zip(newer["run_id"], newer["name"], newer["value"])) == [
        (a, "train_loss", 0.5), (a, "val_loss", 0.7), (b, "train_loss", -5.0)
    ]
    assert (newer["id"] > last).all()
    only_a = store.metrics([a], after_id=last)
    assert set(only_a["run_id"]) == {a} and len(only_a) == 2
    val = store.metrics([a, b], names=["val_loss"], after_id=0)
    assert val["value"].tolist() == [0.7]
    assert store.metrics([], after_id=0).empty
    assert store.metrics([a], names=[]).empty

    # NaN (a diverged loss) is stored and read back as NaN, not an error
    store.add_metrics(a, [(6, 6.0, "train_loss", float("nan"))])
    assert math.isnan(store.metrics([a], after_id=int(newer["id"].max()))["value"].iloc[0])


def test_metric_ids_are_never_reused_after_delete(store):
    a, b = _new_run(store, "a"), _new_run(store, "b")
    store.add_metrics(a, [(0, 0.0, "x", 1.0)])
    store.add_metrics(b, [(s, 0.0, "x", 1.0) for s in range(3)])
    high = int(store.metrics([b])["id"].max())
    store.delete_run(b)
    assert store.metrics([b]).empty
    with sqlite3.connect(store.engine.url.database) as con:
        assert con.execute("SELECT count(*) FROM metrics WHERE run_id = ?", (b,)).fetchone()[0] == 0
    store.add_metrics(a, [(1, 1.0, "x", 2.0)])
    assert int(store.metrics([a])["id"].max()) > high


def test_runs_frame_and_record_fields(store):
    a = _new_run(store, "a", versions={"jax": "0.4"}, git_commit="abc123", device="cpu")
    b = _new_run(store, "b", rank=None)
    store.add_metrics(a, [(1, 1.0, "train_loss", 3.0), (2, 2.0, "train_loss", 2.0), (1, 1.0, "val_loss", 4.0),
                          (2, 2.0, "cos_mean", 0.9)])
    rec = store.get_run(a)
    assert rec.config["model"] == {"width": 64, "depth": 2} and rec.versions == {"jax": "0.4"}
    assert rec.created_at.tzinfo is not None and rec.created_at.utcoffset() == timedelta(0)
    assert (rec.git_commit, rec.device, rec.status, rec.rank) == ("abc123", "cpu", "queued", 8)
    frame = store.runs_frame()
    assert frame["id"].tolist() == [a, b]
    assert {"config", "versions"}.isdisjoint(frame.columns)
    for col in ("name", "status", "created_at", "heartbeat_at", "estimator", "rank", "lam", "seed", "preset",
                "steps", "steps_done", "error", "notes", "git_commit", "device", "owner", "cancel_requested"):
        assert col in frame.columns
    row = frame.set_index("id").loc[a]
    assert (row["last_train_loss"], row["last_val_loss"], row["last_mean_cos"]) == (2.0, 4.0, 0.9)
    assert frame.set_index("id").loc[b, ["last_train_loss", "last_val_loss"]].isna().all()
    assert pd.isna(frame.set_index("id").loc[b, "rank"])
    assert str(frame["created_at"].dt.tz) == "UTC"


def test_rename_notes_delete_and_resolve(store):
    a, b, c = _new_run(store, "alpha"), _new_run(store, "beta"), _new_run(store, "beta")
    store.add_metrics(a, [(0, 0.0, "train_loss", 1.0)])
    store.rename_run(a, "gamma")
    store.set_notes(a, "lr too high")
    rec = store.get_run(a)
    assert (rec.name, rec.notes) == ("gamma", "lr too high")
    assert store.resolve_runs(["gamma", str(b), a]) == [a, b]
    with pytest.raises(StorageError, match="ambiguous"):
        store.resolve_runs(["beta"])
    with pytest.raises(StorageError, match="engine list"):
        store.resolve_runs(["nope"])
    with pytest.raises(StorageError, match=r"no run 999; `python -m engine list`"):
        store.get_run(999)
    with pytest.raises(KeyError):
        store.get_run(999)
    store.claim(c, current_owner())
    with pytest.raises(StorageError, match="cancel it first"):
        store.delete_run(c)
    store.delete_run(a)
    assert [r.id for r in store.list_runs()] == [b, c]
    assert store.metrics([a]).empty
    with pytest.raises(RunNotFoundError):
        store.add_metrics(a, [(1, 1.0, "x", 1.0)])


# ----------------------------------------------------------------------------- lifecycle


def test_status_lifecycle_claim_cancel(store):
    a = _new_run(store, "a")
    assert store.claim(a, "host:1") is True
    assert store.claim(a, "host:2") is False  # only from queued
    rec = store.get_run(a)
    assert rec.status == "running" and rec.owner == "host:1" and rec.started_at and rec.heartbeat_at
    before = rec.heartbeat_at
    store.heartbeat(a, 17)
    rec = store.get_run(a)
    assert rec.steps_done == 17 and rec.heartbeat_at >= before

    # cancel a running run: only the flag, the worker stops itself
    assert store.cancel_requested(a) is False
    assert store.request_cancel(a) is True
    rec = store.get_run(a)
    assert rec.status == "running" and rec.cancel_requested and store.cancel_requested(a)
    store.set_status(a, "cancelled")
    rec = store.get_run(a)
    assert rec.status == "cancelled" and rec.finished_at is not None
    assert store.request_cancel(a) is False  # already ended

    # cancel a queued run: cancelled at once, and it can no longer be claimed
    b = _new_run(store, "b")
    assert store.request_cancel(b) is True
    assert store.get_run(b).status == "cancelled" and store.get_run(b).finished_at is not None
    assert store.claim(b, "host:1") is False

    c = _new_run(store, "c")
    store.claim(c, "host:1")
    store.set_status(c, "failed", error="boom")
    rec = store.get_run(c)
    assert (rec.status, rec.error) == ("failed", "boom") and rec.finished_at is not None
    assert not store.claim(c, "host:1")
    with pytest.raises(ValueError, match="queued, running"):
        store.set_status(c, "exploded")
    assert [r.id for r in store.list_runs(statuses=["cancelled"])] == [a, b]
    assert [r.id for r in store.list_runs(statuses=storage.ACTIVE_STATUSES)] == []
    assert store.runs_frame().set_index("id").loc[c, "status"] == "failed"


def test_mark_stale_interrupted(store):
    host = socket.gethostname()
    old = datetime.now(timezone.utc) - timedelta(hours=1)

    def running(name, owner, heartbeat=None):
        rid = _new_run(store, name)
        assert store.claim(rid, owner)
        if heartbeat is not None:
            with store.engine.begin() as con:
                con.execute(update(Run).where(Run.id == rid).values(heartbeat_at=heartbeat))
        return rid

    dead_old = running("dead-old", f"{host}:{_dead_pid()}", old)
    dead_fresh = running("dead-fresh", f"{host}:{_dead_pid()}")
    remote_old = running("remote-old", "elsewhere.example:1234", old)
    live = running("live", current_owner())
    remote_fresh = running("remote-fresh", "elsewhere.example:1234")
    queued = _new_run(store, "queued")

    assert store.mark_stale_interrupted(heartbeat_timeout_s=120) == sorted([dead_old, dead_fresh, remote_old])
    status = {r.id: r.status for r in store.list_runs()}
    assert status == {dead_old: "interrupted", dead_fresh: "interrupted", remote_old: "interrupted",
                      live: "running", remote_fresh: "running", queued: "queued"}
    rec = store.get_run(dead_old)
    assert rec.finished_at is not None and "interrupted" in rec.error
    assert store.mark_stale_interrupted() == []  # idempotent


# ----------------------------------------------------------------------------- bad databases


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


def test_newer_schema_and_foreign_tables_are_refused_untouched(tmp_path):
    newer = tmp_path / "newer.db"
    with sqlite3.connect(newer) as con:
        con.execute("CREATE TABLE schema_version (version INTEGER PRIMARY KEY)")
        con.execute("INSERT INTO schema_version VALUES (?)", (SCHEMA_VERSION + 1,))
        con.execute("CREATE TABLE runs (id INTEGER PRIMARY KEY, name TEXT)")
    con.close()
    with pytest.raises(StorageError, match="newer than this BASIS Lab"):
        make_engine(f"sqlite:///{newer}")

    foreign = tmp_path / "foreign.db"
    with sqlite3.connect(foreign) as con:
        con.execute("CREATE TABLE runs (run_key TEXT, what TEXT)")
        con.execute("INSERT INTO runs VALUES ('k', 'v')")
    con.close()
    with pytest.raises(StorageError, match="did not create"):
        make_engine(f"sqlite:///{foreign}")
    with sqlite3.connect(foreign) as con:
        assert [r[1] for r in con.execute("PRAGMA table_info(runs)")] == ["run_key", "what"]
        assert {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")} == {"runs"}
    con.close()


# ----------------------------------------------------------------------------- schema


def test_schema_version_recorded_and_runs_survive_reopen(tmp_path):
    url = _url(tmp_path)
    s1 = RunStore(url)
    rid = _new_run(s1, "keep")
    s1.add_metrics(rid, [(0, 0.0, "train_loss", 1.5)])
    s1.close()
    eng = make_engine(url)
    assert schema_version(eng) == SCHEMA_VERSION == len(storage.MIGRATIONS) == 1
    with eng.connect() as con:
        assert con.execute(text("SELECT version FROM schema_version")).scalars().all() == [SCHEMA_VERSION]
        assert con.execute(text("PRAGMA journal_mode")).scalar() == "wal"
        assert con.execute(text("PRAGMA foreign_keys")).scalar() == 1
        assert con.execute(text("PRAGMA busy_timeout")).scalar() >= 10_000
        indexes = {ix["name"]: ix["column_names"] for ix in inspect(con).get_indexes("metrics")}
    assert indexes["ix_metrics_run_id_id"] == ["run_id", "id"]
    assert indexes["ix_metrics_run_id_name_step"] == ["run_id", "name", "step"]
    s2 = RunStore(engine=eng)
    assert [r.name for r in s2.list_runs()] == ["keep"]
    assert s2.metrics([rid])["value"].tolist() == [1.5]
    s2.close()


def _columns(engine):
    insp = inspect(engine)
    return {t: {c["name"] for c in insp.get_columns(t)} for t in ("runs", "metrics", "schema_version")}


def test_unversioned_v0_database_is_migrated_keeping_runs(tmp_path):
    path = tmp_path / "v0.db"
    with sqlite3.connect(path) as con:
        con.execute("CREATE TABLE runs (id INTEGER PRIMARY KEY, name TEXT, status TEXT, config TEXT, "
                    "estimator TEXT, lam REAL, created_at DATETIME)")
        con.executemany("INSERT INTO runs (id, name, status, config, estimator, lam, created_at) VALUES (?,?,?,?,?,?,?)",
                        [(1, "old-a", "finished", '{"lr": 0.1}', "ep", 0.5, "2024-01-02 03:04:05.000000"),
                         (7, None, None, None, "bp", 1.0, None)])
    con.close()
    eng = make_engine(f"sqlite:///{path}")
    assert schema_version(eng) == SCHEMA_VERSION
    fresh = make_engine(_url(tmp_path, "fresh.db"))
    assert _columns(eng) == _columns(fresh)  # the frozen v1 migration matches models.py
    fresh_ix = {ix["name"] for ix in inspect(fresh).get_indexes("runs")}
    assert fresh_ix <= {ix["name"] for ix in inspect(eng).get_indexes("runs")}

    st = RunStore(engine=eng)
    runs = {r.id: r for r in st.list_runs()}
    assert sorted(runs) == [1, 7]
    assert (runs[1].name, runs[1].status, runs[1].config, runs[1].lam) == ("old-a", "finished", {"lr": 0.1}, 0.5)
    assert runs[1].created_at == datetime(2024, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    assert (runs[7].name, runs[7].status, runs[7].config, runs[7].cancel_requested) == ("run-7", "finished", {}, False)
    st.add_metrics(1, [(0, 0.0, "train_loss", 2.0)])
    assert st.runs_frame().set_index("id").loc[1, "last_train_loss"] == 2.0
    new = _new_run(st, "new")
    assert new > 7
    st.close()
    fresh.dispose()


def test_failed_migration_leaves_database_unchanged(tmp_path, monkeypatch):
    url = _url(tmp_path)
    st = RunStore(url)
    rid = _new_run(st, "precious")
    st.close()

    def broken_1_to_2(conn):
        conn.exec_driver_sql("ALTER TABLE runs ADD COLUMN half_done INTEGER")
        raise RuntimeError("simulated failure")

    monkeypatch.setattr(storage_db, "MIGRATIONS", [*storage_db.MIGRATIONS, broken_1_to_2])
    monkeypatch.setattr(storage_db, "SCHEMA_VERSION", 2)
    with pytest.raises(StorageError, match="from schema version 1 to 2 failed.*left unchanged"):
        make_engine(url)
    monkeypatch.undo()
    eng = make_engine(url)
    assert schema_version(eng) == 1
    assert "half_done" not in _columns(eng)["runs"]
    assert [r.name for r in RunStore(engine=eng).list_runs()] == ["precious"] and rid == 1
    eng.dispose()


def test_migration_chain_runs_in_order(tmp_path, monkeypatch):
    url = _url(tmp_path)
    RunStore(url).close()
    calls = []

    def add_tags(conn):
        calls.append("1->2")
        conn.exec_driver_sql("ALTER TABLE runs ADD COLUMN tags TEXT")

    monkeypatch.setattr(storage_db, "MIGRATIONS", [*storage_db.MIGRATIONS, add_tags])
    monkeypatch.setattr(storage_db, "SCHEMA_VERSION", 2)
    eng = make_engine(url)
    assert calls == ["1->2"] and schema_version(eng) == 2 and "tags" in _columns(eng)["runs"]
    make_engine(url).dispose()  # already current: nothing runs again
    assert calls == ["1->2"]
    eng.dispose()


# ----------------------------------------------------------------------------- URLs


def test_env_url_honoured_and_explicit_url_wins(tmp_path, monkeypatch):
    env_url, arg_url = _url(tmp_path, "env.db"), _url(tmp_path, "arg.db")
    monkeypatch.delenv(ENV_URL, raising=False)
    assert resolve_url() == f"sqlite:///{DEFAULT_DB_PATH}"
    assert str(DEFAULT_DB_PATH).endswith(".local/share/basis-lab/basis-lab.db")
    monkeypatch.setenv(ENV_URL, env_url)
    assert resolve_url() == env_url
    assert resolve_url(arg_url) == arg_url
    assert resolve_url(str(tmp_path / "plain.db")) == f"sqlite:///{tmp_path / 'plain.db'}"

    env_store = RunStore()
    _new_run(env_store, "from-env")
    arg_store = RunStore(arg_url)
    assert env_store.url == env_url and arg_store.url == arg_url
    assert [r.name for r in env_store.list_runs()] == ["from-env"]
    assert arg_store.list_runs() == []
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


# ----------------------------------------------------------------------------- scale


def test_polling_is_fast_with_50_runs_and_100k_metrics(store):
    run_ids = [_new_run(store, f"r{i}") for i in range(50)]
    for rid in run_ids:
        store.add_metrics(rid, [(s // 2, float(s), ("train_loss", "val_loss")[s % 2], s * 1e-3) for s in range(2000)])
    with store.engine.connect() as con:
        plan = " ".join(str(r[-1]) for r in con.execute(text(
            "EXPLAIN QUERY PLAN SELECT id, run_id, step, wall_time, name, value FROM metrics "
            "WHERE run_id IN (1, 2, 3) AND id > 99000 ORDER BY id")))
    assert "ix_metrics_run_id_id" in plan or "INTEGER PRIMARY KEY" in plan, plan

    with store.engine.connect() as con:
        before = con.execute(text("SELECT max(id) FROM metrics")).scalar()
    store.add_metrics(run_ids[-1], [(1000, 1.0, "train_loss", 0.5)])
    t0 = time.perf_counter()
    for _ in range(20):
        frame = store.metrics(run_ids, after_id=before)
    poll = (time.perf_counter() - t0) / 20
    assert len(frame) == 1 and poll < 0.1, poll

    t0 = time.perf_counter()
    frame = store.runs_frame()
    assert time.perf_counter() - t0 < 1.0
    assert len(frame) == 50 and frame.set_index("id").loc[run_ids[-1], "last_train_loss"] == 0.5

    t0 = time.perf_counter()
    everything = store.metrics(run_ids)
    assert len(everything) == 100_001 and time.perf_counter() - t0 < 3.0
