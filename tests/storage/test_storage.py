"""Tests for the storage package: concurrency, incremental reads, run lifecycle, claiming,
workers, diagnostics (CSV export is in test_export.py), bad databases, Alembic migrations and URL resolution.

Tests that take the ``store`` or ``db_url`` fixture run on SQLite and on a throwaway
PostgreSQL (tests/conftest.py; skipped with the reason where no server can be started);
the rest are about SQLite files.  Every database lives in tmp_path or that cluster."""

from __future__ import annotations

import math
import multiprocessing
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta, timezone

import numpy as np
import pandas as pd
import pytest
from sqlalchemy import func, insert, inspect, select, text, update

import storage
from engine.runner.liveness import current_owner, mark_stale_interrupted, stale_runs
from storage import (
    DEFAULT_DB_PATH,
    ENV_URL,
    DatabaseBusyError,
    MetricsFeed,
    RunNotFoundError,
    RunStore,
    StorageError,
    head_revision,
    make_engine,
    resolve_url,
    schema_revision,
)
from storage import db as storage_db
from storage.db import write_engine
from storage.models import Metric, Run

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")


def _url(tmp_path, name="lab.db"):
    return f"sqlite:///{tmp_path / name}"


@pytest.fixture
def sqlite_store(tmp_path):
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
    with store.engine.connect() as con:
        assert con.execute(select(func.count()).select_from(Metric).where(Metric.run_id == b)).scalar() == 0
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
    with pytest.raises(StorageError, match="list the runs"):
        store.resolve_runs(["nope"])
    with pytest.raises(StorageError, match=r"no run 999; list the runs to see their ids"):
        store.get_run(999)
    with pytest.raises(KeyError):
        store.get_run(999)
    store.claim(c, current_owner())
    with pytest.raises(StorageError, match="cancel it first") as info:
        store.delete_run(c)
    assert "python -m" not in str(info.value)  # storage names no CLI
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

    assert mark_stale_interrupted(store, 120) == sorted([dead_old, dead_fresh, remote_old])
    status = {r.id: r.status for r in store.list_runs()}
    assert status == {dead_old: "interrupted", dead_fresh: "interrupted", remote_old: "interrupted",
                      live: "running", remote_fresh: "running", queued: "queued"}
    rec = store.get_run(dead_old)
    assert rec.finished_at is not None and "interrupted" in rec.error
    assert mark_stale_interrupted(store) == []  # idempotent


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
    with sqlite3.connect(newer) as con:  # a pre-Alembic database from a newer code line
        con.execute("CREATE TABLE schema_version (version INTEGER PRIMARY KEY)")
        con.execute("INSERT INTO schema_version VALUES (?)", (2,))
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


def test_unknown_alembic_revision_is_refused_untouched(tmp_path):
    url = _url(tmp_path)
    st = RunStore(url)
    _new_run(st, "keep")
    st.close()
    with sqlite3.connect(tmp_path / "lab.db") as con:
        con.execute("UPDATE alembic_version SET version_num = 'ffff_from_the_future'")
    con.close()
    before = (tmp_path / "lab.db").read_bytes()
    with pytest.raises(StorageError) as info:
        make_engine(url)
    message = str(info.value)
    assert "\n" not in message and "ffff_from_the_future" in message and "newer than this BASIS Lab" in message
    assert "upgrade BASIS Lab" in message and ENV_URL in message
    assert (tmp_path / "lab.db").read_bytes() == before


# ----------------------------------------------------------------------------- schema


def _schema(engine):
    """{table: (column names, index names)} of every table but Alembic's own."""
    insp = inspect(engine)
    return {
        t: ({c["name"] for c in insp.get_columns(t)}, {ix["name"] for ix in insp.get_indexes(t)})
        for t in insp.get_table_names() if t != "alembic_version"
    }


def test_schema_revision_recorded_and_runs_survive_reopen(tmp_path):
    url = _url(tmp_path)
    s1 = RunStore(url)
    rid = _new_run(s1, "keep")
    s1.add_metrics(rid, [(0, 0.0, "train_loss", 1.5)])
    s1.close()
    eng = make_engine(url)
    assert schema_revision(eng) == head_revision()
    with eng.connect() as con:
        assert con.execute(text("SELECT version_num FROM alembic_version")).scalars().all() == [head_revision()]
        assert "schema_version" not in inspect(con).get_table_names()
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


def test_migrations_build_exactly_the_models(db_url):
    """Alembic's autogenerate finds no table, column or index that models.py and the
    revisions disagree on (a schema change without its revision fails here)."""
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    eng = make_engine(db_url)
    with eng.connect() as con:
        diffs = compare_metadata(MigrationContext.configure(con), storage.Base.metadata)
    structural = [d for d in diffs if isinstance(d, tuple) and d[0] in
                  ("add_table", "remove_table", "add_column", "remove_column", "add_index", "remove_index",
                   "add_fk", "remove_fk")]
    assert structural == []
    assert set(inspect(eng).get_table_names()) == {"alembic_version", "runs", "metrics", "workers", "diagnostics",
                                                   "diagnostic_results", "saved_views"}
    eng.dispose()


def _raw_rows(path, table, columns):
    with sqlite3.connect(path) as con:
        rows = con.execute(f"SELECT {', '.join(columns)} FROM {table} ORDER BY id").fetchall()
    con.close()
    return rows


def test_database_written_by_main_before_alembic_is_upgraded_in_place(tmp_path):
    """tests/storage/fixtures/v1-main.db was written by the storage code of main at 28dc8ee
    (``schema_version`` 1, no ``alembic_version``)."""
    path = tmp_path / "v1.db"
    shutil.copy(os.path.join(FIXTURES, "v1-main.db"), path)
    with sqlite3.connect(path) as con:
        run_cols = [r[1] for r in con.execute("PRAGMA table_info(runs)")]
        metric_cols = [r[1] for r in con.execute("PRAGMA table_info(metrics)")]
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    con.close()
    assert "alembic_version" not in tables and "schema_version" in tables
    runs_before = _raw_rows(path, "runs", run_cols)
    metrics_before = _raw_rows(path, "metrics", metric_cols)
    assert len(runs_before) == 6 and len(metrics_before) == 20

    st = RunStore(str(path))
    assert schema_revision(st.engine) == head_revision()
    assert _raw_rows(path, "runs", run_cols) == runs_before  # every old column of every run, byte for byte
    assert _raw_rows(path, "metrics", metric_cols) == metrics_before
    assert "schema_version" not in inspect(st.engine).get_table_names()

    runs = {r.id: r for r in st.list_runs()}
    assert {i: (r.name, r.status) for i, r in runs.items()} == {
        1: ("finished-run", "finished"), 2: ("diverged", "failed"), 3: ("cancelled-queued", "cancelled"),
        4: ("cancelled-running", "cancelled"), 5: ("still-queued", "queued"), 6: ("interrupted-run", "interrupted")}
    assert runs[1].notes == 'notes with, comma and "quotes"\nsecond line'
    assert runs[2].error.startswith("TrainingDiverged") and runs[4].cancel_requested
    assert runs[1].config["model"] == {"width": 16, "depth": 1} and runs[1].versions == {"jax": "0.4.x"}
    assert all(len(r.uid) == 32 for r in runs.values()) and len({r.uid for r in runs.values()}) == 6
    assert all(r.tags == [] and r.history_version == 0 and r.sweep_id is None for r in runs.values())
    m = st.metrics(list(runs))
    assert len(m) == 20
    assert math.isnan(m[(m.run_id == 2) & (m.step == 1)]["value"].iloc[0])  # the diverged loss
    assert st.runs_frame().set_index("id").loc[1, "last_train_loss"] == pytest.approx(1.6)
    # the rebuilt runs table now never reuses an id, and its children still point at it
    new = _new_run(st, "after-upgrade")
    assert new == 7
    st.delete_run(new)
    assert _new_run(st, "again") == 8
    st.delete_run(1)
    assert st.metrics([1]).empty and len(st.metrics(list(runs))) == 5
    st.close()


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
    assert schema_revision(eng) == head_revision()
    fresh = make_engine(_url(tmp_path, "fresh.db"))
    assert _schema(eng) == _schema(fresh)  # adopting and creating give the same schema

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


def _migrations_copy(tmp_path, monkeypatch, body):
    """A copy of storage/migrations with one more revision after head whose upgrade is ``body``."""
    target = tmp_path / "migrations"
    shutil.copytree(storage_db.MIGRATIONS_DIR, target, ignore=shutil.ignore_patterns("__pycache__"))
    (target / "versions" / "9001_extra.py").write_text(
        f"from alembic import op\nimport sqlalchemy as sa\n\nrevision = '9001'\ndown_revision = '{head_revision()}'\n"
        f"branch_labels = None\ndepends_on = None\n\n\ndef upgrade():\n{body}\n\n\ndef downgrade():\n    pass\n"
    )
    monkeypatch.setattr(storage_db, "MIGRATIONS_DIR", target)


def test_failed_migration_leaves_database_unchanged(tmp_path, monkeypatch):
    url = _url(tmp_path)
    st = RunStore(url)
    rid = _new_run(st, "precious")
    st.add_metrics(rid, [(0, 0.0, "train_loss", 1.0)])
    st.close()
    head = head_revision()

    _migrations_copy(tmp_path, monkeypatch, "    op.add_column('runs', sa.Column('half_done', sa.Integer))\n"
                                             "    op.execute('DELETE FROM metrics')\n"
                                             "    raise RuntimeError('simulated failure')")
    with pytest.raises(StorageError, match=f"from schema revision {head} to 9001 failed.*left unchanged"):
        make_engine(url)
    monkeypatch.undo()
    eng = make_engine(url)
    assert schema_revision(eng) == head
    assert "half_done" not in _schema(eng)["runs"][0]
    st = RunStore(engine=eng)
    assert [r.name for r in st.list_runs()] == ["precious"] and rid == 1
    assert st.metrics([rid])["value"].tolist() == [1.0]
    eng.dispose()


def test_migration_chain_runs_in_order_once(tmp_path, monkeypatch):
    url = _url(tmp_path)
    RunStore(url).close()
    _migrations_copy(tmp_path, monkeypatch, "    op.add_column('runs', sa.Column('colour', sa.Text))")
    eng = make_engine(url)
    assert schema_revision(eng) == "9001" and "colour" in _schema(eng)["runs"][0]
    eng.dispose()
    make_engine(url).dispose()  # already current: nothing runs again
    monkeypatch.undo()
    with pytest.raises(StorageError, match="'9001', newer than this BASIS Lab"):
        make_engine(url)  # the older code refuses the newer database


def test_two_processes_opening_a_new_database_at_once_upgrade_it_once(db_url):
    code = ("import sys; sys.path.insert(0, sys.argv[2]); from storage import RunStore; "
            "s = RunStore(sys.argv[1]); print(len(s.list_runs())); s.close()")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    procs = [subprocess.Popen([sys.executable, "-c", code, db_url, root], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for _ in range(3)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [o[1].decode()[-500:] for o in outs]
    eng = make_engine(db_url)
    assert schema_revision(eng) == head_revision()
    with eng.connect() as con:
        assert con.execute(text("SELECT count(*) FROM alembic_version")).scalar() == 1
    eng.dispose()


def _revision_module(name):
    import importlib.util

    path = storage_db.MIGRATIONS_DIR / "versions" / name
    spec = importlib.util.spec_from_file_location(f"_basis_revision_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_v1_database_on_postgresql_is_adopted_in_place(pg_url, tmp_path):
    """The fixture's runs and metrics, copied into a PostgreSQL database with today's main
    schema (revision 0001's frozen tables plus ``schema_version`` = 1), upgrade in place."""
    import json

    import sqlalchemy as sa

    fixture = os.path.join(FIXTURES, "v1-main.db")
    tables = _revision_module("0001_runs_and_metrics.py")._tables()
    md = next(iter(tables.values())).metadata
    sa.Table("schema_version", md, sa.Column("version", sa.Integer, primary_key=True, autoincrement=False))
    raw = sa.create_engine(pg_url)
    with sqlite3.connect(fixture) as con:
        con.row_factory = sqlite3.Row
        runs = [dict(r) for r in con.execute("SELECT * FROM runs ORDER BY id")]
        metrics = [dict(r) for r in con.execute("SELECT * FROM metrics ORDER BY id")]
    con.close()
    for r in runs:
        for k in ("created_at", "started_at", "finished_at", "heartbeat_at"):
            r[k] = None if r[k] is None else datetime.fromisoformat(r[k])
        r["config"], r["versions"] = json.loads(r["config"]), json.loads(r["versions"])
        r["cancel_requested"] = bool(r["cancel_requested"])
    for m in metrics:
        m["value"] = float("nan") if m["value"] is None else m["value"]  # SQLite keeps NaN as NULL
    with raw.begin() as con:
        md.create_all(con)
        con.execute(tables["runs"].insert(), runs)
        con.execute(tables["metrics"].insert(), metrics)
        con.execute(text("SELECT setval('runs_id_seq', 6)"))
        con.execute(text("INSERT INTO schema_version VALUES (1)"))
    raw.dispose()

    st = RunStore(pg_url)
    assert schema_revision(st.engine) == head_revision()
    assert "schema_version" not in inspect(st.engine).get_table_names()
    got = {r.id: r for r in st.list_runs()}
    assert sorted(got) == [r["id"] for r in runs]
    for r in runs:
        rec = got[r["id"]]
        for k in ("name", "status", "config", "versions", "error", "notes", "owner", "cancel_requested", "steps_done",
                  "estimator", "rank", "lam", "seed"):
            assert getattr(rec, k) == r[k], (r["id"], k)
        assert rec.created_at == r["created_at"].replace(tzinfo=timezone.utc) and len(rec.uid) == 32
    m = st.metrics(list(got))
    assert m["id"].tolist() == [x["id"] for x in metrics]
    assert [(x.run_id, x.step, x.name, x.wall_time) for x in m.itertuples()] == [
        (x["run_id"], x["step"], x["name"], x["wall_time"]) for x in metrics]
    np.testing.assert_array_equal(m["value"].to_numpy(), [x["value"] for x in metrics])  # NaN where NaN
    assert _new_run(st, "after") == 7
    st.close()


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


def test_polling_is_fast_with_50_runs_and_100k_metrics(sqlite_store):
    store = sqlite_store
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


# ----------------------------------------------------------------------------- revision 0002 fields


def test_run_ids_are_never_reused_after_delete(store):
    ids = [_new_run(store, f"r{i}") for i in range(3)]
    assert ids == [1, 2, 3]
    store.delete_run(3)
    assert _new_run(store, "new") == 4


def test_uid_sweep_tags_checkpoint_fields(store):
    a = _new_run(store, "a", sweep_id="sweep-1", tags=["paper", "table3", "paper"])
    b = _new_run(store, "b")
    ra, rb = store.get_run(a), store.get_run(b)
    assert len(ra.uid) == 32 and int(ra.uid, 16) >= 0 and ra.uid != rb.uid
    assert (ra.sweep_id, ra.tags, ra.checkpoint_step, ra.worker_id) == ("sweep-1", ["paper", "table3"], None, None)
    assert (rb.sweep_id, rb.tags) == (None, [])
    store.set_tags(a, [" x ", "y"])
    store.set_checkpoint_step(a, 200)
    ra2 = store.get_run(a)
    assert (ra2.tags, ra2.checkpoint_step, ra2.uid) == (["x", "y"], 200, ra.uid)
    with pytest.raises(ValueError, match="tag cannot be empty"):
        store.set_tags(a, ["ok", " "])
    assert store.get_run(a).tags == ["x", "y"]
    with pytest.raises(RunNotFoundError):
        store.set_tags(999, ["x"])
    with pytest.raises(RunNotFoundError):
        store.set_checkpoint_step(999, 1)
    frame = store.runs_frame().set_index("id")
    assert frame.loc[a, "uid"] == ra.uid and frame.loc[a, "sweep_id"] == "sweep-1"
    assert frame.loc[a, "tags"] == ["x", "y"] and frame.loc[a, "checkpoint_step"] == 200
    assert pd.isna(frame.loc[b, "checkpoint_step"]) and frame.loc[b, "tags"] == []
    # a deleted run's uid is never handed out again, even where its id could be
    store.delete_run(b)
    assert store.get_run(_new_run(store, "c")).uid not in {ra.uid, rb.uid}


# ----------------------------------------------------------------------------- claiming


def _claim_all(url, owner, out):
    st = RunStore(url)
    got = []
    try:
        while (rid := st.claim_next(owner, worker_id=owner)) is not None:
            got.append(rid)
    finally:
        st.close()
    out.put((owner, got))


def _check_claims(store, queued, claims):
    everything = [rid for _, got in claims for rid in got]
    assert sorted(everything) == sorted(queued)  # every run claimed, exactly once
    for owner, got in claims:
        for rid in got:
            rec = store.get_run(rid)
            assert (rec.status, rec.owner, rec.worker_id) == ("running", owner, owner)
            assert rec.started_at is not None and rec.heartbeat_at is not None


def test_claim_next_takes_the_oldest_queued_and_skips_cancelled(store):
    a, b, c = _new_run(store, "a"), _new_run(store, "b"), _new_run(store, "c")
    store.request_cancel(a)
    assert store.claim_next("host:1", "w1") == b
    assert store.claim_next("host:2") == c
    assert store.claim_next("host:3") is None
    assert store.get_run(c).worker_id is None and store.get_run(b).worker_id == "w1"


def test_claim_next_race_between_threads_claims_each_run_once(db_url):
    setup = RunStore(db_url)
    queued = [_new_run(setup, f"q{i}") for i in range(12)]
    import queue as queue_mod

    out = queue_mod.Queue()
    threads = [threading.Thread(target=_claim_all, args=(db_url, f"thread-{i}", out)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    claims = [out.get_nowait() for _ in threads]
    _check_claims(setup, queued, claims)
    setup.close()


def test_claim_next_race_between_processes_on_postgresql(pg_url):
    setup = RunStore(pg_url)
    queued = [_new_run(setup, f"q{i}") for i in range(12)]
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_claim_all, args=(pg_url, f"proc-{i}", out)) for i in range(3)]
    for p in procs:
        p.start()
    claims = [out.get(timeout=180) for _ in procs]
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    _check_claims(setup, queued, claims)
    setup.close()


def test_requeue_moves_ended_runs_back_to_queued(store):
    fin, fail, canc, intr, run, que = (_new_run(store, n) for n in ("fin", "fail", "canc", "intr", "run", "que"))
    for rid in (fin, fail, canc, intr, run):
        assert store.claim(rid, "host:1", "w1")
    store.heartbeat(intr, 40)
    store.set_checkpoint_step(intr, 30)
    store.add_metrics(intr, [(s, float(s), "train_loss", 1.0) for s in range(0, 41, 10)])
    store.set_status(fin, "finished")
    store.set_status(fail, "failed", error="boom")
    store.request_cancel(canc)
    store.set_status(canc, "cancelled")
    store.set_status(intr, "interrupted", error="interrupted: worker gone")
    assert store.requeue([fin, fail, canc, intr, run, que]) == sorted([fail, canc, intr])
    for rid in (fail, canc, intr):
        rec = store.get_run(rid)
        assert (rec.status, rec.error, rec.finished_at, rec.cancel_requested, rec.owner, rec.worker_id) == (
            "queued", None, None, False, None, None)
    assert {r.id: r.status for r in store.list_runs()}[fin] == "finished"
    assert store.get_run(run).status == "running" and store.get_run(que).status == "queued"
    rec = store.get_run(intr)
    assert (rec.steps_done, rec.checkpoint_step, len(store.metrics([intr]))) == (40, 30, 5)
    assert store.claim_next("host:2") == fail  # claimable again, oldest first
    with pytest.raises(RunNotFoundError):
        store.requeue([canc, 999])
    assert store.get_run(canc).status == "queued"


# ----------------------------------------------------------------------------- workers


def test_worker_registry(store):
    run = _new_run(store, "r")
    store.register_worker("hostA:11:abcd", "hostA", 11, "gpu: H100", concurrent=2)
    store.register_worker("hostB:12:ef01", "hostB", 12, "cpu", concurrent=1)
    t0 = {w.id: w.heartbeat_at for w in store.list_workers()}
    store.worker_heartbeat("hostA:11:abcd", run)
    workers = {w.id: w for w in store.list_workers()}
    a = workers["hostA:11:abcd"]
    assert (a.host, a.pid, a.device, a.concurrent, a.status, a.current_run_id) == ("hostA", 11, "gpu: H100", 2, "active", run)
    assert a.heartbeat_at >= t0["hostA:11:abcd"] and a.started_at.utcoffset() == timedelta(0)
    store.end_worker("hostB:12:ef01")
    frame = store.workers_frame().set_index("id")
    assert frame.loc["hostB:12:ef01", "status"] == "stopped" and pd.isna(frame.loc["hostB:12:ef01", "current_run_id"])
    assert frame.loc["hostA:11:abcd", "current_run_id"] == run and str(frame["heartbeat_at"].dt.tz) == "UTC"
    # deleting the run a worker trains clears the worker's link, not the worker
    store.set_status(run, "cancelled")
    store.delete_run(run)
    assert {w.id: w.current_run_id for w in store.list_workers()}["hostA:11:abcd"] is None
    with pytest.raises(StorageError, match="register it first"):
        store.worker_heartbeat("nobody:1:x")
    with pytest.raises(ValueError, match="1 to 64"):
        store.register_worker("x" * 65, "h", 1)
    store.register_worker("hostB:12:ef01", "hostB", 12, "cpu")  # re-registering revives it
    assert {w.id: w.status for w in store.list_workers()}["hostB:12:ef01"] == "active"


# ----------------------------------------------------------------------------- metrics feed


def test_feed_sees_writers_that_commit_out_of_order_exactly_once(db_url):
    """Writer A takes its ids first but commits last; the feed polls in between."""
    store = RunStore(db_url)
    a, b = _new_run(store, "a"), _new_run(store, "b")
    feed = MetricsFeed()
    rows_a = [{"run_id": a, "step": s, "wall_time": float(s), "name": "train_loss", "value": 10.0 + s} for s in range(3)]
    rows_b = [(s, float(s), "train_loss", 20.0 + s) for s in range(3)]
    b_done = threading.Event()
    writer_b = RunStore(db_url)

    def write_b():
        writer_b.add_metrics(b, rows_b)
        b_done.set()

    with write_engine(store.engine).begin() as con:  # writer A, holding its transaction open
        con.execute(select(Run.id).where(Run.id == a).with_for_update())
        con.execute(insert(Metric.__table__), rows_a)
        t = threading.Thread(target=write_b)
        t.start()
        committed_b = b_done.wait(5)  # PostgreSQL: B commits now; SQLite: B waits for A's write lock
        assert committed_b == (store.engine.dialect.name == "postgresql")
        first = feed.poll(store, [a, b])
        assert first["run_id"].tolist() == ([b] * 3 if committed_b else [])
    t.join(60)
    assert b_done.is_set()
    second = feed.poll(store, [a, b])
    seen = pd.concat([first, second], ignore_index=True)
    everything = store.metrics([a, b])
    assert len(everything) == 6 and sorted(seen["id"]) == sorted(everything["id"])  # all of them, once
    assert feed.frame["id"].tolist() == everything["id"].tolist()
    assert feed.poll(store, [a, b]).empty
    if committed_b:
        # A's ids are below B's: one global "largest id seen" would have skipped A for good
        ids_a, ids_b = everything[everything.run_id == a]["id"], everything[everything.run_id == b]["id"]
        assert ids_a.max() < ids_b.min()
        assert store.metrics([a, b], after_id=int(first["id"].max()))["run_id"].tolist() == []
    writer_b.close()
    store.close()


def test_feed_under_concurrent_writers_misses_nothing(db_url):
    setup = RunStore(db_url)
    run_ids = [_new_run(setup, f"w{i}") for i in range(3)]
    n_rows, batch = 300, 10
    errors: list[BaseException] = []
    done = threading.Event()
    seen: list[pd.DataFrame] = []

    def writer(w, run_id):
        st = RunStore(db_url)
        try:
            for start in range(0, n_rows, batch):
                st.add_metrics(run_id, [(i, 0.5 * i, "train_loss", w * 1e6 + i) for i in range(start, start + batch)])
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)
        finally:
            st.close()

    def reader():
        st = RunStore(db_url)
        feed = MetricsFeed()
        try:
            while True:
                finished = done.is_set()
                seen.append(feed.poll(st, run_ids))
                if finished:
                    return
                time.sleep(0.002)
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
        t.join(120)
    done.set()
    rt.join(120)
    assert not errors, errors
    got = pd.concat(seen, ignore_index=True)
    assert got["id"].is_unique and len(got) == 3 * n_rows
    for w, rid in enumerate(run_ids):
        mine = got[got.run_id == rid].sort_values("id")
        assert mine["step"].tolist() == list(range(n_rows))
        assert mine["value"].tolist() == [w * 1e6 + i for i in range(n_rows)]
    setup.close()


def test_feed_rereads_a_run_whose_history_was_replaced(store):
    a, b = _new_run(store, "a"), _new_run(store, "b")
    store.add_metrics(a, [(s, float(s), "train_loss", 1.0 + s) for s in range(10)])
    store.add_metrics(b, [(0, 0.0, "train_loss", 5.0)])
    feed = MetricsFeed()
    assert len(feed.poll(store, [a, b])) == 11 and feed.replaced == frozenset()

    assert store.delete_metrics_after(a, 4) == 5  # resume from the checkpoint at step 4
    assert store.get_run(a).history_version == 1 and store.get_run(b).history_version == 0
    store.add_metrics(a, [(s, float(s), "train_loss", 100.0 + s) for s in range(5, 8)])
    store.add_metrics(b, [(1, 1.0, "train_loss", 6.0)])
    new = feed.poll(store, [a, b])
    assert feed.replaced == frozenset({a})
    assert sorted(new[new.run_id == a]["step"]) == list(range(8))  # the whole new history of a
    assert new[new.run_id == b]["step"].tolist() == [1]  # b stays incremental
    mine = feed.frame[feed.frame.run_id == a].sort_values("step")
    assert mine["step"].tolist() == list(range(8))  # no stale step 5..9, no duplicates
    assert mine["value"].tolist() == [1.0 + s for s in range(5)] + [100.0 + s for s in range(5, 8)]
    assert len(feed.frame) == 10 and feed.frame["id"].is_unique
    assert feed.poll(store, [a, b]).empty and feed.replaced == frozenset()
    # runs no longer asked for, or deleted, are forgotten
    store.delete_run(b)
    feed.poll(store, [a, b])
    assert set(feed.frame["run_id"]) == {a} and set(feed.marks()) == {a}
    with pytest.raises(RunNotFoundError):
        store.delete_metrics_after(999, 0)


# ----------------------------------------------------------------------------- liveness primitives


def test_liveness_primitives_and_policy(store):
    now = datetime.now(timezone.utc)
    a, b, q = _new_run(store, "a"), _new_run(store, "b"), _new_run(store, "q")
    store.claim(a, "far.example:1")
    store.claim(b, "far.example:2")
    rows = store.active_runs_heartbeats()
    assert [(r, o) for r, o, _ in rows] == [(a, "far.example:1"), (b, "far.example:2")]
    assert all(abs((last - now).total_seconds()) < 60 for _, _, last in rows)
    rows = [(a, "far.example:1", now - timedelta(seconds=200)), (b, "far.example:2", now - timedelta(seconds=10)),
            (q, None, None), (77, f"{socket.gethostname()}:{_dead_pid()}", now), (78, current_owner(), now)]
    stale = stale_runs(rows, now, 120, socket.gethostname())
    assert sorted(stale) == [a, q, 77] and "no longer running" in stale[77] and "no heartbeat" in stale[a]
    assert store.mark_interrupted({a: "interrupted: test", q: "interrupted: not running"}) == [a]
    assert store.get_run(a).status == "interrupted" and store.get_run(a).error == "interrupted: test"
    assert store.get_run(q).status == "queued"  # only running rows change
    assert store.mark_interrupted({a: "again"}) == [] and store.get_run(a).error == "interrupted: test"


# ----------------------------------------------------------------------------- read-only opens, busy


def test_read_only_open_of_a_missing_database_creates_nothing(tmp_path):
    target = tmp_path / "no" / "such" / "lab.db"
    for opener in (lambda: make_engine(f"sqlite:///{target}", create=False), lambda: RunStore(str(target), create=False)):
        with pytest.raises(StorageError) as info:
            opener()
        assert str(info.value) == f"no database at {target}; check the path or set {ENV_URL} (or --db)"
    assert list(tmp_path.iterdir()) == []
    RunStore(_url(tmp_path, "there.db")).close()
    RunStore(_url(tmp_path, "there.db"), create=False).close()  # an existing one opens fine


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
    rid = _new_run(a_store, "a")
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
            st.heartbeat(rid, 5)
        assert isinstance(info.value, StorageError) and "\n" not in str(info.value)
    st.heartbeat(rid, 5)  # the retry succeeds once the lock is gone
    assert st.get_run(rid).steps_done == 5
    st.close()
    holder.close()


# ----------------------------------------------------------------------------- diagnostics


def test_diagnostics_store_and_cascade(store):
    run = _new_run(store, "r")
    other = _new_run(store, "o")
    d1 = store.create_diagnostic(run, 200, {"keys": 64, "ranks": (4, 8)})
    d2 = store.create_diagnostic(other, None)
    frame = store.diagnostics_frame(run)
    assert frame["id"].tolist() == [d1]
    row = frame.iloc[0]
    assert (row["status"], row["step"], row["settings"], len(row["uid"])) == ("queued", 200, {"keys": 64, "ranks": [4, 8]}, 32)
    assert store.claim_diagnostic(d1, "host:1") and not store.claim_diagnostic(d1, "host:2")
    results = [
        {"layer": "h0.mlp", "estimator": "ep", "rank": 4, "lam": 0.5, "bias2": 1e-3, "bias2_se": 2e-4,
         "variance": 0.1, "mse": 0.101, "cos_mean": 0.9, "keys": 64, "batches": 8},
        {"layer": "h0.attn", "estimator": "bp", "rank": 8, "bias2": float("nan")},
    ]
    store.add_diagnostic_results(d1, results)
    back = store.diagnostic_results(d1)
    assert back.iloc[0].to_dict() == results[0]
    assert back.loc[1, "layer"] == "h0.attn" and pd.isna(back.loc[1, "lam"]) and pd.isna(back.loc[1, "mse"])
    store.set_diagnostic_status(d1, "finished")
    store.set_diagnostic_status(d2, "failed", error="no checkpoint")
    done = store.diagnostics_frame().set_index("id")
    assert done.loc[d1, "status"] == "finished" and done.loc[d1, "finished_at"] is not pd.NaT
    assert done.loc[d2, "error"] == "no checkpoint"
    with pytest.raises(ValueError, match="unknown diagnostic result fields"):
        store.add_diagnostic_results(d1, [{"lyer": "typo"}])
    with pytest.raises(ValueError, match="unknown run status"):
        store.set_diagnostic_status(d1, "done")
    with pytest.raises(RunNotFoundError):
        store.create_diagnostic(999, 1)
    with pytest.raises(StorageError, match="no diagnostic 999"):
        store.add_diagnostic_results(999, results)
    store.delete_run(run)  # the run's diagnostics and their results go with it
    assert store.diagnostics_frame()["id"].tolist() == [d2]
    assert store.diagnostic_results(d1).empty


# ----------------------------------------------------------------------------- revision 0005: views, diagnosis cancel


def test_saved_views_round_trip_replace_and_delete(store):
    store.save_view("R sweep, pooled", {"runs": "1,2,5", "pool": 1})
    store.save_view("tags", {"tag": "pilot"})
    assert store.saved_views() == {"tags": {"tag": "pilot"}, "R sweep, pooled": {"runs": "1,2,5", "pool": "1"}}
    store.save_view("R sweep, pooled", {"runs": "1,2"})  # the same name replaces, and is now the newest
    assert list(store.saved_views()) == ["R sweep, pooled", "tags"]
    assert store.saved_views()["R sweep, pooled"] == {"runs": "1,2"}
    with pytest.raises(ValueError, match="view name"):
        store.save_view("  ", {"runs": "1"})
    store.delete_view("tags")
    with pytest.raises(StorageError, match="no saved view"):
        store.delete_view("tags")
    assert list(store.saved_views()) == ["R sweep, pooled"]


def test_a_diagnosis_is_cancelled_queued_or_flagged_running_and_deleted_with_its_rows(store):
    run_id = _new_run(store, "diagnosed")
    queued = store.create_diagnostic(run_id, 0, {"keys": 4})
    assert store.request_cancel_diagnostic(queued)
    row = store.diagnostics_frame().set_index("id").loc[queued]
    assert row["status"] == "cancelled" and "before it started" in row["error"]
    running = store.create_diagnostic(run_id, 0, {"keys": 4})
    assert store.claim_diagnostic(running, "here:1") and not store.diagnostic_cancel_requested(running)
    assert store.request_cancel_diagnostic(running) and store.diagnostic_cancel_requested(running)
    assert store.diagnostics_frame().set_index("id").loc[running, "status"] == "running"  # its process ends it
    store.add_diagnostic_results(running, [{"layer": "all", "estimator": "basis", "rank": 1, "lam": 0.0, "mse": 1.0}])
    with pytest.raises(StorageError, match="cancel it first"):
        store.delete_diagnostic(running)
    store.set_diagnostic_status(running, "cancelled")
    assert not store.request_cancel_diagnostic(running)  # already ended
    store.delete_diagnostic(running)
    assert running not in set(store.diagnostics_frame()["id"]) and store.diagnostic_results(running).empty
    with pytest.raises(StorageError, match="no diagnostic"):
        store.delete_diagnostic(running)
