"""Tags edited after launch (``engine.runner.tags``) and the ``tag`` and ``logs`` commands."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import storage.runs
from engine.cli.main import main
from engine.runner.tags import change_tags, edit_tags, parse_tags
from storage import ALERT, RunStore
from storage.limits import TAG_MAX
from tests.support.runs import new_run


@pytest.fixture
def db(tmp_path):
    return f"sqlite:///{tmp_path / 'cli.db'}"


def test_parse_tags_splits_comma_lists_and_keeps_order():
    assert parse_tags(" pilot, ablation ,,pilot") == ["pilot", "ablation"]
    assert parse_tags(["a,b", "c", "a"]) == ["a", "b", "c"]
    assert parse_tags(None) == [] and parse_tags("  ,  ") == []


def test_edit_tags_adds_removes_and_refuses_what_is_not_there(store):
    run_id = new_run(store, "r")
    assert edit_tags(store, run_id, add=["pilot, ablation"]) == ["pilot", "ablation"]
    assert edit_tags(store, run_id, add=["pilot", "lr-sweep"], remove=["ablation"]) == ["pilot", "lr-sweep"]
    with pytest.raises(ValueError, match=r"has no tag 'ablaton' \(its tags: pilot, lr-sweep\); check the spelling"):
        edit_tags(store, run_id, remove=["ablaton"])
    with pytest.raises(ValueError, match=f"the most is {TAG_MAX}"):
        edit_tags(store, run_id, add=["x" * (TAG_MAX + 1)], remove=["pilot"])
    assert store.runs.get_run(run_id).tags == ["pilot", "lr-sweep"]  # nothing stored by a refused edit
    assert edit_tags(store, run_id, remove=["gone"], missing_ok=True) == ["pilot", "lr-sweep"]


def test_a_pages_tag_box_stores_what_it_changed_and_keeps_an_edit_made_meanwhile(store):
    run_id = new_run(store, "r")
    edit_tags(store, run_id, add=["a", "b"])
    shown = "a, b"  # what the box showed, before the CLI edited the run
    edit_tags(store, run_id, add=["from-the-cli"], remove=["b"])
    assert change_tags(store, run_id, shown, "a, b, mine") == ["a", "from-the-cli", "mine"]  # b: removed meanwhile
    assert change_tags(store, run_id, ["a", "from-the-cli", "mine"], ["mine"]) == ["mine"]
    with pytest.raises(ValueError, match="the most is"):
        change_tags(store, run_id, "mine", ["mine", "x" * (TAG_MAX + 1)])
    assert store.runs.get_run(run_id).tags == ["mine"]


def _slow_checks(monkeypatch) -> None:
    """Tag checks that take 50 ms (a busy machine): they run between the read of a run's
    tags and their write, which an edit that reads and writes in two transactions loses in."""
    check = storage.runs.clean_tags

    def slow(tags):
        time.sleep(0.05)
        return check(tags)

    monkeypatch.setattr(storage.runs, "clean_tags", slow)


def test_ten_concurrent_tag_edits_keep_every_tag(db_url, monkeypatch):
    """Ten edits of one run at once, each on its own connection (SQLite and PostgreSQL):
    each adds its tag to the tags stored when it holds the run's row, so all ten stay."""
    setup = RunStore(db_url)
    run_id = new_run(setup, "r", tags=["first"])
    _slow_checks(monkeypatch)
    start, errors = threading.Barrier(10), []

    def add(k: int) -> None:
        store = RunStore(db_url)
        try:
            start.wait(30)
            edit_tags(store, run_id, add=[f"t{k}"])
        except Exception as e:  # reported below, in the test's thread
            errors.append(e)
        finally:
            store.close()

    threads = [threading.Thread(target=add, args=(k,)) for k in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors
    tags = setup.runs.get_run(run_id).tags
    assert tags[0] == "first" and sorted(tags[1:]) == sorted(f"t{k}" for k in range(10))
    setup.close()


_AT_ONCE = """import pathlib, sys, time
from engine.cli.main import main
here, go = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
here.touch()
while not go.exists():
    time.sleep(0.005)
sys.exit(main(sys.argv[3:]))
"""


def test_ten_tag_commands_at_once_keep_every_tag(db, tmp_path):
    """The fault probe's case: ten ``engine tag 1 --add tK`` processes, started together once
    each is ready; every one succeeds and every tag is stored."""
    store = RunStore(db)
    run_id = new_run(store, "r")
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", _AT_ONCE, str(tmp_path / f"ready-{k}"), str(go),
                               "tag", "--db", db, str(run_id), "--add", f"t{k}"],
                              cwd=Path(__file__).resolve().parents[2], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for k in range(10)]
    deadline = time.monotonic() + 120
    while len(list(tmp_path.glob("ready-*"))) < 10 and time.monotonic() < deadline:
        time.sleep(0.05)
    go.touch()
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0] * 10, outputs
    assert sorted(store.runs.get_run(run_id).tags) == sorted(f"t{k}" for k in range(10))


def test_the_tag_command_edits_and_prints_and_refuses_in_one_line(db, capsys):
    store = RunStore(db)
    run_id = new_run(store, "r")
    assert main(["tag", "--db", db, str(run_id), "--add", "pilot,ablation", "--add", "x"]) == 0
    assert capsys.readouterr().out == f"run {run_id}: tags pilot, ablation, x\n"
    assert main(["tag", "--db", db, "r", "--remove", "ablation"]) == 0
    assert store.runs.get_run(run_id).tags == ["pilot", "x"]
    capsys.readouterr()
    assert main(["tag", "--db", db, str(run_id)]) == 0
    assert capsys.readouterr().out == f"run {run_id}: tags pilot, x\n"
    assert main(["tag", "--db", db, str(run_id), "--add", "y" * (TAG_MAX + 5)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: tags: ") and f"the most is {TAG_MAX}: shorten it" in err and err.count("\n") == 1
    assert main(["tag", "--db", db, str(run_id), "--add", "caf\udcfe"]) == 2
    assert "not UTF-8 text" in capsys.readouterr().err
    assert store.runs.get_run(run_id).tags == ["pilot", "x"]
    # the README's line, on a run without the tag it removes: one line, no traceback, nothing stored
    assert main(["tag", "--db", db, str(run_id), "--add", "pilot,lr-sweep", "--remove", "draft"]) == 2
    err = capsys.readouterr().err
    assert err == f"error: run {run_id} has no tag 'draft' (its tags: pilot, x); check the spelling\n"
    assert store.runs.get_run(run_id).tags == ["pilot", "x"]


def test_the_logs_command_prints_a_runs_lines_from_a_level(db, capsys):
    store = RunStore(db)
    run_id = new_run(store, "r")
    assert main(["logs", "--db", db, str(run_id)]) == 0
    assert capsys.readouterr().out == f"run {run_id}: no log lines\n"
    store.logs.add_run_logs(run_id, [("info", "claimed"), ("warning", "slow"), (ALERT, "failed: nan at step 5")])
    assert main(["logs", "--db", db, str(run_id)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split("  ", 1)[1] for line in out] == ["info     claimed", "warning  slow", "alert    failed: nan at step 5"]
    assert main(["logs", "--db", db, str(run_id), "--level", "warning"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2
