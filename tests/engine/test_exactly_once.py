"""A run is trained once, by one owner: a stalled owner that was declared dead and replaced
writes nothing when it wakes, says that it lost the run, and exits."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from storage import RunStore
from tests.engine.test_durable import _wait_for

ROOT = Path(__file__).resolve().parents[2]
STEPS, EVERY = 200, 20
RUN = ["--preset", "tiny", "--steps", str(STEPS), "--eval-interval", str(EVERY), "--probe-interval", str(EVERY),
       "--val-batches", "1", "--checkpoint-interval", str(EVERY), "--rank", "4"]


def _engine(*args: str, host: str, ckpt: Path) -> subprocess.Popen:
    """``python -m engine ARGS`` as if on machine ``host``, with a 3 s liveness timeout."""
    env = {**os.environ, "BASIS_LAB_CHECKPOINTS": str(ckpt), "BASIS_LAB_STALE_AFTER_S": "3", "BASIS_LAB_HOST": host}
    return subprocess.Popen([sys.executable, "-m", "engine", *args], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _stalled_until(proc: subprocess.Popen, predicate, what: str, tries: int = 10):
    """Keep ``proc`` stopped until ``predicate()`` holds.  Should it have been stopped inside
    a database transaction (holding SQLite's write lock or a PostgreSQL row lock, which
    nobody can take from it), let it run for an instant and stop it again."""
    for _ in range(tries):
        try:
            return _wait_for(predicate, timeout=60, what=what)
        except AssertionError:
            os.kill(proc.pid, signal.SIGCONT)
            time.sleep(0.05)
            os.kill(proc.pid, signal.SIGSTOP)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.slow
def test_a_stalled_owner_loses_its_run_which_is_trained_once(db_url, tmp_path):
    ckpt = tmp_path / "shared-ckpt"
    store = RunStore(db_url)
    owner = _engine("run", "--db", db_url, *RUN, host="machine-a", ckpt=ckpt)
    worker = None
    try:
        run_id = _wait_for(lambda: next((r.id for r in store.list_runs()), None), what="the run")
        _wait_for(lambda: (store.get_run(run_id).checkpoint_step or 0) >= 2 * EVERY, what="two checkpoints")
        os.kill(owner.pid, signal.SIGSTOP)  # a suspended VM, heavy swapping, an NFS hang
        first = store.get_run(run_id).epoch
        worker = _engine("worker", "--db", db_url, "--max-runs", "1", host="machine-b", ckpt=ckpt)
        _stalled_until(owner, lambda: store.get_run(run_id).epoch > first, what="the worker to take the run over")
        os.kill(owner.pid, signal.SIGCONT)
        said, _ = owner.communicate(timeout=600)
        out, _ = worker.communicate(timeout=900)
    finally:
        for proc in (owner, worker):
            if proc is not None and proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
                proc.kill()
                proc.wait()
    assert worker.returncode == 0, out
    run = store.get_run(run_id)
    assert f"run {run_id}: lost its lease to epoch " in said and "stopping without writing" in said, said
    assert owner.returncode == 1, said
    assert run.status == "finished" and run.steps_done == STEPS and run.owner.endswith(f":{worker.pid}")
    assert "resumed from the checkpoint at step" in run.notes and run.notes.count("resumed") == 1
    metrics = store.metrics([run_id])
    assert not metrics.duplicated(["step", "name"]).any(), "a (step, metric) stored twice"
    assert sorted(metrics.loc[metrics["name"] == "val_loss", "step"]) == list(range(0, STEPS + 1, EVERY))
    assert sorted(metrics.loc[metrics["name"] == "cos_mean", "step"]) == list(range(EVERY, STEPS + 1, EVERY))
    assert (ckpt / f"run-{run.uid}" / f"epoch-{run.epoch}" / str(STEPS)).is_dir()  # each lease its own folder
