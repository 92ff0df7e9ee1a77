"""Long runs survive a dead process and lose nothing: kill -9 and resume, signals,
orphaned queued runs, a database locked for 40 s, ids never reused, read-only commands."""

import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from engine.cli.main import main
from engine.config import RunConfig
from engine.runner import jobs, liveness
from engine.training.build import initial_params, optimizer_for
from engine.training.checkpoints import RunCheckpoints, run_dir
from engine.training.steps import init_state
from storage import RunStore
from tests.support import xla
from tests.support.runs import dead_pid, trajectory, wait_for

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--preset", "tiny", "--eval-interval", "20", "--probe-interval", "20", "--val-batches", "2"]


@pytest.fixture
def lab(tmp_path, monkeypatch):
    """A database and checkpoint directory of the test's own, for this process and its children."""
    url = f"sqlite:///{tmp_path / 'lab.db'}"
    monkeypatch.setenv("BASIS_LAB_DB_URL", url)
    monkeypatch.setenv("BASIS_LAB_CHECKPOINTS", str(tmp_path / "ckpt"))
    return url, tmp_path / "ckpt"


def _cli(*args: str) -> subprocess.Popen:
    """``python -m engine ARGS``, compiling as this process does: the tests resume its runs here
    and compare them with twins trained here (``tests.support.xla.twin_env``)."""
    return subprocess.Popen([sys.executable, "-m", "engine", *args], cwd=ROOT, env=xla.twin_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _final_state(config: RunConfig, ckpt_root: Path, uid: str):
    target = init_state(initial_params(config), optimizer_for(config))
    with RunCheckpoints(run_dir(ckpt_root, uid), keep=config.checkpoint_keep) as ckpt:
        assert ckpt.latest_step() == config.steps
        _, state, _, _ = ckpt.restore_latest_valid(target)
    return state


def _val_losses(store: RunStore, run_id: int) -> dict[int, float]:
    m = store.metrics([run_id], names=["val_loss"])
    assert m["step"].is_unique, "a resumed run must not duplicate metrics"
    return dict(zip(m["step"], m["value"]))


def test_kill_9_then_resume_continues_the_exact_trajectory(lab):
    url, ckpt_root = lab
    # checkpoints at 25, 50, 75...: between reads of the loss (probes and evals every 20), so a
    # checkpoint must hold losses not read back yet for train_loss to come out right
    args = [*TINY, "--steps", "100", "--checkpoint-interval", "25", "--estimator", "basis", "--rank", "8"]
    proc = _cli("run", *args)
    store = RunStore(url)
    run_id = wait_for(lambda: next((r.id for r in store.runs.list_runs()), None), what="the run")
    wait_for(lambda: (store.runs.get_run(run_id).checkpoint_step or 0) >= 50, what="a checkpoint at step 50")
    proc.send_signal(signal.SIGKILL)
    proc.wait(60)
    assert store.runs.get_run(run_id).steps_done < 100
    assert main(["list"]) == 0 and store.runs.get_run(run_id).status == "running"  # a read writes nothing
    assert liveness.check_stale(store) == [run_id]  # a sweep (a worker's or `resume`'s) sees the dead owner
    assert store.runs.get_run(run_id).interruption_cause == "stale"

    assert main(["resume", str(run_id)]) == 0
    resumed = store.runs.get_run(run_id)
    assert resumed.status == "finished" and resumed.steps_done == 100
    assert "resumed from the checkpoint at step" in resumed.notes

    assert main(["run", *args, "--name", "straight"]) == 0
    straight = store.runs.resolve_runs(["straight"])[0]
    config = RunConfig.from_dict(resumed.config)
    a = _final_state(config, ckpt_root, resumed.uid)
    b = _final_state(config, ckpt_root, store.runs.get_run(straight).uid)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert trajectory(store, run_id) == trajectory(store, straight)  # every metric, train_loss too, none twice


def test_sigterm_leaves_an_interrupted_run_and_a_checkpoint(lab):
    url, ckpt_root = lab
    proc = _cli("run", *TINY, "--steps", "5000", "--checkpoint-interval", "1000")
    store = RunStore(url)
    run_id = wait_for(lambda: next((r.id for r in store.runs.list_runs() if r.steps_done >= 30), None),
                       what="the run to train 30 steps")
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 128 + signal.SIGTERM, out
    run = store.runs.get_run(run_id)
    assert run.status == "interrupted" and "resume" in run.error
    assert run.checkpoint_step is not None and run.checkpoint_step >= 30
    with RunCheckpoints(run_dir(ckpt_root, run.uid), keep=3) as ckpt:
        assert ckpt.latest_step() == run.checkpoint_step


def test_resume_all_trains_the_queued_runs_of_a_killed_sweep(lab):
    url, _ = lab
    # three seeds of one rank: one compiled program serves the resumed run and both queued ones
    proc = _cli("sweep", *TINY, "--steps", "60", "--ranks", "4", "--seeds", "0,1,2", "--checkpoint-interval", "20")
    store = RunStore(url)
    wait_for(lambda: len(store.runs.list_runs()) == 3 and any(r.steps_done >= 10 for r in store.runs.list_runs()),
              what="the sweep to start")
    proc.send_signal(signal.SIGKILL)
    proc.wait(60)
    assert sorted(r.status for r in store.runs.list_runs()) == ["queued", "queued", "running"]
    assert main(["resume", "--all"]) == 0
    runs = store.runs.list_runs()
    assert [r.status for r in runs] == ["finished"] * 3
    for r in runs:
        steps = sorted(_val_losses(store, r.id))
        assert steps == [0, *range(20, 61, 20)]


def test_a_run_outlasts_a_write_lock_held_five_times_the_busy_timeout(lab, monkeypatch):
    """SQLite's busy timeout is shortened to 1 s (from ``BUSY_TIMEOUT_S``) so that a lock
    held 5 s outlasts it the way a 40 s lock outlasts the real 30 s: every write that times
    out is retried, and none is lost."""
    from storage import db as storage_db

    monkeypatch.setattr(storage_db, "BUSY_TIMEOUT_S", 1.0)
    url, _ = lab
    store = RunStore(url)
    config = RunConfig(preset="tiny", steps=120, eval_interval=2, probe_interval=0, val_batches=1)
    manager = jobs.JobManager(store)
    run_id = manager.submit(config)[0]
    wait_for(lambda: store.runs.get_run(run_id).steps_done >= 10, what="the run to start")
    blocker = sqlite3.connect(url.removeprefix("sqlite:///"), timeout=60, check_same_thread=False)
    blocker.execute("BEGIN IMMEDIATE")
    held = threading.Event()

    def release():
        time.sleep(5 * storage_db.BUSY_TIMEOUT_S)
        blocker.rollback()
        held.set()

    threading.Thread(target=release, daemon=True).start()
    assert manager.wait([run_id], timeout=900)
    manager.shutdown()
    assert held.is_set()
    run = store.runs.get_run(run_id)
    assert run.status == "finished", run.error
    steps = sorted(_val_losses(store, run_id))
    assert steps == [0, *range(2, 121, 2)]  # every record, none lost
    assert manager.writer.retries > 0  # the lock really was in the way


def test_run_ids_are_never_reused_after_a_delete(lab):
    url, _ = lab
    store = RunStore(url)
    ids = [store.runs.create_run(name=f"r{i}", config={}, estimator="basis", rank=4, lam=0.0, seed=0, preset="tiny",
                            steps=10, status="finished") for i in range(3)]
    store.runs.delete_run(ids[-1])
    new = store.runs.create_run(name="new", config={}, estimator="basis", rank=4, lam=0.0, seed=0, preset="tiny", steps=10)
    assert new == ids[-1] + 1


def _dump(url: str) -> list[str]:
    with sqlite3.connect(url.removeprefix("sqlite:///")) as con:
        lines = list(con.iterdump())
    con.close()
    return lines


def test_list_show_and_the_diagnoses_list_write_nothing(lab, capsys):
    """Reads leave a run and a diagnosis whose worker died as stored: marking them is the sweep's."""
    url, _ = lab
    store = RunStore(url)
    run_id = store.runs.create_run(name="dead", config={}, estimator="basis", rank=4, lam=0.0, seed=0, preset="tiny",
                              steps=10)
    assert store.queue.claim(run_id, f"{liveness.host_name()}:{dead_pid()}")
    diag_id = store.diagnostics.create_diagnostic(run_id, None)
    assert store.diagnostics.claim_diagnostic(diag_id, f"{liveness.host_name()}:{dead_pid()}")
    before = _dump(url)
    assert main(["list"]) == 0 and main(["show", str(run_id)]) == 0 and main(["diagnose", "--list"]) == 0
    assert "running" in capsys.readouterr().out
    assert _dump(url) == before
    assert liveness.sweep(store) == [run_id] and _dump(url) != before  # what the reads left to the sweep
    assert store.frames.diagnostics_frame()["status"].tolist() == ["interrupted"]


@pytest.mark.parametrize("command", [["list"], ["show", "1"], ["export", "--out", "x.csv"], ["cancel", "1"],
                                     ["resume", "--all"], ["workers"]])
def test_read_only_commands_on_a_missing_database_create_nothing(tmp_path, capsys, command):
    missing = tmp_path / "typo" / "lab.db"
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    cwd = os.getcwd()
    os.chdir(out_dir)
    try:
        assert main([*command, "--db", str(missing)]) == 2
    finally:
        os.chdir(cwd)
    err = capsys.readouterr().err
    assert str(missing) in err and "BASIS_LAB_DB_URL" in err and len(err.strip().splitlines()) == 1
    assert not missing.parent.exists() and not any(out_dir.iterdir())


@pytest.mark.parametrize("argv, message", [
    (["run", "--seed", "99999999999999999999"], "seed must be an integer in [0, 4294967296)"),
    (["run", "--preset", "tiny", "--checkpoint-interval", "0"], "checkpoint_interval must be an integer >= 1"),
    (["resume"], "name the runs to resume"),
    (["worker", "--concurrent", "0"], "--concurrent must be >= 1"),
])
def test_bad_input_is_one_line_and_writes_nothing(lab, capsys, argv, message):
    url, _ = lab
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert RunStore(url).runs.list_runs() == []


def test_cancel_on_a_run_that_is_not_active_says_so(lab, capsys):
    url, _ = lab
    store = RunStore(url)
    run_id = store.runs.create_run(name="done", config={}, estimator="basis", rank=4, lam=0.0, seed=0, preset="tiny",
                              steps=10, status="finished")
    assert main(["cancel", str(run_id)]) == 0
    assert "not active (finished); nothing to cancel" in capsys.readouterr().out
    assert store.runs.get_run(run_id).status == "finished"


def test_delete_removes_a_run_its_metrics_and_its_checkpoints(lab, capsys):
    url, ckpt_root = lab
    assert main(["run", *TINY, "--steps", "4", "--eval-interval", "2"]) == 0
    store = RunStore(url)
    run = store.runs.list_runs()[0]
    assert run_dir(ckpt_root, run.uid).is_dir()
    assert main(["delete", str(run.id)]) == 0
    assert store.runs.list_runs() == [] and store.metrics([run.id]).empty
    assert not run_dir(ckpt_root, run.uid).exists()


def test_resume_names_the_step_it_used_when_the_recorded_checkpoint_is_refused(lab, capsys):
    """The database records step 4, whose checkpoint is damaged: ``resume`` announces the run
    without a step, then names step 2, the checkpoint it actually read, and the refusal."""
    url, ckpt_root = lab
    assert main(["run", *TINY, "--steps", "4", "--eval-interval", "2", "--checkpoint-interval", "2"]) == 0
    store = RunStore(url)
    run = store.runs.list_runs()[0]
    assert run.checkpoint_step == 4
    store.runs.set_status(run.id, "interrupted", error="a crash after its last checkpoint")
    step_dir = run_dir(ckpt_root, run.uid) / f"epoch-{run.epoch}" / "4"
    big = max((p for p in (step_dir / "state").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    big.write_bytes(big.read_bytes()[: big.stat().st_size // 3])  # a torn write
    capsys.readouterr()
    assert main(["resume", str(run.id)]) == 0
    err = capsys.readouterr().err
    assert f"run {run.id} {run.name}: resuming from its newest readable checkpoint\n" in err
    assert "step 4" not in err.split("refused:")[0]  # never announced as the step it resumes from
    assert f"run {run.id}: resumed from the checkpoint at step 2; refused: checkpoint at step 4 of run {run.id}" in err
    assert store.runs.get_run(run.id).status == "finished"


def _steps_on_disk(folder: Path) -> set[str]:
    """``epoch-E/step`` of every checkpoint step folder under a run's folder."""
    return {f"{p.parent.name}/{p.name}" for p in folder.glob("epoch-*/*") if p.name.isdigit()}


def test_a_backup_never_deletes_or_prunes_the_checkpoints_of_the_database_it_copies(lab, capsys):
    """``engine backup copy.db``, then the copy resumes run 1 from step 4 (a checkpoint the
    live database wrote) and deletes it: the live database's checkpoints are all still
    there, the copy read them, wrote its own elsewhere, and trained the same numbers."""
    from storage.backup import backup

    url, ckpt_root = lab
    live = RunStore(url)
    config = RunConfig(preset="tiny", steps=6, eval_interval=2, probe_interval=0, val_batches=1,
                       checkpoint_interval=2, checkpoint_keep=2)
    manager = jobs.JobManager(live)
    try:
        run_id = manager.submit(config)[0]
        assert manager.wait([run_id], timeout=900)
    finally:
        manager.shutdown()
    run = live.runs.get_run(run_id)
    assert run.status == "finished" and run.checkpoint_step == 6
    live_folder = run_dir(ckpt_root, run.uid)
    kept = _steps_on_disk(live_folder)
    assert kept == {f"epoch-{run.epoch}/4", f"epoch-{run.epoch}/6"}

    backup(live, ckpt_root.parent / "copy.db")
    copy = RunStore(f"sqlite:///{ckpt_root.parent / 'copy.db'}", create=False)
    copy.runs.set_checkpoint_step(run_id, 4)  # as if the copy had been taken at step 4
    copy.runs.set_status(run_id, "interrupted", error="restored from a backup")
    manager = jobs.JobManager(copy)
    try:
        assert manager.resume([run_id]) == [run_id]
        assert manager.wait([run_id], timeout=900)
    finally:
        manager.shutdown()
    resumed = copy.runs.get_run(run_id)
    assert resumed.status == "finished" and "resumed from the checkpoint at step 4" in resumed.notes, resumed.error
    assert trajectory(copy, run_id) == trajectory(live, run_id)
    assert _steps_on_disk(live_folder) == kept  # nothing pruned

    assert main(["delete", str(run_id), "--db", str(ckpt_root.parent / "copy.db")]) == 0
    assert _steps_on_disk(live_folder) == kept  # the copy deleted only its own
    assert live.runs.get_run(run_id).checkpoint_step == 6
    assert copy.identities.identity().ancestors == (live.identities.identity().uid,) and copy.identities.identity().uid != live.identities.identity().uid
    own = ckpt_root / f"db-{copy.identities.identity().uid}" / f"run-{run.uid}"
    assert not own.exists() and not own.parent.exists()  # where the copy wrote its checkpoint of step 6: gone, emptied
    assert main(["delete", str(run_id)]) == 0
    assert not live_folder.exists()
    copy.close()
    live.close()


def test_a_resume_after_a_kill_before_any_heartbeat_stores_each_metric_once(lab):
    """The owner died right after writing step 0's rows, before its first heartbeat or
    checkpoint (steps_done 0, no checkpoint_step): the resume restarts from step 0 and
    replaces those rows instead of adding a second copy of each."""
    url, _ = lab
    store = RunStore(url)
    config = RunConfig(preset="tiny", steps=2, eval_interval=2, probe_interval=0, val_batches=1)
    [run_id] = jobs.queue_runs(store, [config], env={"versions": {}, "git_commit": None, "device": "cpu"})
    store.queue.claim(run_id, "gone:1", "gone:1:w")
    stale = [(0, 0.1, "val_loss", 123.0), (0, 0.1, "mem_saved_bytes", 1.0)]  # the dead owner's step-0 rows
    store.metrics.add_metrics(run_id, stale)
    store.runs.set_status(run_id, "interrupted", error="its process died")
    assert (store.runs.get_run(run_id).steps_done, store.runs.get_run(run_id).checkpoint_step) == (0, None)
    manager = jobs.JobManager(store)
    try:
        assert manager.resume([run_id]) == [run_id]
        assert manager.wait([run_id], timeout=900)
    finally:
        manager.shutdown()
    assert store.runs.get_run(run_id).status == "finished"
    values = trajectory(store, run_id)  # asserts no (step, metric) twice
    assert values[(0, "val_loss")] != 123.0 and values[(0, "mem_saved_bytes")] != 1.0  # rewritten, not kept
    assert {step for step, _ in values} == {0, 2}
