"""The command line, end to end on a temporary database."""

import pandas as pd
import pytest

from engine.cli.main import main
from storage import RunStore


@pytest.fixture
def db(tmp_path):
    return f"sqlite:///{tmp_path / 'cli.db'}"


def test_sweep_list_show_export(db, tmp_path, capsys):
    rc = main(["sweep", "--db", db, "--preset", "tiny", "--ranks", "exact,2,8", "--seeds", "0,1",
               "--steps", "6", "--eval-interval", "3", "--probe-interval", "3", "--val-batches", "2"])
    out = capsys.readouterr().out
    assert rc == 0
    store = RunStore(db)
    runs = store.runs.list_runs()
    assert sorted((r.estimator, r.rank, r.seed) for r in runs) == sorted(
        [("exact", None, s) for s in (0, 1)] + [("basis", r, s) for r in (2, 8) for s in (0, 1)])
    assert all(r.status == "finished" for r in runs)
    assert "saved/exact" in out and "basis R=8 s1" in out

    assert main(["list", "--db", db]) == 0
    assert "basis R=2 s0" in capsys.readouterr().out
    assert main(["show", "--db", db, "basis R=2 s0"]) == 0
    assert '"rank": 2' in capsys.readouterr().out

    for fmt in ("long", "wide"):
        path = tmp_path / f"{fmt}.csv"
        assert main(["export", "--db", db, "--out", str(path), "--format", fmt]) == 0
        frame = pd.read_csv(path)
        metrics = store.metrics([r.id for r in runs])
        if fmt == "long":
            assert len(frame) == len(metrics)
            system = frame[frame["metric"].str.startswith("sys/")]  # the system metrics ride along
            assert {"sys/cpu_percent", "sys/rss_mib", "sys/load1"} <= set(system["metric"])
            assert set(system["step"]) == {0, 3, 6} and (system.loc[system.metric == "sys/rss_mib", "value"] > 0).all()
            merged = frame.merge(metrics, left_on=["run_id", "step", "metric"], right_on=["run_id", "step", "name"])
            assert len(merged) == len(metrics)
            assert (merged["value_x"] - merged["value_y"]).abs().max() < 1e-9
        else:
            assert len(frame) == metrics.groupby(["run_id", "step"]).ngroups
            assert frame["sys/rss_mib"].notna().all()  # every (run, step) row has its system figures
            got = frame.set_index(["run_id", "step"])["val_loss"].dropna()
            want = metrics[metrics.name == "val_loss"].set_index(["run_id", "step"])["value"]
            pd.testing.assert_series_equal(got.sort_index(), want.sort_index(), check_names=False)


@pytest.mark.parametrize(
    "argv,message",
    [
        (["run", "--rank", "0"], "rank must be an integer >= 1"),
        (["run", "--lam", "1.5"], "lam must be in [0, 1)"),
        (["sweep", "--ranks", "exact,big"], "neither 'exact' nor an integer"),
        (["sweep", "--estimators", "basis,magic"], "unknown estimator"),
        (["run", "--dataset", "files", "--data-path", "/nonexistent/*.txt"], "no file matches"),
        (["run", "--preset", "tiny", "--val-tokens", "10", "--val-batches", "500"], "fix by"),
    ],
)
def test_bad_input_exits_non_zero_and_writes_nothing(db, capsys, argv, message):
    assert main([*argv, "--db", db]) == 2
    assert message in capsys.readouterr().err
    assert RunStore(db).runs.list_runs() == []


@pytest.mark.parametrize("argv,message", [
    (["run", "--rank", "eight"], "python -m engine run: error: argument --rank: rank: 'eight' is not an integer; "
                                 "see python -m engine run --help"),
    (["run", "--preset", "huge"], "python -m engine run: error: argument --preset: invalid choice: 'huge' (choose from "
                                  "'paper', 'small', 'tiny', 'gpt2'); see python -m engine run --help"),
    (["list", "--limit", "3"], "python -m engine: error: unrecognized arguments: --limit 3; see python -m engine --help"),
])
def test_a_flag_argparse_refuses_is_one_line_naming_help_not_the_whole_usage(capsys, argv, message):
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 2
    assert capsys.readouterr().err == message + "\n"  # `run`'s usage alone is 40 lines above the error


def test_unknown_run_and_unopenable_database(db, tmp_path, capsys):
    RunStore(db)  # an empty database: show only reads, it creates none
    assert main(["show", "--db", db, "42"]) == 2
    assert capsys.readouterr().err == "error: no run with id or name '42'; `python -m engine list` shows the ids and names\n"
    garbage = tmp_path / "not-a-db.db"
    garbage.write_bytes(b"this is not sqlite" * 100)
    assert main(["list", "--db", str(garbage)]) == 2
    assert "BASIS_LAB_DB_URL" in capsys.readouterr().err
    assert garbage.read_bytes() == b"this is not sqlite" * 100


def test_cancel_command_cancels_a_queued_run(db, capsys):
    store = RunStore(db)
    run_id = store.runs.create_run(name="queued", config={}, estimator="basis", rank=4, lam=0.0, seed=0, preset="tiny", steps=10)
    assert main(["cancel", "--db", db, str(run_id)]) == 0
    assert store.runs.get_run(run_id).status == "cancelled"


def test_a_large_launch_needs_yes_and_long_intervals_are_warned(db, capsys):
    argv = ["sweep", "--db", db, "--preset", "tiny", "--ranks", "exact,1,8,32", "--seeds", "0-999", "--steps", "10",
            "--eval-interval", "50", "--queue-only"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "warning: 4,000 runs is more than 100 in one launch" in err
    assert "warning: --eval-interval 50 is more than the 10 steps" in err
    assert "error: 4,000 runs to launch (estimated total unknown): pass --yes" in err
    assert RunStore(db).runs.list_runs() == []  # nothing queued
    assert main([*argv[:-1], "--seeds", "0-1", "--queue-only"]) == 0  # 8 runs: no confirmation asked
    assert len(RunStore(db).runs.list_runs()) == 8


def test_cli_and_form_share_the_schemas_eval_interval_default():
    from app import form
    from engine.config import EVALS_PER_RUN, RunConfig

    assert RunConfig().eval_interval is None and form.DEFAULT_SWEEP.base.eval_interval is None
    assert RunConfig(steps=2000).effective_eval_interval == 2000 // EVALS_PER_RUN
    base = form.DEFAULT_SWEEP.base
    assert base.effective_eval_interval == RunConfig(preset=base.preset, steps=base.steps).effective_eval_interval
    assert RunConfig(steps=5).effective_eval_interval == 5 and RunConfig(eval_interval=7).effective_eval_interval == 7


BAD_BYTE = b"x\xfe"  # not UTF-8: Python decodes it as the lone surrogate '\udcfe' (surrogateescape)


@pytest.mark.parametrize("flags", [[b"--tags", b"ok," + BAD_BYTE], [b"--name", BAD_BYTE]],
                         ids=["tags", "name"])
def test_text_that_is_not_utf8_is_refused_at_the_door_in_one_line(db, tmp_path, flags):
    """`--tags $'x\\xfe'` once stored made every later `export` fail ("surrogates not allowed")."""
    import os
    import subprocess
    import sys
    from pathlib import Path


    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "LC_ALL": "C.UTF-8", "PYTHONUTF8": "1"}
    for how in ([b"--queue-only"], []):
        done = subprocess.run([sys.executable.encode(), b"-m", b"engine", b"run", b"--db", db.encode(), b"--preset",
                               b"tiny", b"--steps", b"2", b"--eval-interval", b"2", b"--probe-interval", b"0",
                               *how, *flags], cwd=root, env=env, capture_output=True)
        err = done.stderr.decode()
        assert done.returncode == 2, err
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
        assert "is not UTF-8 text" in err and "\\udcfe" in err, err
    assert not Path(db.removeprefix("sqlite:///")).exists() or RunStore(db).runs.list_runs() == []


def test_every_door_of_stored_text_refuses_what_utf8_cannot_hold_and_export_works(db, tmp_path):
    store = RunStore(db)
    run_id = store.runs.create_run(name="r", config={}, estimator="basis", rank=4, lam=0.0, seed=0, preset="tiny", steps=2)
    bad = BAD_BYTE.decode("utf-8", "surrogateescape")
    for write in (lambda: store.runs.set_tags(run_id, [bad]), lambda: store.runs.rename_run(run_id, bad),
                  lambda: store.runs.set_notes(run_id, bad), lambda: store.views.save_view(bad, {}),
                  lambda: store.views.save_view("v", {"runs": bad}),
                  lambda: store.runs.create_run(name="s", config={"data_path": bad}, estimator="basis", rank=4, lam=0.0,
                                           seed=0, preset="tiny", steps=2),
                  lambda: store.reports.save_report(title=bad, content="{}", run_ids=[run_id], selection={})):
        with pytest.raises(ValueError, match="is not UTF-8 text"):
            write()
    store.metrics.add_metrics(run_id, [(0, 0.0, "val_loss", 10.5)])
    store.runs.append_notes(run_id, f"a path {bad}")  # what the program writes itself is kept, escaped
    store.runs.set_status(run_id, "failed", error=f"cannot read {bad}")
    assert store.runs.get_run(run_id).error == "cannot read x\\udcfe"
    assert main(["export", "--db", db, "--out", str(tmp_path / "all.csv")]) == 0
    assert "a path x\\udcfe" in (tmp_path / "all.csv").read_text(encoding="utf-8")


def test_a_reader_that_closes_the_pipe_ends_the_command_quietly(db):
    """``engine show 1 | head``: the reader closes the pipe before the output is written;
    the command exits with a shell's SIGPIPE status and prints nothing on stderr (no
    "check that the disk has space")."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from engine.cli.main import EXIT_BROKEN_PIPE
    from tests.support.runs import TINY, fake_run

    store = RunStore(db)
    fake_run(store, TINY)
    store.close()
    root = Path(__file__).resolve().parents[2]
    reader, writer = os.pipe()
    os.close(reader)  # `head` has already gone
    try:
        done = subprocess.run([sys.executable, "-m", "engine", "show", "--db", db, "1"], stdout=writer,
                              stderr=subprocess.PIPE, text=True, cwd=root, timeout=120,
                              env=dict(os.environ, PYTHONPATH=str(root)))
    finally:
        os.close(writer)
    assert done.stderr == "" and done.returncode == EXIT_BROKEN_PIPE, (done.returncode, done.stderr)


def test_the_readme_links_what_a_clone_has_and_gives_the_forms_first_sweep_on_the_command_line():
    """Every relative link of the README names a file of the repository; the command it
    gives for the Launch form's first sweep expands to exactly the form's runs; the port
    override is documented."""
    import re
    import shlex
    from pathlib import Path

    from app import form
    from engine.cli.config_flags import sweep_from_args
    from engine.cli.main import build_parser

    root = Path(__file__).resolve().parents[2]
    readme = (root / "README.md").read_text()
    for target in re.findall(r"\]\(([^)#\s]+)\)", readme) + re.findall(r"`(\.\./[^`]+)`", readme):
        if "://" not in target:
            assert (root / target).exists(), f"README links {target}, which a clone does not have"
    assert "make run PORT=" in readme
    command = re.search(r"`python -m engine (sweep --preset tiny [^`]+)`", readme).group(1)
    args = build_parser().parse_args(shlex.split(command))
    assert sweep_from_args(args, sweep=True).expand() == form.DEFAULT_SWEEP.expand()


@pytest.mark.parametrize("bug", [ValueError("a bug, not bad input"), KeyError("missing")])
def test_a_bug_in_a_command_is_raised_not_reported_as_bad_input(db, monkeypatch, capsys, bug):
    """Only the project's user errors exit 2 with one line: a ValueError or KeyError that a
    command did not mean (a bug) propagates out of ``main`` with its traceback."""
    from engine.cli.commands import COMMANDS

    def broken(args):
        raise bug

    monkeypatch.setattr(COMMANDS["workers"], "run", broken)
    with pytest.raises(type(bug)) as raised:
        main(["workers", "--db", db])
    assert raised.value is bug and "error:" not in capsys.readouterr().err


def test_a_bug_exits_1_with_its_traceback_and_bad_input_exits_2_in_one_line(db):
    """``python -m engine``: an unexpected exception ends the process with status 1 and its
    traceback; a user error (a run that does not exist) with status 2 and one line."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=str(root))
    RunStore(db).close()
    bug = ("import sys; from engine.cli.commands import COMMANDS\n"
           "def broken(args): raise KeyError('a bug')\n"
           "COMMANDS['workers'].run = broken\n"
           "from engine.cli.main import main_exit; sys.argv[1:] = ['workers', '--db', sys.argv[1]]; main_exit()")
    done = subprocess.run([sys.executable, "-c", bug, db], capture_output=True, text=True, cwd=root, env=env,
                          timeout=300)
    assert done.returncode == 1 and "Traceback" in done.stderr and "KeyError: 'a bug'" in done.stderr, done.stderr
    done = subprocess.run([sys.executable, "-m", "engine", "show", "--db", db, "nope"], capture_output=True,
                          text=True, cwd=root, env=env, timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("error: no run with id or name 'nope'") and len(done.stderr.splitlines()) == 1


def test_every_printed_table_shows_a_missing_cell_as_a_dash_whatever_its_dtype():
    import pandas as pd

    from engine.cli.output import table_text

    frame = pd.DataFrame({"run": pd.array([1, None], dtype="Int64"), "node": pd.array(["n1", None], dtype="string"),
                          "val": [10.58421, float("nan")]})
    lines = table_text(frame).splitlines()
    assert "<NA>" not in "\n".join(lines) and lines[2].split() == ["-", "-", "-"]
    assert lines[1].split() == ["1", "n1", "10.58421"]  # numbers keep their own formatting


def test_a_command_closes_its_database_so_the_file_alone_holds_what_it_wrote(sqlite_template, tmp_path):
    """Once ``main`` returns, SQLite has written its log into the file and removed it: the
    ``.db`` copied alone holds the queued runs. Called in-process (as tests and a host
    program do), ``main`` leaves the collector as it was (only ``main_exit`` freezes)."""
    import gc
    import shutil

    db = sqlite_template.copy(tmp_path / "lab.db")
    frozen = gc.get_freeze_count()
    for seed in ("0", "1"):
        assert main(["run", "--db", db, "--preset", "tiny", "--steps", "2", "--seed", seed, "--queue-only"]) == 0
    assert gc.get_freeze_count() <= frozen  # frozen objects may be freed; none were added
    assert not (tmp_path / "lab.db-wal").exists()
    shutil.copyfile(tmp_path / "lab.db", tmp_path / "alone.db")
    store = RunStore(f"sqlite:///{tmp_path / 'alone.db'}", create=False)
    try:
        assert sorted(r.seed for r in store.runs.list_runs()) == [0, 1]
    finally:
        store.close()


def test_the_process_entry_freezes_what_is_alive_before_it_exits(sqlite_template, tmp_path):
    """``python -m engine``'s process ``gc.freeze``s its objects before the interpreter's
    finalization (whose collections would traverse them all), after the command's output."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    db = sqlite_template.copy(tmp_path / "lab.db")
    entry = ("import atexit, gc, sys\n"
             "atexit.register(lambda: print('frozen', gc.get_freeze_count(), flush=True))\n"
             "from engine.cli.main import main_exit; main_exit()")
    done = subprocess.run([sys.executable, "-c", entry, "list", "--db", db], capture_output=True, text=True,
                          cwd=root, env=dict(os.environ, PYTHONPATH=str(root)), timeout=300)
    assert done.returncode == 0, done.stderr
    word, frozen = done.stdout.splitlines()[-1].split()  # printed after the command's own output
    assert word == "frozen" and int(frozen) > 10_000, done.stdout


def test_a_command_freezes_the_collector_as_it_starts_training_only_in_its_own_process(monkeypatch):
    """``training_starts`` (``train_here``, ``worker``) freezes what is alive only where ``main``
    ran as the process and the command trains here (``freeze_when_training``): never in the
    dashboard's or a Python caller's process, whose objects must stay collectable."""
    import gc

    from engine.cli import process

    alive = [[] for _ in range(5_000)]  # containers the collector tracks
    before = gc.get_freeze_count()
    process.training_starts()
    assert gc.get_freeze_count() <= before
    monkeypatch.setattr(process, "_when_training", False)
    process.freeze_when_training()
    process.training_starts()
    assert gc.get_freeze_count() >= before + len(alive)
