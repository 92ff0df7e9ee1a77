"""A run is trained once, by one owner: a stalled owner that was declared dead and replaced
writes nothing when it wakes, says that it lost the run, and exits."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from storage import RunStore
from tests.support.runs import trajectory
from tests.support.runs import wait_for as _wait_for

ROOT = Path(__file__).resolve().parents[2]
STEPS, EVERY = 100, 20
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


def test_a_stalled_owner_loses_its_run_which_is_trained_once(db_url, tmp_path):
    ckpt = tmp_path / "shared-ckpt"
    store = RunStore(db_url)
    owner = _engine("run", "--db", db_url, *RUN, host="machine-a", ckpt=ckpt)
    worker = None
    try:
        run_id = _wait_for(lambda: next((r.id for r in store.runs.list_runs()), None), what="the run")
        _wait_for(lambda: (store.runs.get_run(run_id).checkpoint_step or 0) >= 2 * EVERY, what="two checkpoints")
        os.kill(owner.pid, signal.SIGSTOP)  # a suspended VM, heavy swapping, an NFS hang
        first = store.runs.get_run(run_id).epoch
        worker = _engine("worker", "--db", db_url, "--max-runs", "1", host="machine-b", ckpt=ckpt)
        _stalled_until(owner, lambda: store.runs.get_run(run_id).epoch > first, what="the worker to take the run over")
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
    run = store.runs.get_run(run_id)
    assert f"run {run_id}: lost its lease to epoch " in said and "stopping without writing" in said, said
    assert owner.returncode == 1, said
    assert run.status == "finished" and run.steps_done == STEPS and run.owner.endswith(f":{worker.pid}")
    assert "resumed from the checkpoint at step" in run.notes and run.notes.count("resumed") == 1
    metrics = store.metrics([run_id])
    assert not metrics.duplicated(["step", "name"]).any(), "a (step, metric) stored twice"
    assert sorted(metrics.loc[metrics["name"] == "val_loss", "step"]) == list(range(0, STEPS + 1, EVERY))
    assert sorted(metrics.loc[metrics["name"] == "cos_mean", "step"]) == list(range(EVERY, STEPS + 1, EVERY))
    assert (ckpt / f"run-{run.uid}" / f"epoch-{run.epoch}" / str(STEPS)).is_dir()  # each lease its own folder


# --------------------------------------------------------------------------- damaged checkpoints


def _xor_64_bytes(step_dir: Path) -> None:
    big = max((p for p in (step_dir / "state").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    data = bytearray(big.read_bytes())
    for i in range(64):
        data[len(data) // 2 + i] ^= 0x5A
    big.write_bytes(bytes(data))


def _truncate(step_dir: Path) -> None:
    big = max((p for p in (step_dir / "state").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    big.write_bytes(big.read_bytes()[: big.stat().st_size // 3])


def test_a_damaged_newest_checkpoint_is_refused_and_resume_follows_the_twintrajectory(tmp_path):
    from engine.config import RunConfig
    from engine.runner.jobs import JobManager

    store = RunStore(f"sqlite:///{tmp_path / 'lab.db'}")
    config = RunConfig(preset="tiny", steps=3 * EVERY, eval_interval=EVERY, probe_interval=EVERY, val_batches=1,
                       checkpoint_interval=EVERY, rank=4)
    manager = JobManager(store, checkpoints=tmp_path / "ckpt")
    try:
        ids = manager.submit([config, config])  # twins: the same seed, the same trajectory
        assert manager.wait(ids, timeout=900)
        before = {i: trajectory(store, i) for i in ids}
        assert before[ids[0]] == before[ids[1]] and (3 * EVERY, "val_loss") in before[ids[0]]
        for run_id, damage in zip(ids, (_xor_64_bytes, _truncate)):
            run = store.runs.get_run(run_id)
            assert run.status == "finished" and run.checkpoint_step == 3 * EVERY
            store.runs.set_status(run_id, "interrupted", error="interrupted: a crash after its last checkpoint")
            damage(tmp_path / "ckpt" / f"run-{run.uid}" / f"epoch-{run.epoch}" / str(3 * EVERY))
        assert sorted(manager.resume(ids)) == sorted(ids)
        assert manager.wait(ids, timeout=900)
    finally:
        manager.shutdown()
    for run_id in ids:
        run = store.runs.get_run(run_id)
        assert run.status == "finished" and run.steps_done == 3 * EVERY, run.error
        assert f"resumed from the checkpoint at step {2 * EVERY}" in run.notes
        assert f"skipped: checkpoint at step {3 * EVERY} of run {run_id} is " in run.notes
        assert trajectory(store, run_id) == before[run_id]  # every metric as the uninterrupted run had it
    assert "does not match its checksum" in store.runs.get_run(ids[0]).notes  # the flip reads back silently otherwise
