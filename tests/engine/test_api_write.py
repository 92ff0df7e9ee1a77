"""``engine.api.Lab``'s writes (issue 43, item 16): launch, sweep, wait, tag, note, cancel and
resume from Python, on SQLite and PostgreSQL, through the functions the CLI's commands call, so a
bad value is refused with the CLI's one line (a ``ValueError``) and nothing is written."""

from __future__ import annotations

import math

import pytest

from engine.api import Lab, LaunchWarning
from engine.cli.main import main
from engine.config import ConfigError
from engine.runner.jobs import JobManager
from storage import RunNotFoundError, RunStore, StorageError

# the smallest runs the CLI's tests train (tests/engine/test_cli.py)
TINY = dict(preset="tiny", steps=6, eval_interval=3, probe_interval=3, val_batches=2)
BACKENDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]


def count(url: str) -> int:
    store = RunStore(url, create=False)
    try:
        return len(store.runs.list_runs())
    finally:
        store.close()


def cli_error(capsys, argv: list[str], url: str) -> str:
    """The one line ``python -m engine`` prints for ``argv`` on ``url``, without ``error: ``."""
    capsys.readouterr()
    assert main([*argv, "--db", url]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-1].startswith("error: ")
    return lines[-1].removeprefix("error: ")


@pytest.fixture(autouse=True)
def _checkpoints(monkeypatch, tmp_path):
    """Checkpoints in the test's folder, on PostgreSQL too (else beside the default database)."""
    monkeypatch.setenv("BASIS_LAB_CHECKPOINTS", str(tmp_path / "checkpoints"))


@pytest.fixture
def url(tmp_path):
    """A SQLite database holding one queued run, so that "nothing written" is a count that could grow."""
    url = f"sqlite:///{tmp_path / 'api.db'}"
    with Lab(url, create=True) as lab:
        lab.launch(run="queue", **TINY)
    return url


@pytest.mark.parametrize("call, argv", [
    (dict(lr=-1), ["run", "--lr", "-1"]),
    (dict(rank=0), ["run", "--rank", "0"]),
    (dict(lam=1.5), ["run", "--lam", "1.5"]),
    (dict(steps=0), ["run", "--steps", "0"]),
    (dict(dataset="files", data_path="/nonexistent/*.txt"), ["run", "--dataset", "files", "--data-path", "/nonexistent/*.txt"]),
    (dict(sweep=True, ranks="exact,big"), ["sweep", "--ranks", "exact,big"]),
    (dict(sweep=True, estimators=["basis", "magic"]), ["sweep", "--estimators", "basis,magic"]),
    (dict(sweep=True, seeds="3-1"), ["sweep", "--seeds", "3-1"]),
])
def test_a_bad_value_writes_nothing_and_says_what_the_cli_says(url, capsys, call, argv):
    call = dict(call)
    sweep = call.pop("sweep", False)
    with Lab(url) as lab:
        before = count(url)
        with pytest.raises(ValueError) as refused:
            (lab.sweep if sweep else lab.launch)(run="queue", **{**TINY, **call})
        assert count(url) == before == 1
    said = cli_error(capsys, [*argv, "--queue-only", "--preset", "tiny"], url)
    assert str(refused.value) == said and "\n" not in said
    assert count(url) == before


@pytest.mark.parametrize("call, names", [
    (dict(batchsize=8), ["'batchsize'", "did you mean 'batch_size'?"]),
    (dict(ranks=[8]), ["'ranks'", "did you mean 'rank'?"]),  # a list is a sweep's
    (dict(rank="8"), ["rank must be an integer >= 1 (got '8')"]),  # no text where the CLI's flag would convert it
    (dict(rank=8.0), ["rank must be an integer >= 1 (got 8.0)"]),
    (dict(run="background"), ["run must be one of 'here', 'queue'"]),
    (dict(tags="ok," + "x" * 100), ["tags: 'xxxxxxxxxxxxxxxxxxxx'… is longer than 64 characters"]),
])
def test_what_only_python_can_pass_is_refused_in_one_line_naming_it(url, call, names):
    with Lab(url) as lab:
        with pytest.raises(ValueError) as refused:
            lab.launch(**{"run": "queue", **TINY, **call})
    text = str(refused.value)
    assert all(n in text for n in names) and "\n" not in text, text
    assert count(url) == 1


def test_the_launch_rule_and_its_warnings_are_the_clis_with_arguments_for_flags(url, capsys):
    grid = dict(ranks="exact,1,8,32", seeds="0-999", steps=10, eval_interval=50)
    with Lab(url) as lab:
        with pytest.warns(LaunchWarning) as warned, pytest.raises(ValueError) as refused:
            lab.sweep(preset="tiny", run="queue", **grid)
        assert count(url) == 1
        said = cli_error(capsys, ["sweep", "--queue-only", "--preset", "tiny", "--ranks", "exact,1,8,32", "--seeds",
                                  "0-999", "--steps", "10", "--eval-interval", "50"], url)
        assert said == str(refused.value).replace("yes=True", "--yes").replace("seeds/ranks", "--seeds/--ranks")
        assert "pass yes=True to launch them, or fewer seeds/ranks" in str(refused.value)
        texts = [str(w.message) for w in warned]
        assert "eval_interval 50 is more than the 10 steps: the run validates only at step 0 and at its last step" in texts
        with pytest.raises(ValueError, match=r"^concurrent must be >= 1 \(got 0\)$"):
            lab.sweep(preset="tiny", ranks=[8], run="queue", concurrent=0)
        ids = lab.sweep(preset="tiny", ranks=["exact", 1, 8], seeds=[0, 1], steps=10, probe_interval=5,
                        run="queue")  # 6: no yes needed
        assert len(ids) == 6 and count(url) == 7
        again = sorted(lab.runs(f"sweep == {lab.store.runs.get_run(ids[0]).sweep_id}")["id"])
        assert again == ids  # one launch, one sweep
        with pytest.warns(LaunchWarning, match="already in the database"):
            lab.launch(preset="tiny", rank=8, seed=1, steps=10, probe_interval=5, run="queue")


@pytest.mark.parametrize("db_url", BACKENDS, indirect=True)
def test_launch_wait_tag_note_cancel_and_resume_through_the_api(db_url):
    with Lab(db_url, create=True) as lab:
        ids = lab.sweep(estimators="basis", ranks=4, seeds=[0, 1], run="queue", tags="pilot", **TINY)
        runs = {r.id: r for r in lab.store.runs.list_runs()}
        assert sorted(runs) == ids and all(r.status == "queued" and r.owner is None for r in runs.values())
        assert [runs[i].seed for i in ids] == [0, 1] and all(r.tags == ["pilot"] for r in runs.values())

        with pytest.raises(TimeoutError, match=rf"2 of the 2 runs did not end within 0.2 s: {ids[0]} \(queued\), "
                                               rf"{ids[1]} \(queued\); .*python -m engine worker"):
            lab.wait(ids, timeout=0.2, poll=0.05)
        assert lab.cancel([ids[1]]) == {ids[1]: "cancelled"}

        worker = JobManager(lab.store, pull=True, max_runs=1)  # what `python -m engine worker` runs
        try:
            done = lab.wait(ids, timeout=300, poll=0.2)
        finally:
            worker.shutdown()
        assert list(done["id"]) == ids and list(done["status"]) == ["finished", "cancelled"]
        assert math.isfinite(done["val_loss"].iloc[0]) and done["steps_done"].iloc[0] == TINY["steps"]

        assert lab.tag(ids, add="baseline", remove="pilot") == {ids[0]: ["baseline"], ids[1]: ["baseline"]}
        lab.store.runs.edit_tags(ids[1], lambda tags: tags + ["odd"])
        with pytest.raises(ValueError, match=f"run {ids[0]} has no tag 'odd'"):
            lab.tag(ids, remove="odd")  # checked on both before either changes
        assert lab.store.runs.get_run(ids[1]).tags == ["baseline", "odd"]
        assert lab.note(ids[0], "first tiny run") == "first tiny run"
        assert lab.note(ids[0], "looked fine", append=True) == "first tiny run\nlooked fine"

        assert lab.resume(ids[1], run="queue") == [ids[1]]
        assert lab.store.runs.get_run(ids[1]).status == "queued"
        assert lab.cancel(ids) == {ids[0]: "not active (finished); nothing to cancel", ids[1]: "cancelled"}
        assert lab.resume(ids[1]) == [ids[1]]  # trained here, from step 0 (it has no checkpoint)
        final = lab.wait(ids, timeout=0)
        assert list(final["status"]) == ["finished", "finished"] and list(final["tags"]) == [["baseline"], ["baseline", "odd"]]
        assert lab.resume(ids[0]) == []  # finished: nothing to resume


@pytest.mark.parametrize("db_url", BACKENDS, indirect=True)
def test_launch_here_trains_in_this_process_as_engine_run_does(db_url, capsys):
    with Lab(db_url) as lab:
        run_id = lab.launch(rank=4, seed=3, tags=["here", "api"], **TINY)
        out, err = capsys.readouterr()
        r = lab.store.runs.get_run(run_id)
        assert (r.status, r.steps_done, r.rank, r.seed, r.tags) == ("finished", TINY["steps"], 4, 3, ["here", "api"])
        assert f"queued 1 run(s) in {lab.store.url}: ids [{run_id}]" in err and "basis R=4 s3" in out  # the summary
        assert list(lab.wait(run_id)["status"]) == ["finished"]


def test_reads_create_nothing_and_writes_need_the_database_or_create(tmp_path):
    path = tmp_path / "missing.db"
    with pytest.raises(StorageError):
        Lab(f"sqlite:///{path}")
    assert not path.exists()
    with Lab(f"sqlite:///{path}", create=True) as lab:
        assert lab.runs().empty
        with pytest.raises(RunNotFoundError):
            lab.cancel(7)
        with pytest.raises(ValueError, match=r"^name the runs to resume \(ids or names\), or pass all=True$"):
            lab.resume()
        with pytest.raises(ValueError, match="timeout >= 0"):
            lab.wait([], timeout=-1)
        assert lab.resume(all=True, run="queue") == []
    assert path.exists()


def test_a_float_field_takes_an_int_as_the_cli_reads_it(url):
    with Lab(url) as lab:
        run_id = lab.launch(lr=1, lam=0, run="queue", **TINY)
        config = lab.store.runs.get_run(run_id).config
    assert (config["lr"], config["lam"]) == (1.0, 0.0) and isinstance(config["lr"], float)


def test_a_sweep_of_one_field_given_twice_is_refused(url):
    with Lab(url) as lab, pytest.raises(ConfigError, match="'ranks' and 'rank' are the same field"):
        lab.sweep(ranks=[8], rank=4, run="queue", **TINY)
    assert count(url) == 1
