"""Many workers share one database: each queued run is trained exactly once, a worker
killed mid-run is replaced by another that resumes its run, workers are visible."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from engine.cli.main import main
from engine.config import RunConfig
from engine.runner import jobs, liveness
from storage import RunStore
from tests.support.runs import dead_pid, wait_for

ROOT = Path(__file__).resolve().parents[2]
QUICK = RunConfig(preset="tiny", steps=10, eval_interval=5, probe_interval=0, val_batches=1, checkpoint_interval=5)


def _worker(url: str, ckpt: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "BASIS_LAB_CHECKPOINTS": str(ckpt)}
    return subprocess.Popen([sys.executable, "-m", "engine", "worker", "--db", url, *extra], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _steps(store: RunStore, run_id: int) -> list[int]:
    return store.metrics([run_id], names=["val_loss"])["step"].tolist()


def _race(url: str, ckpt: Path, workers: int, runs: int) -> RunStore:
    store = RunStore(url)
    ids = jobs.queue_runs(store, [QUICK.replace(seed=s) for s in range(runs)])
    procs = [_worker(url, ckpt, "--idle-exit", "8") for _ in range(workers)]
    for p in procs:
        out, _ = p.communicate(timeout=1500)
        assert p.returncode == 0, out
    runs_ = [store.runs.get_run(i) for i in ids]
    assert [r.status for r in runs_] == ["finished"] * runs
    for r in runs_:
        assert _steps(store, r.id) == [0, 5, 10]  # trained once: no step twice, none missing
        assert "resumed" not in r.notes and "restarted" not in r.notes
    owners = {r.owner for r in runs_}
    assert len(owners) <= workers and all(o for o in owners)
    return store


@pytest.mark.postgres
def test_three_workers_train_six_queued_runs_once_each_on_postgresql(pg_url, tmp_path):
    store = _race(pg_url, tmp_path / "ckpt", workers=3, runs=6)  # two a worker: each claim races the others
    assert len(store.workers.list_workers()) == 3 and {w.status for w in store.workers.list_workers()} == {"stopped"}


def test_two_workers_race_on_sqlite(tmp_path):
    _race(f"sqlite:///{tmp_path / 'lab.db'}", tmp_path / "ckpt", workers=2, runs=4)


def test_a_killed_worker_is_replaced_and_its_run_resumes_from_its_checkpoint(db_url, tmp_path):
    store = RunStore(db_url)
    long = QUICK.replace(steps=100, eval_interval=20, checkpoint_interval=20)
    run_id = jobs.queue_runs(store, [long])[0]
    ckpt = tmp_path / "shared-ckpt"
    first = _worker(db_url, ckpt, "--max-runs", "1")
    wait_for(lambda: (store.runs.get_run(run_id).checkpoint_step or 0) >= 40, what="a checkpoint at step 40")
    owner = store.runs.get_run(run_id).owner
    assert owner.endswith(f":{first.pid}")
    first.send_signal(signal.SIGKILL)
    first.wait(60)
    second = _worker(db_url, ckpt, "--idle-exit", "5")
    out, _ = second.communicate(timeout=1500)
    assert second.returncode == 0, out
    run = store.runs.get_run(run_id)
    assert run.status == "finished" and run.owner.endswith(f":{second.pid}")
    assert "resumed from the checkpoint at step" in run.notes
    assert _steps(store, run_id) == [0, *range(20, 101, 20)]


def test_without_the_checkpoints_a_replacement_restarts_from_zero_and_says_why(tmp_path):
    url = f"sqlite:///{tmp_path / 'lab.db'}"
    store = RunStore(url)
    run_id = jobs.queue_runs(store, [QUICK.replace(steps=80, eval_interval=20, checkpoint_interval=20)])[0]
    first = _worker(url, tmp_path / "machine-a")
    wait_for(lambda: (store.runs.get_run(run_id).checkpoint_step or 0) >= 20, what="a checkpoint at step 20")
    first.send_signal(signal.SIGKILL)
    first.wait(60)
    second = _worker(url, tmp_path / "machine-b", "--idle-exit", "5")  # another machine's disk
    out, _ = second.communicate(timeout=1500)
    assert second.returncode == 0, out
    run = store.runs.get_run(run_id)
    assert run.status == "finished" and "restarted from step 0" in run.notes
    assert _steps(store, run_id) == [0, *range(20, 81, 20)]


def test_sigterm_stops_a_worker_and_leaves_its_run_resumable(tmp_path):
    url = f"sqlite:///{tmp_path / 'lab.db'}"
    store = RunStore(url)
    run_id = jobs.queue_runs(store, [QUICK.replace(steps=5000, eval_interval=50)])[0]
    worker = _worker(url, tmp_path / "ckpt")
    wait_for(lambda: store.runs.get_run(run_id).steps_done >= 20, what="the run to train")
    worker.send_signal(signal.SIGTERM)
    out, _ = worker.communicate(timeout=300)
    assert worker.returncode == 128 + signal.SIGTERM, out
    run = store.runs.get_run(run_id)
    assert run.status == "interrupted" and run.checkpoint_step is not None and run.interruption_cause == "signal"
    assert liveness.requeue_orphaned_runs(store) == []  # stopped on purpose: not taken by another worker
    assert [w.status for w in store.workers.list_workers()] == ["stopped"]


def test_a_workers_heartbeat_marks_a_stale_run_interrupted(db_url):
    """A run and a diagnosis whose process died after a job manager started are marked
    ``interrupted`` by that manager's heartbeat (no reader, no claim: it pulls nothing);
    the run's cause is ``stale``, so any worker may take it again."""
    store = RunStore(db_url)
    manager = jobs.JobManager(store)
    try:
        run_id = store.runs.create_run(name="dead", config=QUICK.to_dict(), estimator="basis", rank=4, lam=0.0, seed=0,
                                  preset="tiny", steps=10)
        assert store.queue.claim(run_id, f"{liveness.host_name()}:{dead_pid()}")
        diag_id = store.diagnostics.create_diagnostic(run_id, None)
        assert store.diagnostics.claim_diagnostic(diag_id, f"{liveness.host_name()}:{dead_pid()}")
        wait_for(lambda: store.runs.get_run(run_id).status == "interrupted", timeout=300, what="the heartbeat's sweep")
        run = store.runs.get_run(run_id)
        assert run.interruption_cause == "stale" and "no longer running" in run.error
        wait_for(lambda: store.frames.diagnostics_frame()["status"].tolist() == ["interrupted"], timeout=300,
                 what="the diagnosis swept")
        assert liveness.requeue_orphaned_runs(store) == [run_id]
        assert store.runs.get_run(run_id).status == "queued" and store.runs.get_run(run_id).interruption_cause is None
    finally:
        manager.shutdown()
        store.close()


def test_queue_only_runs_wait_for_a_worker_and_an_owned_queue_is_not_claimed(db_url, capsys):
    assert main(["sweep", "--db", db_url, "--preset", "tiny", "--ranks", "exact,2", "--steps", "5", "--queue-only",
                 "--tags", "pilot,fleet"]) == 0
    assert "queued 2 run(s) for workers" in capsys.readouterr().out
    store = RunStore(db_url)
    runs = store.runs.list_runs()
    assert [r.status for r in runs] == ["queued", "queued"] and all(r.owner is None for r in runs)
    assert {r.sweep_id for r in runs} != {None} and len({r.sweep_id for r in runs}) == 1
    assert all(r.tags == ["pilot", "fleet"] for r in runs)
    owned = store.runs.create_run(name="mine", config=QUICK.to_dict(), estimator="basis", rank=4, lam=0.0, seed=0,
                             preset="tiny", steps=10, owner=liveness.current_owner())
    claimed = [store.queue.claim_next("host:1"), store.queue.claim_next("host:2"), store.queue.claim_next("host:3")]
    assert claimed == [(runs[0].id, 1), (runs[1].id, 1), None] and store.runs.get_run(owned).status == "queued"


def test_orphaned_queued_runs_are_released_and_workers_listed(db_url, capsys):
    store = RunStore(db_url)
    host = liveness.current_owner().rsplit(":", 1)[0]
    orphan = store.runs.create_run(name="orphan", config={}, estimator="basis", rank=4, lam=0.0, seed=0, preset="tiny",
                              steps=10, owner=f"{host}:999999")
    mine = store.runs.create_run(name="mine", config={}, estimator="basis", rank=4, lam=0.0, seed=0, preset="tiny",
                            steps=10, owner=liveness.current_owner())
    assert liveness.release_orphans(store, 60) == [orphan]
    assert store.runs.get_run(orphan).owner is None and store.runs.get_run(mine).owner == liveness.current_owner()
    store.workers.register_worker("w-gone", host, 999999, device="cpu: cpu")
    store.workers.register_worker("w-live", host, os.getpid(), device="cpu: cpu")
    store.workers.worker_heartbeat("w-live", mine)
    assert main(["workers", "--db", db_url]) == 0
    out = capsys.readouterr().out
    line = {l.split()[0]: l for l in out.splitlines()[1:]}
    assert line["w-gone"].split()[1] == "gone" and line["w-live"].split()[1] == "active"
    assert "<NA>" not in out and line["w-gone"].split()[-5] == "-"  # an idle worker's run (before two timestamps)
