"""Tags edited after launch (``engine.runner.tags``) and the ``tag`` and ``logs`` commands."""

from __future__ import annotations

import pytest

from engine.cli.main import main
from engine.runner.tags import edit_tags, parse_tags, replace_tags
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
    assert store.get_run(run_id).tags == ["pilot", "lr-sweep"]  # nothing stored by a refused edit
    assert replace_tags(store, run_id, "b, a") == ["b", "a"]
    assert replace_tags(store, run_id, "") == []


def test_the_tag_command_edits_and_prints_and_refuses_in_one_line(db, capsys):
    store = RunStore(db)
    run_id = new_run(store, "r")
    assert main(["tag", "--db", db, str(run_id), "--add", "pilot,ablation", "--add", "x"]) == 0
    assert capsys.readouterr().out == f"run {run_id}: tags pilot, ablation, x\n"
    assert main(["tag", "--db", db, "r", "--remove", "ablation"]) == 0
    assert store.get_run(run_id).tags == ["pilot", "x"]
    capsys.readouterr()
    assert main(["tag", "--db", db, str(run_id)]) == 0
    assert capsys.readouterr().out == f"run {run_id}: tags pilot, x\n"
    assert main(["tag", "--db", db, str(run_id), "--add", "y" * (TAG_MAX + 5)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: tags: ") and f"the most is {TAG_MAX}: shorten it" in err and err.count("\n") == 1
    assert main(["tag", "--db", db, str(run_id), "--add", "caf\udcfe"]) == 2
    assert "not UTF-8 text" in capsys.readouterr().err
    assert store.get_run(run_id).tags == ["pilot", "x"]
    # the README's line, on a run without the tag it removes: one line, no traceback, nothing stored
    assert main(["tag", "--db", db, str(run_id), "--add", "pilot,lr-sweep", "--remove", "draft"]) == 2
    err = capsys.readouterr().err
    assert err == f"error: run {run_id} has no tag 'draft' (its tags: pilot, x); check the spelling\n"
    assert store.get_run(run_id).tags == ["pilot", "x"]


def test_the_logs_command_prints_a_runs_lines_from_a_level(db, capsys):
    store = RunStore(db)
    run_id = new_run(store, "r")
    assert main(["logs", "--db", db, str(run_id)]) == 0
    assert capsys.readouterr().out == f"run {run_id}: no log lines\n"
    store.add_run_logs(run_id, [("info", "claimed"), ("warning", "slow"), (ALERT, "failed: nan at step 5")])
    assert main(["logs", "--db", db, str(run_id)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split("  ", 1)[1] for line in out] == ["info     claimed", "warning  slow", "alert    failed: nan at step 5"]
    assert main(["logs", "--db", db, str(run_id), "--level", "warning"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2
