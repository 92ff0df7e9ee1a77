"""Checkpoint folders named by stored values (``engine.runner.paths``): a crafted database
identity, lineage or run uid (a database someone sends, a shared PostgreSQL anyone can write)
is refused in one line by ``delete`` and ``run`` before anything is written or deleted, and
a delete in a backup copy leaves no empty ``db-<uid>/`` folder behind (issue 42)."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import text

from engine.cli.main import main
from engine.runner.paths import UID, checked_root, run_folders
from engine.training.checkpoints import CheckpointError, run_dir
from storage import RunStore
from tests.support.runs import new_run

TINY = ["--preset", "tiny", "--steps", "2", "--eval-interval", "2", "--probe-interval", "0", "--val-batches", "1"]


@pytest.fixture
def lab(tmp_path, monkeypatch):
    """A SQLite database with one run, its checkpoint root two folders down (so ``..`` has
    somewhere to go), and a folder outside the root a crafted identity points at."""
    root = tmp_path / "lab" / "ckpt"
    root.mkdir(parents=True)
    monkeypatch.setenv("BASIS_LAB_CHECKPOINTS", str(root))
    url = f"sqlite:///{tmp_path / 'lab.db'}"
    store = RunStore(url)
    run_id = new_run(store, "r")
    yield store, url, root, run_id
    store.close()


def _sql(url: str, statement: str) -> None:
    store = RunStore(url, create=False)
    with store.engine.begin() as con:
        con.execute(text(statement))
    store.close()


def _one_line(err: str) -> str:
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_delete_on_a_crafted_identity_deletes_nothing_outside_the_root_nor_in_the_database(lab, capsys):
    store, url, root, run_id = lab
    victim = root.parent.parent / "run-victim"  # <root>/db-x/../../run-victim
    victim.mkdir()
    (victim / "precious.txt").write_text("keep me")
    _sql(url, "UPDATE database_identity SET uid = 'x/../..'")
    _sql(url, f"UPDATE runs SET uid = 'victim' WHERE id = {run_id}")
    assert main(["delete", "--db", url, str(run_id)]) == 2
    err = _one_line(capsys.readouterr().err)
    assert "'x/../..'" in err and "identity uid" in err and "restore it from a backup" in err
    assert (victim / "precious.txt").read_text() == "keep me"
    assert [r.id for r in RunStore(url, create=False).runs.list_runs()] == [run_id]


def test_a_run_on_a_crafted_identity_is_refused_before_anything_is_written(lab, capsys, tmp_path):
    store, url, root, run_id = lab
    _sql(url, "UPDATE database_identity SET uid = 'x/../..'")
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if not p.name.startswith("lab.db"))
    assert main(["run", "--db", url, *TINY]) == 2
    err = _one_line(capsys.readouterr().err)
    assert "'x/../..'" in err and "nothing was written or deleted" in err
    copy = RunStore(url, create=False)
    assert [r.id for r in copy.runs.list_runs()] == [run_id] and copy.workers.list_workers() == []
    after = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if not p.name.startswith("lab.db"))
    assert after == before  # no checkpoint folder anywhere


def test_a_crafted_lineage_uid_is_refused(lab):
    store, url, root, _ = lab
    _sql(url, "INSERT INTO database_lineage (uid) VALUES ('../../../etc')")
    with pytest.raises(CheckpointError, match=r"lineage .* is '\.\./\.\./\.\./etc', not the 32 hex digits"):
        checked_root(RunStore(url, create=False))


def test_a_crafted_run_uid_is_left_with_its_problem_and_the_others_are_deleted(lab, capsys):
    store, url, root, run_id = lab
    other = new_run(store, "other")
    _sql(url, f"UPDATE runs SET uid = 'victim' WHERE id = {run_id}")
    (root / "run-victim").mkdir()
    assert main(["delete", "--db", url, str(run_id), str(other)]) == 2
    captured = capsys.readouterr()
    assert "the uid of a run" in captured.err and "'victim'" in captured.err and "deleted 1 run(s)" in captured.out
    assert [r.id for r in RunStore(url, create=False).runs.list_runs()] == [run_id]
    assert (root / "run-victim").is_dir()


def test_a_folder_that_resolves_outside_the_root_is_refused(lab, tmp_path):
    store, url, root, run_id = lab
    uid = store.runs.get_run(run_id).uid
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (root / f"run-{uid}").symlink_to(outside)
    with pytest.raises(CheckpointError, match="outside the checkpoint root"):
        run_folders(store, uid)


def test_new_uids_have_the_checked_form(lab):
    store, _, _, run_id = lab
    assert UID.fullmatch(store.identities.identity().uid) and UID.fullmatch(store.runs.get_run(run_id).uid)


def test_a_delete_in_a_backup_copy_removes_its_emptied_database_folder(lab, capsys):
    from storage.backup import backup

    store, url, root, run_id = lab
    original = run_dir(root, store.runs.get_run(run_id).uid)
    (original / "epoch-1" / "2").mkdir(parents=True)  # the original's checkpoint, which the copy only reads
    copy_path = root.parent / "copy.db"
    backup(store, copy_path)
    copy = RunStore(f"sqlite:///{copy_path}", create=False)
    own = run_folders(copy, copy.runs.get_run(run_id).uid).own
    assert own.parent == root / f"db-{copy.identities.identity().uid}"
    (own / "epoch-1" / "4").mkdir(parents=True)  # the copy's own checkpoint of the run
    assert main(["delete", "--db", str(copy_path), str(run_id)]) == 0
    assert not own.exists() and not own.parent.exists()  # no empty db-<uid>/ left behind
    assert (original / "epoch-1" / "2").is_dir() and root.is_dir()  # the original's, and the root, stay
    copy.close()


def test_a_copys_database_folder_that_holds_another_run_stays(lab, capsys):
    from storage.backup import backup

    store, url, root, run_id = lab
    other = new_run(store, "other")
    copy_path = root.parent / "copy.db"
    backup(store, copy_path)
    copy = RunStore(f"sqlite:///{copy_path}", create=False)
    mine, kept = (run_folders(copy, copy.runs.get_run(i).uid).own for i in (run_id, other))
    for folder in (mine, kept):
        folder.mkdir(parents=True)
    assert main(["delete", "--db", str(copy_path), str(run_id)]) == 0
    assert not mine.exists() and kept.is_dir() and Path(kept.parent).is_dir()
    copy.close()
