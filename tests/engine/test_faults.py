"""Faults a run outlives or reports in one line: the PostgreSQL server restarting mid-run
(writes wait for it, the run ends equal to its uninterrupted twin) and a full disk (the run
ends ``interrupted`` with the reason, the one line on the console with nothing of orbax's
tracebacks or the refused writes, partial checkpoints are removed, and a resume once space
is back ends equal to the twin)."""

import errno
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from engine.cli.main import main
from engine.config import RunConfig
from engine.runner import jobs
from engine.training.checkpoints.errors import disk_full
from engine.training.checkpoints.quiet import details, orbax_held
from storage import RunStore
from storage.metrics import MetricsRepository
from storage.runs import RunsRepository
from tests.support import xla
from tests.support.runs import trajectory as _trajectory
from tests.support.runs import wait_for

ROOT = Path(__file__).resolve().parents[2]
STEPS, EVERY = 40, 10
RUN = ["--preset", "tiny", "--steps", str(STEPS), "--eval-interval", str(EVERY), "--probe-interval", str(EVERY),
       "--val-batches", "1", "--checkpoint-interval", str(EVERY), "--rank", "4"]
CONFIG = RunConfig(preset="tiny", steps=STEPS, eval_interval=EVERY, probe_interval=EVERY, val_batches=1,
                   checkpoint_interval=EVERY, rank=4)


@pytest.mark.postgres
def test_a_run_outlives_a_postgresql_restart_and_equals_its_twin(pg_cluster, pg_url, tmp_path, monkeypatch):
    monkeypatch.setenv("BASIS_LAB_CHECKPOINTS", str(tmp_path / "ckpt"))
    store = RunStore(pg_url)
    proc = subprocess.Popen([sys.executable, "-m", "engine", "run", "--db", pg_url, *RUN], cwd=ROOT,
                            env=xla.twin_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        run_id = wait_for(lambda: next((r.id for r in store.runs.list_runs()), None), what="the run", timeout=300)
        wait_for(lambda: len(store.metrics([run_id])) > 0, what="the run's first metrics", timeout=300)
        store.close()
        os.kill(proc.pid, signal.SIGSTOP)  # so that the outage surely falls inside the training
        try:
            pg_cluster.stop_server()  # every connection cut, the socket gone: "connection refused" for a while
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        time.sleep(4)
        pg_cluster.start_server()  # on the same port and socket
        out, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0 and "Traceback" not in out, out
    assert "the database cannot be reached" in out  # the outage was met, and waited for
    store = RunStore(pg_url)
    run = store.runs.get_run(run_id)
    assert run.status == "finished" and run.steps_done == STEPS, run.error

    assert main(["run", "--db", pg_url, *RUN, "--name", "twin"]) == 0
    twin = store.runs.resolve_runs(["twin"])[0]
    got, want = _trajectory(store, run_id), _trajectory(store, twin)
    assert (STEPS, "val_loss") in want and (STEPS, "train_loss") in want
    assert got == want  # every metric but the measured speed, none lost, none twice


_BAR = re.compile(r"\x1b\[[0-9;]*[A-Za-z]|#\d+ [^\r\n\[]*\[[^\]\r\n]*\]")  # a progress bar's drawing


def _console(kind: str, argv: list[str], ckpt: Path) -> tuple[int, list[str], str]:
    """(exit status, the lines, the whole stderr) of ``python -m engine ARGV`` in a process
    whose disk fills at step 2·EVERY (``tests.support.disk_full`` KIND): the console as a user
    sees it, logging as the CLI leaves it (absl's ``basicConfig`` once orbax is imported). The
    lines leave out the progress bars (redrawn after ``\r``; a log line may follow one on its
    line). The process compiles as this one does (``tests.support.xla``), so that what it
    checkpointed resumes here equal to a twin trained here."""
    proc = subprocess.run([sys.executable, "-m", "tests.support.disk_full", kind, str(2 * EVERY), *argv], cwd=ROOT,
                          env=xla.twin_env(BASIS_LAB_CHECKPOINTS=str(ckpt)),
                          capture_output=True, text=True, timeout=600)
    lines = [_BAR.sub("", part).strip() for part in re.split(r"[\r\n]+", proc.stderr)]
    return proc.returncode, [line for line in lines if line], proc.stderr


def test_an_os_error_of_a_full_disk_or_quota_is_recognised():
    assert disk_full(OSError(errno.ENOSPC, "No space left on device")) and disk_full(OSError(errno.EDQUOT, "quota"))
    assert disk_full(ValueError("RESOURCE_EXHAUSTED: ... No space left on device [os_error_code='28']"))
    assert not disk_full(OSError(errno.EACCES, "Permission denied"))


def test_what_orbax_logs_while_saving_is_passed_on_only_when_the_save_succeeds(caplog):
    absl = logging.getLogger("absl")  # orbax logs through absl's logger, from threads of its own too
    with caplog.at_level(logging.WARNING):
        with orbax_held(ok := []):
            writer = threading.Thread(target=absl.warning, args=("a warning of a good save",))
            writer.start()
            writer.join()
        assert "a warning of a good save" in caplog.text and len(ok) == 1
        with pytest.raises(ValueError), orbax_held(failed := []), orbax_held(other := []):
            absl.error("the disk is full")
            raise ValueError("No space left on device")
    assert "the disk is full" not in caplog.text  # held: the failure's one line says it
    assert details(failed) == details(other) == ("ERROR absl [MainThread]: the disk is full",)


def test_a_full_checkpoint_disk_ends_the_run_resumable_in_one_line_and_leaves_no_partial_save(tmp_path, monkeypatch):
    """Orbax's writer threads log the failure with a traceback (a hundred lines, through
    absl): the console holds the one line; the run's log keeps what orbax said."""
    url, ckpt = f"sqlite:///{tmp_path / 'lab.db'}", tmp_path / "ckpt"
    monkeypatch.setenv("BASIS_LAB_CHECKPOINTS", str(ckpt))
    status, lines, err = _console("checkpoint", ["run", "--db", url, *RUN], ckpt)
    assert status == 1 and "Traceback" not in err and "ERROR" not in err and "WARNING" not in err, err
    assert lines[0] == f"queued 1 run(s) in {url}: ids [1]" and len(lines) == 2, lines
    assert lines[1].startswith(f"run 1 interrupted: disk full: free space on {ckpt}"), lines
    assert "and run `python -m engine resume 1`" in lines[1]
    store = RunStore(url)
    run = store.runs.get_run(1)
    assert run.status == "interrupted" and run.error.startswith(f"disk full: free space on {ckpt}"), run.error
    assert run.interruption_cause == "disk_full"
    assert run.checkpoint_step == EVERY
    logged = [line.text for line in store.logs.run_logs(1)]
    assert any("raised an exception: RESOURCE_EXHAUSTED" in t and "Traceback" in t for t in logged), logged
    assert logged[-1].startswith("interrupted: disk full: free space on")
    assert not list(ckpt.rglob("*.orbax-checkpoint-tmp*"))  # the failed save left nothing behind
    stale = ckpt / f"run-{run.uid}" / f"epoch-{run.epoch}" / f"{3 * EVERY}.orbax-checkpoint-tmp-1600000000"
    stale.mkdir(parents=True)  # a save of the earlier lease that never finished (a process killed mid-save)
    (stale / "state").write_bytes(b"\0" * 4096)

    # space is back
    assert main(["resume", "--db", url, "1"]) == 0
    run = store.runs.get_run(1)
    assert run.status == "finished" and run.steps_done == STEPS, run.error
    assert f"resumed from the checkpoint at step {EVERY}" in run.notes
    assert not stale.exists()  # removed by the new lease's first save
    assert main(["run", "--db", url, *RUN, "--name", "twin"]) == 0
    twin = store.runs.resolve_runs(["twin"])[0]
    assert _trajectory(store, 1) == _trajectory(store, twin)


def test_a_full_database_disk_ends_the_run_and_its_worker_releases_it_once_space_is_back(tmp_path, monkeypatch):
    """SQLite's "database or disk is full" at a metrics write: the run stops; its end cannot
    be stored either while the disk is full, so the worker keeps trying, and the run reads
    ``interrupted`` with the one-line reason as soon as space is back; resumed, it equals its twin."""
    import sqlite3

    from sqlalchemy import exc

    from storage.errors import storage_error

    store = RunStore(f"sqlite:///{tmp_path / 'lab.db'}")
    full = threading.Event()
    real_add, real_status = MetricsRepository.add_metrics, RunsRepository.set_status

    def refused():
        e = exc.OperationalError("INSERT INTO metrics ...", {}, sqlite3.OperationalError("database or disk is full"))
        return storage_error(e, f"database error on {store.url}")

    fills = [True]  # once

    def add_metrics(self, run_id, rows, **kwargs):
        if fills and any(step >= 2 * EVERY for step, *_ in rows):
            fills.pop()
            full.set()  # the disk fills at step 20
        if full.is_set():
            raise refused()
        return real_add(self, run_id, rows, **kwargs)

    def set_status(self, *args, **kwargs):
        if full.is_set():
            raise refused()
        return real_status(self, *args, **kwargs)

    monkeypatch.setattr(MetricsRepository, "add_metrics", add_metrics)
    monkeypatch.setattr(RunsRepository, "set_status", set_status)
    manager = jobs.JobManager(store, checkpoints=tmp_path / "ckpt")
    try:
        run_id = manager.submit(CONFIG)[0]
        assert manager.wait([run_id], timeout=900)
        outcome = manager.outcomes[run_id]
        assert outcome.status == "interrupted" and not outcome.released
        assert outcome.error.startswith(f"disk full: free space on {tmp_path} and run ")
        assert outcome.error.endswith("the database refused a write: database or disk is full")
        assert f"`python -m engine resume {run_id}`" in outcome.error and "\n" not in outcome.error
        assert store.runs.get_run(run_id).status == "running" and manager.unreleased() == {run_id}
        full.clear()  # space is back: the worker stores the run's end at its next beat
        # the manager stores the end, then forgets it: wait for both (the status alone raced the set)
        wait_for(lambda: store.runs.get_run(run_id).status == "interrupted" and not manager.unreleased(), timeout=60,
                 what="the run released")
        assert store.runs.get_run(run_id).error == outcome.error and manager.unreleased() == set()
        assert outcome.cause == store.runs.get_run(run_id).interruption_cause == "disk_full"
        assert manager.resume([run_id]) == [run_id]
        twin = manager.submit(CONFIG.replace(name="twin"))[0]
        assert manager.wait([run_id, twin], timeout=900)
    finally:
        manager.shutdown()
    run = store.runs.get_run(run_id)
    assert run.status == "finished" and run.steps_done == STEPS, run.error
    assert _trajectory(store, run_id) == _trajectory(store, twin)


def test_a_full_database_disk_is_one_line_per_run_on_the_console(tmp_path):
    """Every write meets the full disk (metrics, heartbeats, the run's end, the next run's
    claim): the console holds one line for the run it stopped and one for the run it kept
    queued, no error per refused write and no traceback."""
    url = f"sqlite:///{tmp_path / 'lab.db'}"
    sweep = ["sweep", "--db", url, *RUN[:-2], "--ranks", "4,8", "--estimators", "basis", "--yes"]  # RUN less --rank
    status, lines, err = _console("database", sweep, tmp_path / "ckpt")
    assert status == 1 and "Traceback" not in err and "ERROR" not in err, err
    assert lines[0] == f"queued 2 run(s) in {url}: ids [1, 2]" and len(lines) == 3, lines
    assert lines[1] == (f"WARNING:engine.runner.execution:run 2 not started, still queued: database error on {url}: "
                        "the database's disk is full (database or disk is full); nothing was written: free space on "
                        "it and try again; `python -m engine resume --all` trains it once there is space")
    assert lines[2] == (f"run 1 interrupted: disk full: free space on {tmp_path} and run `python -m engine resume 1` "
                        "(it continues from its last checkpoint); the database refused a write: database or disk is "
                        "full")
    assert [r.status for r in RunStore(url).runs.list_runs()] in (["running", "queued"], ["queued", "running"])
