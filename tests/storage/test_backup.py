"""``python -m engine backup OUT``: a consistent copy while runs keep writing (SQLite's
backup API, WAL included), ``pg_dump`` for PostgreSQL, and one-line refusals."""

import sqlite3
import subprocess
import threading

import pytest

from engine.cli.main import main
from storage import RunStore
from storage import backup as backup_mod
from tests.support.postgres import _pg_bin


def _fill(store, n, metrics=50):
    ids = []
    for i in range(n):
        run_id = store.runs.create_run(name=f"r{i}", config={}, estimator="basis", rank=4, lam=0.0, seed=i, preset="tiny",
                                  steps=metrics)
        store.metrics.add_metrics(run_id, [(s, float(s), "train_loss", 1.0 / (s + 1)) for s in range(metrics)])
        ids.append(run_id)
    return ids


def test_a_backup_of_a_wal_database_with_a_live_writer_opens_and_holds_every_run(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'lab.db'}"
    store = RunStore(url)
    before = _fill(store, 30)
    assert sqlite3.connect(tmp_path / "lab.db").execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    stop, written, errors = threading.Event(), [], []

    def writer():  # another connection that keeps committing while the backup reads
        live = RunStore(url)
        try:
            while not stop.is_set():
                written.extend(_fill(live, 1, metrics=20))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)
        finally:
            live.close()

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        while len(written) < 3:
            stop.wait(0.05)
        out = tmp_path / "copy.db"
        assert main(["backup", "--db", url, str(out)]) == 0
        during = len(written)
    finally:
        stop.set()
        thread.join(60)
    assert not errors and len(written) > during  # the writer was never blocked for long
    said = capsys.readouterr().out
    assert f"to {out}" in said and "run(s)" in said
    assert not (tmp_path / "copy.db-wal").exists()
    assert sqlite3.connect(out).execute("PRAGMA journal_mode").fetchone()[0] == "delete"  # one self-contained file
    copy = RunStore(f"sqlite:///{out}", create=False)
    runs = {r.id: r for r in copy.runs.list_runs()}
    assert set(before) <= set(runs) <= set(before) | set(written)  # every run, and none that never existed
    every = copy.metrics(list(runs))
    counts = every.groupby("run_id").size().to_dict()
    assert all(counts[i] == 50 for i in before)
    assert all(counts.get(i, 0) in (0, 20) for i in runs if i not in before)  # each transaction whole or not at all
    copy.close()
    store.close()


def test_backup_refusals_are_one_line_and_write_nothing(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'lab.db'}"
    RunStore(url).close()
    (tmp_path / "taken.db").write_text("keep me")
    cases = [
        ([str(tmp_path / "taken.db")], "already exists; pass --force"),
        ([str(tmp_path / "lab.db"), "--force"], "is the database itself"),
        ([str(tmp_path / "no" / "such" / "dir.db")], "its directory does not exist"),
        ([str(tmp_path / "missing.db"), "--db", str(tmp_path / "typo.db")], "no database at"),
    ]
    for argv, message in cases:
        assert main(["backup", "--db", url, *argv]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err
    assert (tmp_path / "taken.db").read_text() == "keep me"
    # SQLite removes lab.db's -wal and -shm when its last connection closes, which may or may not
    # have happened yet: those two are the database's own; nothing else may appear.
    names = {p.name for p in tmp_path.iterdir()} - {"lab.db-shm", "lab.db-wal"}
    assert names == {"lab.db", "taken.db"}


@pytest.mark.postgres
def test_postgresql_is_backed_up_with_pg_dump_and_restores(pg_url, pg_cluster, tmp_path, monkeypatch, capsys):
    pg_restore = _pg_bin("pg_restore")  # on the PATH, else beside the server under /usr/lib/postgresql
    if backup_mod.pg_dump_path() is None or pg_restore is None:
        pytest.skip("pg_dump/pg_restore not installed")
    store = RunStore(pg_url)
    ids = _fill(store, 5)
    out = tmp_path / "lab.dump"
    assert main(["backup", "--db", pg_url, str(out)]) == 0
    assert out.read_bytes()[:5] == b"PGDMP" and "pg_dump archive" in capsys.readouterr().out
    name, restored_url = pg_cluster.new_database()
    target = restored_url.replace("postgresql+psycopg://", "postgresql://")
    subprocess.run([pg_restore, "--no-owner", f"--dbname={target}", str(out)], check=True, capture_output=True)
    restored = RunStore(restored_url)
    assert [r.id for r in restored.runs.list_runs()] == ids and len(restored.metrics(ids)) == 5 * 50
    assert restored.identities.identity().ancestors == (store.identities.identity().uid,)  # a database of its own, copied from this one
    restored.close()
    pg_cluster.drop_database(name)

    monkeypatch.setattr(backup_mod, "pg_dump_path", lambda: None)
    assert main(["backup", "--db", pg_url, str(tmp_path / "again.dump")]) == 2
    err = capsys.readouterr().err
    assert "pg_dump is not installed" in err and "apt install postgresql-client" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "again.dump").exists()
    store.close()


def test_the_dashboard_download_is_the_same_consistent_copy(tmp_path):
    store = RunStore(f"sqlite:///{tmp_path / 'lab.db'}")
    ids = _fill(store, 3)
    data, name = backup_mod.backup_bytes(store)
    assert name == "basis-lab-backup.db" and data.startswith(b"SQLite format 3\x00")
    (tmp_path / "downloaded.db").write_bytes(data)
    copy = RunStore(f"sqlite:///{tmp_path / 'downloaded.db'}", create=False)
    assert [r.id for r in copy.runs.list_runs()] == ids and len(copy.metrics(ids)) == 3 * 50
    assert copy.identities.identity().lineage == (store.identities.identity().uid, copy.identities.identity().uid)  # its own identity
    copy.close()
    store.close()
