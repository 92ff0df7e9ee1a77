"""Faults a run outlives or reports in one line: the PostgreSQL server restarting mid-run
(writes wait for it, the run ends equal to its uninterrupted twin) and a full disk (the run
ends ``interrupted`` with the reason, partial checkpoints are removed, and a resume once
space is back ends equal to the twin)."""

import errno
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import orbax.checkpoint as ocp
import pytest

from engine.cli.main import main
from engine.config import RunConfig
from engine.runner import jobs
from storage import RunStore
from tests.support.runs import trajectory as _trajectory
from tests.support.runs import wait_for

ROOT = Path(__file__).resolve().parents[2]
STEPS, EVERY = 40, 10
RUN = ["--preset", "tiny", "--steps", str(STEPS), "--eval-interval", str(EVERY), "--probe-interval", str(EVERY),
       "--val-batches", "1", "--checkpoint-interval", str(EVERY), "--rank", "4"]
CONFIG = RunConfig(preset="tiny", steps=STEPS, eval_interval=EVERY, probe_interval=EVERY, val_batches=1,
                   checkpoint_interval=EVERY, rank=4)


@pytest.mark.postgres
@pytest.mark.slow
def test_a_run_outlives_a_postgresql_restart_and_equals_its_twin(pg_cluster, pg_url, tmp_path, monkeypatch):
    monkeypatch.setenv("BASIS_LAB_CHECKPOINTS", str(tmp_path / "ckpt"))
    store = RunStore(pg_url)
    proc = subprocess.Popen([sys.executable, "-m", "engine", "run", "--db", pg_url, *RUN], cwd=ROOT,
                            env=os.environ.copy(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        run_id = wait_for(lambda: next((r.id for r in store.list_runs()), None), what="the run", timeout=300)
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
    run = store.get_run(run_id)
    assert run.status == "finished" and run.steps_done == STEPS, run.error

    assert main(["run", "--db", pg_url, *RUN, "--name", "twin"]) == 0
    twin = store.resolve_runs(["twin"])[0]
    got, want = _trajectory(store, run_id), _trajectory(store, twin)
    assert (STEPS, "val_loss") in want and (STEPS, "train_loss") in want
    assert got == want  # every metric but the measured speed, none lost, none twice


def _partial_then_enospc(monkeypatch, failing_step: int, full: threading.Event):
    """While ``full`` is set, orbax's save of ``failing_step`` writes part of the checkpoint
    (a temporary folder, as orbax does) and then finds the disk full."""
    real = ocp.CheckpointManager.save

    def save(self, step, *args, **kwargs):
        if step == failing_step and full.is_set():
            partial = Path(self.directory) / f"{step}.orbax-checkpoint-tmp-1700000000"
            partial.mkdir(parents=True)
            (partial / "state").write_bytes(b"\0" * 4096)
            raise OSError(errno.ENOSPC, "No space left on device", str(partial / "state"))
        return real(self, step, *args, **kwargs)

    monkeypatch.setattr(ocp.CheckpointManager, "save", save)


@pytest.mark.slow
def test_a_full_checkpoint_disk_ends_the_run_resumable_in_one_line_and_leaves_no_partial_save(
        tmp_path, monkeypatch, capsys):
    url, ckpt = f"sqlite:///{tmp_path / 'lab.db'}", tmp_path / "ckpt"
    monkeypatch.setenv("BASIS_LAB_CHECKPOINTS", str(ckpt))
    full = threading.Event()
    full.set()
    _partial_then_enospc(monkeypatch, 2 * EVERY, full)
    assert main(["run", "--db", url, *RUN]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    said = [line for line in err.splitlines() if "disk full" in line]
    assert len(said) == 1 and said[0].startswith(f"run 1 interrupted: disk full: free space on {ckpt}"), err
    assert "and run `python -m engine resume 1`" in said[0]
    store = RunStore(url)
    run = store.get_run(1)
    assert run.status == "interrupted" and run.error.startswith(f"disk full: free space on {ckpt}"), run.error
    assert run.interruption_cause == "disk_full"
    assert run.checkpoint_step == EVERY
    assert not list(ckpt.rglob("*.orbax-checkpoint-tmp*"))  # the failed save left nothing behind
    stale = ckpt / f"run-{run.uid}" / f"epoch-{run.epoch}" / f"{3 * EVERY}.orbax-checkpoint-tmp-1600000000"
    stale.mkdir(parents=True)  # a save of the earlier lease that never finished (a process killed mid-save)
    (stale / "state").write_bytes(b"\0" * 4096)

    full.clear()  # space is back
    assert main(["resume", "--db", url, "1"]) == 0
    run = store.get_run(1)
    assert run.status == "finished" and run.steps_done == STEPS, run.error
    assert f"resumed from the checkpoint at step {EVERY}" in run.notes
    assert not stale.exists()  # removed by the new lease's first save
    assert main(["run", "--db", url, *RUN, "--name", "twin"]) == 0
    twin = store.resolve_runs(["twin"])[0]
    assert _trajectory(store, 1) == _trajectory(store, twin)


@pytest.mark.slow
def test_a_full_database_disk_ends_the_run_and_its_worker_releases_it_once_space_is_back(tmp_path, monkeypatch):
    """SQLite's "database or disk is full" at a metrics write: the run stops; its end cannot
    be stored either while the disk is full, so the worker keeps trying, and the run reads
    ``interrupted`` with the one-line reason as soon as space is back; resumed, it equals its twin."""
    import sqlite3

    from sqlalchemy import exc

    from storage.errors import storage_error

    store = RunStore(f"sqlite:///{tmp_path / 'lab.db'}")
    full = threading.Event()
    real_add, real_status = RunStore.add_metrics, RunStore.set_status

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

    monkeypatch.setattr(RunStore, "add_metrics", add_metrics)
    monkeypatch.setattr(RunStore, "set_status", set_status)
    manager = jobs.JobManager(store, checkpoints=tmp_path / "ckpt")
    try:
        run_id = manager.submit(CONFIG)[0]
        assert manager.wait([run_id], timeout=900)
        outcome = manager.outcomes[run_id]
        assert outcome.status == "interrupted" and not outcome.released
        assert outcome.error.startswith(f"disk full: free space on {tmp_path} and run ")
        assert outcome.error.endswith("the database refused a write: database or disk is full")
        assert f"`python -m engine resume {run_id}`" in outcome.error and "\n" not in outcome.error
        assert store.get_run(run_id).status == "running" and manager.unreleased() == {run_id}
        full.clear()  # space is back: the worker stores the run's end at its next beat
        wait_for(lambda: store.get_run(run_id).status == "interrupted", timeout=60, what="the run released")
        assert store.get_run(run_id).error == outcome.error and manager.unreleased() == set()
        assert outcome.cause == store.get_run(run_id).interruption_cause == "disk_full"
        assert manager.resume([run_id]) == [run_id]
        twin = manager.submit(CONFIG.replace(name="twin"))[0]
        assert manager.wait([run_id, twin], timeout=900)
    finally:
        manager.shutdown()
    run = store.get_run(run_id)
    assert run.status == "finished" and run.steps_done == STEPS, run.error
    assert _trajectory(store, run_id) == _trajectory(store, twin)
