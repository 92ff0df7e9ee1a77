"""The schema under Alembic (``storage/migrations``): revisions recorded, the migrations
build exactly the models, older databases upgraded in place, a failed migration changes
nothing, foreign or newer schemas are refused.

Tests that take the ``empty_db_url`` fixture (a database with no schema yet) run on SQLite and on a throwaway
PostgreSQL (tests/conftest.py; skipped with the reason where no server can be started);
the rest are about SQLite files. Every database lives in tmp_path or that cluster."""

from __future__ import annotations

import json
import math
import os
import shutil
import sqlite3
import subprocess
import sys
from datetime import datetime, timezone

import numpy as np
import pytest
from sqlalchemy import exc as sa_exc
from sqlalchemy import inspect, text

import storage
from storage import ENV_URL, RunStore, StorageError, head_revision, make_engine, schema_revision
from storage import db as storage_db
from tests.support.runs import new_run
from tests.support.sqlite import sqlite_url

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")


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
    url = sqlite_url(tmp_path)
    st = RunStore(url)
    new_run(st, "keep")
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


def _nullable(engine):
    """{(table, column): may it be NULL} of the models' tables as the database declares them."""
    insp = inspect(engine)
    return {(t, c["name"]): c["nullable"] for t in storage.Base.metadata.tables for c in insp.get_columns(t)}


DECLARED_NULLABLE = {(t.name, c.name): c.nullable for t in storage.Base.metadata.tables.values() for c in t.columns}


def _schema(engine):
    """{table: (column names, index names)} of every table but Alembic's own."""
    insp = inspect(engine)
    return {
        t: ({c["name"] for c in insp.get_columns(t)}, {ix["name"] for ix in insp.get_indexes(t)})
        for t in insp.get_table_names() if t != "alembic_version"
    }


def test_schema_revision_recorded_and_runs_survive_reopen(tmp_path):
    url = sqlite_url(tmp_path)
    s1 = RunStore(url)
    rid = new_run(s1, "keep")
    s1.metrics.add_metrics(rid, [(0, 0.0, "train_loss", 1.5)])
    s1.close()
    eng = make_engine(url)
    assert schema_revision(eng) == head_revision() == "0014"
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
    assert [r.name for r in s2.runs.list_runs()] == ["keep"]
    assert s2.metrics([rid])["value"].tolist() == [1.5]
    s2.close()


def test_migrations_build_exactly_the_models(empty_db_url):
    """Alembic's autogenerate finds no table, column or index that models.py and the
    revisions disagree on (a schema change without its revision fails here)."""
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    eng = make_engine(empty_db_url)
    with eng.connect() as con:
        diffs = compare_metadata(MigrationContext.configure(con), storage.Base.metadata)
    structural = [d for d in diffs if isinstance(d, tuple) and d[0] in
                  ("add_table", "remove_table", "add_column", "remove_column", "add_index", "remove_index",
                   "add_fk", "remove_fk")]
    assert structural == []
    assert set(inspect(eng).get_table_names()) == {"alembic_version", "runs", "metrics", "workers", "diagnostics",
                                                   "diagnostic_results", "reports",
                                                   "saved_views", "database_identity", "database_lineage", "run_logs", "campaigns",
                                                   "eval_losses"}
    # and on which columns may be NULL, every column of every table (revision 0011 set the NOT NULLs 0001-0005 left out)
    assert [d[0][2:4] for d in diffs if isinstance(d, list) and d[0][0] == "modify_nullable"] == []
    assert _nullable(eng) == DECLARED_NULLABLE
    assert sum(not n for n in DECLARED_NULLABLE.values()) > 24 and DECLARED_NULLABLE[("metrics", "step")] is False
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
    after, config = _raw_rows(path, "runs", run_cols), run_cols.index("config")
    assert [r[:config] + r[config + 1:] for r in after] == [r[:config] + r[config + 1:] for r in runs_before]  # every
    # old column of every run, byte for byte, but the config, where revision 0012 says the run had no test split
    assert [json.loads(r[config]) for r in after] == [{**json.loads(r[config]), "test_tokens": 0} for r in runs_before]
    assert _raw_rows(path, "metrics", metric_cols) == metrics_before
    assert "schema_version" not in inspect(st.engine).get_table_names()
    assert _nullable(st.engine) == DECLARED_NULLABLE

    runs = {r.id: r for r in st.runs.list_runs()}
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
    assert st.frames.runs_frame().set_index("id").loc[1, "last_train_loss"] == pytest.approx(1.6)
    # the rebuilt runs table now never reuses an id, and its children still point at it
    new = new_run(st, "after-upgrade")
    assert new == 7
    st.runs.delete_run(new)
    assert new_run(st, "again") == 8
    st.runs.delete_run(1)
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
    fresh = make_engine(sqlite_url(tmp_path, "fresh.db"))
    assert _schema(eng) == _schema(fresh)  # adopting and creating give the same schema
    assert _nullable(eng) == _nullable(fresh) == DECLARED_NULLABLE

    st = RunStore(engine=eng)
    runs = {r.id: r for r in st.runs.list_runs()}
    assert sorted(runs) == [1, 7]
    assert (runs[1].name, runs[1].status, runs[1].config, runs[1].lam) == ("old-a", "finished",
                                                                           {"lr": 0.1, "test_tokens": 0}, 0.5)
    assert runs[1].created_at == datetime(2024, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    assert (runs[7].name, runs[7].status, runs[7].config, runs[7].cancel_requested) == (
        "run-7", "finished", {"test_tokens": 0}, False)  # revision 0012: a run before the test split had none
    st.metrics.add_metrics(1, [(0, 0.0, "train_loss", 2.0)])
    assert st.frames.runs_frame().set_index("id").loc[1, "last_train_loss"] == 2.0
    new = new_run(st, "new")
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
    url = sqlite_url(tmp_path)
    st = RunStore(url)
    rid = new_run(st, "precious")
    st.metrics.add_metrics(rid, [(0, 0.0, "train_loss", 1.0)])
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
    assert [r.name for r in st.runs.list_runs()] == ["precious"] and rid == 1
    assert st.metrics([rid])["value"].tolist() == [1.0]
    eng.dispose()


def test_migration_chain_runs_in_order_once(tmp_path, monkeypatch):
    url = sqlite_url(tmp_path)
    RunStore(url).close()
    _migrations_copy(tmp_path, monkeypatch, "    op.add_column('runs', sa.Column('colour', sa.Text))")
    eng = make_engine(url)
    assert schema_revision(eng) == "9001" and "colour" in _schema(eng)["runs"][0]
    eng.dispose()
    make_engine(url).dispose()  # already current: nothing runs again
    monkeypatch.undo()
    with pytest.raises(StorageError, match="'9001', newer than this BASIS Lab"):
        make_engine(url)  # the older code refuses the newer database


def test_two_processes_opening_a_new_database_at_once_upgrade_it_once(empty_db_url):
    code = ("import sys; sys.path.insert(0, sys.argv[2]); from storage import RunStore; "
            "s = RunStore(sys.argv[1]); print(len(s.runs.list_runs())); s.close()")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    procs = [subprocess.Popen([sys.executable, "-c", code, empty_db_url, root], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for _ in range(3)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [o[1].decode()[-500:] for o in outs]
    eng = make_engine(empty_db_url)
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

    st = _migrated(pg_url)
    assert schema_revision(st.engine) == head_revision()
    assert "schema_version" not in inspect(st.engine).get_table_names()
    assert _nullable(st.engine) == DECLARED_NULLABLE
    got = {r.id: r for r in st.runs.list_runs()}
    assert sorted(got) == [r["id"] for r in runs]
    for r in runs:
        rec = got[r["id"]]
        for k in ("name", "status", "config", "versions", "error", "notes", "owner", "cancel_requested", "steps_done",
                  "estimator", "rank", "lam", "seed"):
            assert getattr(rec, k) == ({**r[k], "test_tokens": 0} if k == "config" else r[k]), (r["id"], k)
        assert rec.created_at == r["created_at"].replace(tzinfo=timezone.utc) and len(rec.uid) == 32
    m = st.metrics(list(got))
    assert m["id"].tolist() == [x["id"] for x in metrics]
    assert [(x.run_id, x.step, x.name, x.wall_time) for x in m.itertuples()] == [
        (x["run_id"], x["step"], x["name"], x["wall_time"]) for x in metrics]
    np.testing.assert_array_equal(m["value"].to_numpy(), [x["value"] for x in metrics])  # NaN where NaN
    assert new_run(st, "after") == 7
    st.close()


def _migrated(url):
    """A store on ``url``, a database at an older revision, migrated as its backend is: a
    SQLite file by opening it, PostgreSQL (which refuses an older schema on open) by
    ``engine db upgrade`` (:func:`storage.upgrade.upgrade`, no backup) first."""
    from storage.upgrade import upgrade

    if url.startswith("postgresql"):
        upgrade(url, keep_backup=False)
    return RunStore(url)


def _at_revision(url, revision):
    """A new database at an older ``revision`` (as that BASIS Lab left it)."""
    import sqlalchemy as sa
    from alembic import command

    eng = sa.create_engine(url)
    with eng.begin() as con:
        command.upgrade(storage_db._alembic_config(con), revision)
    return eng


def test_0006_keeps_one_row_per_metric_and_step_then_refuses_a_second(empty_db_url):
    """A 0005 database where a resume doubled step 0 (run 1) upgrades to one row per
    (run, name, step), the newest kept, run 1's readers told to re-read; run 2 untouched;
    the database gets an identity; from then on a second row of a key is not stored."""
    eng = _at_revision(empty_db_url, "0005")
    runs = "INSERT INTO runs (uid, name, status, config, tags, notes, versions, steps_done, history_version, epoch, " \
           "cancel_requested) VALUES (:uid, :name, 'finished', '{}', '[]', '', '{}', 0, 0, 1, false)"
    metric = "INSERT INTO metrics (run_id, step, wall_time, name, value) VALUES (:run, :step, 0.0, :name, :value)"
    with eng.begin() as con:
        for uid, name in (("a" * 32, "doubled"), ("b" * 32, "clean")):
            con.execute(text(runs), {"uid": uid, "name": name})
        rows = [(1, 0, "val_loss", 10.0), (1, 0, "mem_saved_bytes", 5.0), (1, 10, "val_loss", 9.0),
                (1, 0, "val_loss", 10.5), (1, 0, "mem_saved_bytes", 5.5), (2, 0, "val_loss", 7.0)]
        con.execute(text(metric), [dict(run=r, step=s, name=n, value=v) for r, s, n, v in rows])
    eng.dispose()

    st = _migrated(empty_db_url)
    assert schema_revision(st.engine) == head_revision()
    m = st.metrics([1, 2])
    assert sorted(zip(m["run_id"], m["step"], m["name"], m["value"])) == [
        (1, 0, "mem_saved_bytes", 5.5), (1, 0, "val_loss", 10.5), (1, 10, "val_loss", 9.0), (2, 0, "val_loss", 7.0)]
    assert (st.runs.get_run(1).history_version, st.runs.get_run(2).history_version) == (1, 0)
    assert {ix["name"]: ix["unique"] for ix in inspect(st.engine).get_indexes("metrics")}[
        "ix_metrics_run_id_name_step"]
    me = st.identities.identity()
    assert len(me.uid) == 32 and me.lineage == (me.uid,) and me.ancestors == ()
    st.metrics.add_metrics(2, [(0, 1.0, "val_loss", 99.0), (5, 1.0, "val_loss", 6.0)])  # a retried write: no error
    m = st.metrics([2])
    assert sorted(zip(m["step"], m["value"])) == [(0, 7.0), (5, 6.0)]
    with pytest.raises(sa_exc.IntegrityError):  # the database itself refuses a second row, whoever writes it
        with st.engine.begin() as con:
            con.execute(text(metric), dict(run=2, step=5, name="val_loss", value=1.0))
    st.close()


def test_every_database_has_its_own_identity_and_two_first_opens_agree(empty_db_url):
    """A database gets its identity at its upgrade; one without (a backup) makes one at its
    first use, the same for every store that asks, keeping the lineage it was copied with."""
    st = _migrated(empty_db_url)
    original = st.identities.identity()
    with st.engine.begin() as con:  # what a backup holds: the original's lineage, no identity
        con.execute(text("DELETE FROM database_identity"))
    a, b = RunStore(empty_db_url), RunStore(empty_db_url)
    first, second = a.identities.identity(), b.identities.identity()
    assert first == second and first.uid != original.uid
    assert first.lineage == (original.uid, first.uid) and first.ancestors == (original.uid,)
    assert RunStore(empty_db_url).identities.identity() == first
    for s in (st, a, b):
        s.close()


def test_0008_gives_old_interrupted_runs_their_cause_from_their_error_text(empty_db_url):
    """A 0007 database's interrupted runs get the interruption cause their error text (as the
    code before 0008 wrote it) meant; a text none of those begins, and every run not
    interrupted, get none; the error texts stay as they were."""
    eng = _at_revision(empty_db_url, "0007")
    old = [  # (status, error as the code before 0008 wrote it, the cause 0008 must give it)
        ("interrupted", "interrupted: worker vm:41 is no longer running", "stale"),
        ("interrupted", "interrupted: no heartbeat from gpu-3:7 since 2026-11-01 10:00:00+00:00", "stale"),
        ("interrupted", "interrupted by a signal; resume it to continue from its checkpoint", "signal"),
        ("interrupted", "interrupted before it started; resume it to train it", "signal"),
        ("interrupted", "disk full: free space on /data and run `python -m engine resume 5` (it continues from its "
                        "last checkpoint); [Errno 28] No space left on device", "disk_full"),
        ("interrupted", "the worker vm:9 stopped training it (RuntimeError: boom); resume it", "crash"),
        ("interrupted", "the disk is full", None),  # a text the old code did not write
        ("interrupted", None, None),
        ("failed", "interrupted: a failed run's text", None),
        ("finished", None, None),
    ]
    runs = "INSERT INTO runs (uid, name, status, error, config, tags, notes, versions, steps_done, history_version, " \
           "epoch, cancel_requested) VALUES (:uid, :name, :status, :error, '{}', '[]', '', '{}', 0, 0, 1, false)"
    with eng.begin() as con:
        con.execute(text(runs), [dict(uid=f"{i:032d}", name=f"r{i}", status=status, error=error)
                                 for i, (status, error, _) in enumerate(old)])
    eng.dispose()
    st = _migrated(empty_db_url)
    assert schema_revision(st.engine) == head_revision() == "0014"
    got = st.runs.list_runs()
    assert [(r.status, r.error, r.interruption_cause) for r in got] == old
    frame = st.frames.runs_frame()
    assert frame["interruption_cause"].tolist()[:6] == ["stale", "stale", "signal", "signal", "disk_full", "crash"]
    st.close()


def _broken_state(url, path=None):
    """What a refused open must leave as it was: the revision, every table's columns and
    indexes, and (SQLite) the database file's bytes."""
    import sqlalchemy as sa

    raw = sa.create_engine(url)
    with raw.connect() as con:
        state = (con.execute(text("SELECT version_num FROM alembic_version")).scalar(), _schema(con))
    raw.dispose()
    return state, (path.read_bytes() if path else None)


def test_a_database_at_head_lacking_a_column_is_refused_in_one_line_untouched(empty_db_url, tmp_path, capsys):
    """``alembic_version`` alone is not trusted (a copy from a side branch stamped with a
    revision it never ran): opening checks the models' tables and columns, and one missing is
    a one-line error naming it and the fix, with nothing written, for the store and the CLI."""
    from engine.cli.main import main

    eng = _at_revision(empty_db_url, "head")
    with eng.begin() as con:
        con.execute(text("ALTER TABLE runs DROP COLUMN epoch"))
        con.execute(text("DROP TABLE eval_losses"))
    eng.dispose()
    path = None
    if empty_db_url.startswith("sqlite"):
        path = tmp_path / "lab.db"
        with sqlite3.connect(path) as con:
            con.execute("PRAGMA journal_mode = WAL")  # as BASIS Lab leaves it: opening changes no byte
        con.close()
    before = _broken_state(empty_db_url, path)
    with pytest.raises(StorageError) as info:
        RunStore(empty_db_url)
    message = str(info.value)
    assert "\n" not in message and "is marked schema revision 0014 but lacks table eval_losses, runs.epoch" in message
    assert "nothing was written: restore a backup of it, or add the missing columns" in message
    assert main(["list", "--db", empty_db_url]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: database ") and err.count("\n") == 1 and "runs.epoch" in err
    assert _broken_state(empty_db_url, path) == before


def test_an_older_database_lacking_a_column_is_refused_after_its_upgrade_rolled_back(tmp_path):
    """A database stamped 0009 without a column of that revision: the upgrade runs, the check
    against the models fails, and every revision is rolled back."""
    url = sqlite_url(tmp_path)
    eng = _at_revision(url, "0009")
    with eng.begin() as con:
        con.execute(text("ALTER TABLE runs DROP COLUMN epoch"))
    eng.dispose()
    with pytest.raises(StorageError, match=r"marked schema revision 0009 \(upgraded here to 0014\) but lacks "
                                           r"runs\.epoch \(.*nothing was written"):
        make_engine(url)
    state, _ = _broken_state(url)
    assert state[0] == "0009" and "eval_losses" not in state[1] and "epoch" not in state[1]["runs"][0]


def test_the_schema_check_is_done_once_per_database_and_process(tmp_path, monkeypatch):
    """Opening a database that matched again asks it nothing (the check runs on every open)."""
    from storage import schema_check

    url = sqlite_url(tmp_path)
    RunStore(url).close()
    calls = []
    monkeypatch.setattr(schema_check, "missing_columns", lambda *a: calls.append(a) or [])
    RunStore(url).close()
    make_engine(url).dispose()
    assert calls == []
    _at_revision(sqlite_url(tmp_path, "other.db"), "head").dispose()
    calls.clear()  # revision 0011 checks the columns it reads
    RunStore(sqlite_url(tmp_path, "other.db")).close()  # another database: checked
    assert len(calls) == 1
