"""The store's structure: one ``Database`` and repositories that each receive it; the store
itself answers no query (no by-name delegates)."""

from __future__ import annotations

from storage import Database, RunStore
from storage.database import Repository
from storage.metrics import MetricsRepository
from storage.queue import QueueRepository
from storage.runs import RunsRepository


def test_the_store_holds_the_database_and_its_repositories_and_no_query_of_its_own():
    """No by-name delegates: each repository is handed the store's one database, and no
    repository method is reachable on the store itself; callers name the repository."""
    store = RunStore("sqlite://")
    repositories = {name: repo for name, repo in vars(store).items() if isinstance(repo, Repository)}
    assert set(repositories) == {"runs", "queue", "metrics", "eval_losses", "workers", "diagnostics", "reports",
                                 "frames", "views", "identities", "logs", "campaigns", "leases"}
    assert all(repo.db is store.db for repo in repositories.values())
    methods = {m for repo in repositories.values() for m in dir(type(repo)) if not m.startswith("_")}
    assert len(methods) > 50 and {m for m in methods if hasattr(store, m)} <= set(repositories)
    rid = store.runs.create_run(name="by its repository", config={}, estimator="basis", rank=4, lam=0.0, seed=0,
                                preset="tiny", steps=10)
    assert store.runs.get_run(rid).name == "by its repository" and store.metrics.read.__self__ is store.metrics
    store.close()


def test_repositories_work_on_a_database_they_are_handed():
    db = Database("sqlite://")
    runs, queue, metrics = RunsRepository(db), QueueRepository(db), MetricsRepository(db)
    rid = runs.create_run(name="alone", config={}, estimator="basis", rank=4, lam=0.0, seed=0, preset="tiny",
                          steps=10, tags=[" a ", "b", "a"])
    assert runs.get_run(rid).tags == ["a", "b"]
    runs.set_tags(rid, ["c"])
    lease = queue.claim_next("h:1")
    assert lease == (rid, 1) and runs.get_run(rid).tags == ["c"]
    metrics.add_metrics(rid, [(0, 0.0, "val_loss", 2.5)], epoch=lease.epoch)
    assert metrics(rid)["value"].tolist() == [2.5] and db.dialect == "sqlite" and not db.is_postgresql
    db.close()


def test_a_store_its_process_never_closed_leaves_the_sqlite_file_whole(tmp_path):
    """A script that writes through a ``RunStore`` (or a ``Lab``) and exits without closing it,
    while a thread still holds it (a ``StoreWriter``, as a launch leaves one): the database is
    closed as the process exits, so SQLite has written its log back and the file copied
    alone holds the run. Before, the log was left beside a file holding none of the rows."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    script = ("import sys\n"
              "from storage import RunStore\n"
              "from engine.runner.writer import StoreWriter\n"
              "store = RunStore(sys.argv[1])\n"
              "writer = StoreWriter(store)\n"
              "writer.call(None, store.runs.create_run, name='left open', config={}, estimator='exact', rank=1,\n"
              "            lam=0.0, seed=0, preset='tiny', steps=10)\n"
              "assert writer.flush(60)\n")
    done = subprocess.run([sys.executable, "-c", script, f"sqlite:///{tmp_path / 'lab.db'}"], cwd=root,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "lab.db-wal").exists()
    shutil.copyfile(tmp_path / "lab.db", tmp_path / "alone.db")
    alone = RunStore(f"sqlite:///{tmp_path / 'alone.db'}", create=False)
    assert [r.name for r in alone.runs.list_runs()] == ["left open"]
    alone.close()
