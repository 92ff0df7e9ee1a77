"""Every run's console (issue 43, item 17; ``engine.runner.console`` and ``engine.runner.runlog``):
what a run's training thread prints to stdout and stderr, warns and logs is stored with that
run, with its level, time and source, also when two runs train in two threads of one process;
``engine logs`` shows, filters and searches it; the log is bounded and never fails its run."""

from __future__ import annotations

import logging
import sys
import threading
import time
import warnings

import pytest

from engine.cli.main import main
from engine.config import RunConfig
from engine.runner import console, runlog
from engine.runner.jobs import JobManager
from engine.runner.runlog import RunLog
from engine.runner.writer import StoreWriter
from storage import DatabaseBusyError, RunStore, StorageError
from tests.support.runs import new_run

TINY = RunConfig(preset="tiny", steps=4, eval_interval=2, probe_interval=4, val_batches=2, rank=4)


@pytest.fixture
def lab(sqlite_template, tmp_path):
    """A SQLite database at the newest schema, its URL and a store on it."""
    url = sqlite_template.copy(tmp_path / "lab.db")
    store = RunStore(url)
    yield url, store
    store.close()


def _rows(store, run_id, source=None):
    return [(x.level, x.source, x.text) for x in store.logs.run_logs(run_id) if source is None or x.source == source]


# ---------------------------------------------------------------------------- lines and levels


def test_lines_are_cut_at_newlines_and_a_redrawn_line_keeps_its_last_drawing():
    lines = console.Lines(limit=12)
    assert lines.feed("hel") == [] and lines.feed("lo\nwor") == ["hello"]
    assert lines.feed("ld\r\n\n   \n") == ["world"]  # \r\n ends one line; blank lines are none
    assert lines.feed("10%\r50%\r") == [] and lines.feed("\x1b[32m100%\x1b[0m\n") == ["100%"]
    assert lines.feed("a\r") == [] and lines.feed("\n") == ["a"]  # \r\n split over two writes
    assert lines.feed("x" * 50 + "\n") == ["x" * 13]  # cut (storage ends it in "…")
    lines.feed("y" * 10_000)
    assert len(lines.pending) == 13 and lines.rest() == ["y" * 13] and lines.rest() == []


@pytest.mark.parametrize("line, level", [
    ("step 3 loss 2.1", "info"), ("Traceback (most recent call last):", "error"), ("ValueError: bad shape", "error"),
    ("ERROR: out of memory", "error"), ("E0101 12:00:00.1 xla.cc:1] failed", "error"),
    ("WARNING: slow disk", "warning"), ("  warn: lr high", "warning"), ("W0101 12:00:00 gpu.cc:3] no GPU", "warning"),
    ("/x/y.py:12: UserWarning: careful", "warning"), ("DeprecationWarning: old", "warning"),
    ("debug: cache hit", "debug"), ("errors so far: none", "info"),
])
def test_a_console_line_has_the_level_its_start_says(line, level):
    assert runlog.console_level(line) == level


# ---------------------------------------------------------------------------- one run log, directly


def test_the_runs_thread_prints_warns_and_logs_into_its_log_and_still_to_the_console(lab, capsys):
    """stdout and stderr reach the console as before and the run's log as lines; a warning and a
    logger's record are kept once (not again as the stderr they print); a library's INFO is left
    out, the lab's own INFO kept; a thread without a run is not captured."""
    _, store = lab
    run_id = new_run(store, "a")
    epoch = store.queue.claim(run_id, "host:1")
    writer = StoreWriter(store)
    printer = logging.StreamHandler()  # made while the proxy is in place: it writes to the proxy
    with RunLog(store, writer, run_id, epoch) as run_log:
        logging.getLogger().addHandler(printer)
        try:
            print("hello from the loop")
            print("partial ", end="")
            sys.stderr.write("Traceback (most recent call last):\n")
            with warnings.catch_warnings():
                warnings.simplefilter("always")
                warnings.warn("lr looks high", UserWarning)
            logging.getLogger("orbax.checkpoint").warning("slow save")
            logging.getLogger("orbax.checkpoint").info("a library's info")
            logging.getLogger("jax").setLevel(logging.INFO)
            logging.getLogger("jax").info("compiled")
            logging.getLogger("engine.training.x").setLevel(logging.INFO)
            logging.getLogger("engine.training.x").info("the lab's info")
            other = threading.Thread(target=lambda: print("not this run's"))
            other.start()
            other.join()
        finally:
            logging.getLogger().removeHandler(printer)
            logging.getLogger("jax").setLevel(logging.NOTSET)
            logging.getLogger("engine.training.x").setLevel(logging.NOTSET)
    run_log.end("finished", None)
    writer.flush()
    rows = _rows(store, run_id)
    assert rows[:2] == [("info", "stdout", "hello from the loop"), ("error", "stderr", "Traceback (most recent call last):")]
    assert rows[2][:2] == ("warning", "warning") and rows[2][2].startswith("UserWarning: lr looks high (")
    assert rows[3:] == [("warning", "orbax.checkpoint", "orbax.checkpoint: slow save"),
                        ("info", "engine.training.x", "engine.training.x: the lab's info"),
                        ("info", "stdout", "partial"),  # the unfinished line, at the end of the training
                        ("info", "lab", "finished")]
    out, err = capsys.readouterr()
    assert "hello from the loop\npartial not this run's\n" == out  # the console saw every write
    assert err.startswith("Traceback (most recent call last):\n") and "slow save" in err


def test_a_printed_traceback_is_an_error_frames_and_all(lab):
    import traceback

    _, store = lab
    run_id = new_run(store, "a")
    epoch = store.queue.claim(run_id, "host:1")
    writer = StoreWriter(store)
    with RunLog(store, writer, run_id, epoch) as run_log:
        try:
            raise ValueError("bad shape")
        except ValueError:
            traceback.print_exc()
        print("  indented, after an info line")
    run_log.flush()
    writer.flush()
    rows = _rows(store, run_id)
    errors = [text for level, source, text in rows if level == "error" and source == "stderr"]
    assert errors[0] == "Traceback (most recent call last):" and errors[-1] == "ValueError: bad shape"
    assert any(t.lstrip().startswith("File ") for t in errors) and len(errors) == len(rows) - 1
    assert rows[-1] == ("info", "stdout", "  indented, after an info line")


def test_a_training_keeps_its_first_lines_and_says_how_many_it_dropped(lab, monkeypatch):
    _, store = lab
    monkeypatch.setattr(runlog, "LINES_MAX", 5)
    run_id = new_run(store, "a")
    epoch = store.queue.claim(run_id, "host:1")
    writer = StoreWriter(store)
    with RunLog(store, writer, run_id, epoch) as run_log:
        for i in range(12):
            print(f"line {i}")
    run_log.end("failed", "boom")
    writer.flush()
    texts = [x.text for x in store.logs.run_logs(run_id)]
    assert texts[:5] == [f"line {i}" for i in range(5)]
    assert "keeps 5 lines a training" in texts[5]
    assert texts[6:] == ["7 more lines dropped (a training keeps its first 5)", "failed: boom"]


def test_a_busy_database_delays_the_log_and_a_refusing_one_drops_it_never_failing_the_run(lab, monkeypatch):
    _, store = lab
    run_id = new_run(store, "a")
    epoch = store.queue.claim(run_id, "host:1")
    writer = StoreWriter(store, sleep=lambda s: None)
    calls = {"n": 0}
    real = store.logs.add_run_logs

    def flaky(run, lines, **kw):
        calls["n"] += 1
        if calls["n"] <= 2:  # the first batch: busy twice, then stored
            raise DatabaseBusyError("database is locked")
        if calls["n"] == 4:  # the second batch
            raise StorageError("the database refused it")
        return real(run, lines, **kw)

    monkeypatch.setattr(store.logs, "add_run_logs", flaky)
    with RunLog(store, writer, run_id, epoch) as run_log:
        print("first batch")
        run_log.flush()  # busy twice, then stored
        print("second batch")
        run_log.flush()  # refused: dropped
        print("third batch")
    run_log.end("finished", None)
    writer.flush()
    assert writer.failure(run_id) is None and writer.retries == 2
    assert [x.text for x in store.logs.run_logs(run_id)] == ["first batch", "third batch", "finished"]


# ---------------------------------------------------------------------------- runs that train


def _noisy(barrier=None):
    """An ``on_step`` hook that prints, warns and writes to stderr from inside a run's training."""

    def on_step(run_id, step, loss):
        if step == 1:
            if barrier is not None:
                barrier.wait()  # both runs are training now, in two threads
            print(f"print of run {run_id}")
            with warnings.catch_warnings():
                warnings.simplefilter("always")
                warnings.warn(f"warning of run {run_id}", RuntimeWarning)
            print(f"stderr of run {run_id}", file=sys.stderr)
            if barrier is not None:
                barrier.wait()
    return on_step


def test_a_runs_print_and_warning_are_in_its_log_and_in_engine_logs(lab, capsys):
    url, store = lab
    manager = JobManager(store, on_step=_noisy())
    [run_id] = manager.submit(TINY)
    manager.wait()
    manager.shutdown()
    assert store.runs.get_run(run_id).status == "finished"
    rows = _rows(store, run_id)
    assert ("info", "stdout", f"print of run {run_id}") in rows and ("info", "stderr", f"stderr of run {run_id}") in rows
    [warned] = [r for r in rows if r[1] == "warning"]
    assert warned[0] == "warning" and warned[2].startswith(f"RuntimeWarning: warning of run {run_id} (")
    assert [r[2].split(":")[0] for r in rows if r[1] == "lab" and r[2].startswith("step ")] == ["step 0/4", "step 2/4",
                                                                                               "step 4/4"]
    assert rows[0][2].startswith("claimed by") and rows[-1] == ("info", "lab", "finished")
    capsys.readouterr()
    assert main(["logs", str(run_id), "--db", url]) == 0
    out = capsys.readouterr().out
    assert f"info     stdout: print of run {run_id}\n" in out and f"warning  RuntimeWarning: warning of run {run_id}" in out
    assert main(["logs", str(run_id), "--db", url, "--level", "warning"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and "RuntimeWarning: warning of run" in out[0]
    assert main(["logs", str(run_id), "--db", url, "--grep", "STDERR"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and out[0].endswith(f"stderr: stderr of run {run_id}")
    assert main(["logs", str(run_id), "--db", url, "--grep", "nothing like it", "--follow"]) == 0  # ended: returns
    assert capsys.readouterr().out == f"run {run_id}: no log lines holding 'nothing like it' yet\n"


def test_two_runs_training_at_once_in_one_process_keep_their_lines_apart(lab):
    _, store = lab
    manager = JobManager(store, max_concurrent=2, on_step=_noisy(threading.Barrier(2, timeout=300)))
    ids = manager.submit([TINY, TINY.replace(seed=1)])
    manager.wait()
    manager.shutdown()
    assert [store.runs.get_run(i).status for i in ids] == ["finished", "finished"]
    for mine, other in (ids, ids[::-1]):
        texts = [x.text for x in store.logs.run_logs(mine)]
        assert f"print of run {mine}" in texts and f"stderr of run {mine}" in texts
        assert any(t.startswith(f"RuntimeWarning: warning of run {mine} (") for t in texts)
        assert not any(f"run {other}" in t for t in texts), texts


def test_engine_logs_follow_prints_lines_as_they_come_until_the_run_ends(lab, capsys, monkeypatch):
    from engine.cli.commands import logs

    url, store = lab
    monkeypatch.setattr(logs, "FOLLOW_S", 0.2)
    run_id = new_run(store, "a")
    epoch = store.queue.claim(run_id, "host:1")
    store.logs.add_run_logs(run_id, [("info", "claimed by host:1 (lease 1)")], epoch=epoch)

    def train():
        time.sleep(1.0)
        store.logs.add_run_logs(run_id, [(time.time(), "warning", "slow step", "stderr")], epoch=epoch)
        time.sleep(0.5)
        store.runs.set_status(run_id, "finished", epoch=epoch)
        store.logs.add_run_logs(run_id, [(time.time(), "info", "finished", "lab")], epoch=epoch)  # after the status

    trainer = threading.Thread(target=train)
    trainer.start()
    assert main(["logs", str(run_id), "--db", url, "--follow"]) == 0
    trainer.join()
    out = [line.split("  ", 1)[1] for line in capsys.readouterr().out.splitlines()]
    assert out == ["info     claimed by host:1 (lease 1)", "warning  stderr: slow step", "info     finished"]
