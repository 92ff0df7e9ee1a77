"""Cohorts through the real worker path (``engine.runner.cohorts``), forced on the CPU.

A worker that forms cohorts claims a sweep's seeds of one setup together, each under its own
lease, and trains them as one program; each stays a run of its own (its row, metrics, status,
checkpoints), a cancelled member stops alone and resumes (alone or in a cohort) from its own
checkpoints, and every member's results are its single run's.
"""

from __future__ import annotations

import time

import pytest

import engine.runner.cohorts as cohorts_mod
from engine.config import ConfigError, RunConfig
from engine.runner.jobs import JobManager
from engine.runner.paths import run_folders
from engine.runner.queueing import queue_runs
from engine.training.cohort import cohorts_pay
from engine.training.loop import train

RUN = RunConfig(preset="tiny", estimator="basis", steps=6, eval_interval=2, probe_interval=2, val_batches=2,
                val_tokens=4096, interim_val_batches=1, rank=4)
_FINAL: dict[int, float] = {}


def _single_val_loss(seed: int) -> float:
    if seed not in _FINAL:
        _FINAL[seed] = [r for r in train(RUN.replace(seed=seed))][-1].values["val_loss"]
    return _FINAL[seed]


@pytest.fixture
def formed(monkeypatch):
    """The sizes of the cohorts trained, in order."""
    sizes: list[int] = []

    class Recorded(cohorts_mod.Cohort):
        def __init__(self, configs, **kwargs):
            sizes.append(len(configs))
            super().__init__(configs, **kwargs)

    monkeypatch.setattr(cohorts_mod, "Cohort", Recorded)
    return sizes


def _wait_ended(store, ids, timeout=300.0):
    deadline = time.monotonic() + timeout
    while any(store.runs.get_run(i).status in ("queued", "running") for i in ids):
        assert time.monotonic() < deadline, [store.runs.get_run(i).status for i in ids]
        time.sleep(0.1)


def _final_val_loss(store, run_id: int) -> float:
    m = store.metrics([run_id])
    rows = m[m.name == "val_loss"]
    return float(rows.loc[rows.step.idxmax(), "value"])


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_worker_claims_a_sweeps_seeds_together_and_a_cancelled_member_stops_alone(store, tmp_path, formed):
    configs = [RUN.replace(seed=s) for s in (0, 1, 2)] + [RUN.replace(estimator="exact", seed=0)]
    ids = queue_runs(store, configs, sweep_id="s1")
    manager: JobManager
    cancelled: list[int] = []

    def on_step(run_id, step, loss):
        if run_id == ids[2] and step >= 2 and not cancelled:
            cancelled.append(step)
            manager.cancel(run_id)

    manager = JobManager(store, pull=True, cohorts="on", checkpoints=tmp_path / "ckpt", on_step=on_step)
    try:
        _wait_ended(store, ids)
        runs = [store.runs.get_run(i) for i in ids]
        assert [r.status for r in runs] == ["finished", "finished", "cancelled", "finished"]
        assert formed == [3]  # the three BASIS seeds together; exact, alone in its setup, trained alone
        assert all(r.epoch == 1 and r.worker_id == manager.worker_id for r in runs)  # one claim each
        assert max(r.started_at for r in runs[:3]) < min(r.finished_at for r in runs[:3])
        assert runs[2].steps_done == 2 and runs[2].checkpoint_step == 2
        metrics = store.metrics(ids[:3])
        for run_id, steps in zip(ids, ({0, 2, 4, 6}, {0, 2, 4, 6}, {0, 2})):
            mine = metrics[metrics.run_id == run_id]
            assert set(mine.loc[mine.name == "val_loss", "step"]) == steps
        assert set(metrics.loc[metrics.name == "time/train_s", "run_id"]) == set(ids[:2])
        for run in runs[:3]:  # each in its own folder, under its own lease
            assert (run_folders(store, run.uid, tmp_path / "ckpt").own / "epoch-1").is_dir()
        for i, seed in ((0, 0), (1, 1)):
            assert _final_val_loss(store, ids[i]) == pytest.approx(_single_val_loss(seed), rel=1e-5)

        assert manager.resume([ids[2]]) == [ids[2]]  # alone now: from the checkpoint its member saved
        manager.wait([ids[2]], timeout=300)
        run = store.runs.get_run(ids[2])
        assert run.status == "finished" and "resumed from the checkpoint at step 2" in run.notes
        assert _final_val_loss(store, ids[2]) == pytest.approx(_single_val_loss(2), rel=1e-5)
        assert formed == [3]
    finally:
        manager.shutdown()


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_an_interrupted_cohort_of_its_own_runs_resumes_as_a_cohort(store, tmp_path, formed):
    configs = [RUN.replace(seed=s) for s in (0, 1)]
    seen: dict[int, int] = {}
    manager: JobManager

    def on_step(run_id, step, loss):
        seen[run_id] = step
        if step >= 3:
            manager.interrupt()

    manager = JobManager(store, cohorts="on", checkpoints=tmp_path / "ckpt", on_step=on_step)
    ids = manager.submit(configs)
    manager.wait(ids, timeout=300)
    manager.shutdown()
    runs = [store.runs.get_run(i) for i in ids]
    assert [r.status for r in runs] == ["interrupted", "interrupted"] and formed == [2]
    assert [r.checkpoint_step for r in runs] == [3, 3]

    again = JobManager(store, cohorts="on", checkpoints=tmp_path / "ckpt")
    try:
        assert again.resume(ids) == ids
        again.wait(ids, timeout=300)
    finally:
        again.shutdown()
    runs = [store.runs.get_run(i) for i in ids]
    assert [r.status for r in runs] == ["finished", "finished"] and formed == [2, 2]
    assert all("resumed from the checkpoint at step 3" in r.notes for r in runs)
    for run_id, seed in zip(ids, (0, 1)):
        assert _final_val_loss(store, run_id) == pytest.approx(_single_val_loss(seed), rel=1e-5)


def test_cohorts_are_on_where_they_pay_unless_set(monkeypatch):
    monkeypatch.delenv(cohorts_mod.ENV, raising=False)
    assert cohorts_mod.resolve() == "auto" and cohorts_mod.resolve("OFF") == "off"
    monkeypatch.setenv(cohorts_mod.ENV, "on")
    assert cohorts_mod.resolve() == "on" and cohorts_mod.resolve("off") == "off"
    with pytest.raises(ConfigError, match="auto, on, off"):
        cohorts_mod.resolve("sometimes")
    assert cohorts_pay("gpu") and not cohorts_pay("cpu")


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_member_whose_lease_another_claim_took_stops_and_the_others_train_on(store, tmp_path, formed):
    """Exactly once: run 2 is declared stale and requeued to another owner mid-cohort (its lease
    moves on); its member stops at its next poll or write, writing nothing more, alone."""
    ids = queue_runs(store, [RUN.replace(seed=s) for s in (0, 1)], sweep_id="s2")
    taken: list[int] = []
    manager: JobManager

    def on_step(run_id, step, loss):
        if run_id == ids[1] and step == 2 and not taken:
            store.runs.mark_interrupted({run_id: "silent"})
            taken.extend(store.queue.requeue([run_id], owner="elsewhere:1"))

    manager = JobManager(store, pull=True, cohorts="on", checkpoints=tmp_path / "ckpt", on_step=on_step)
    try:
        _wait_ended(store, ids[:1])
        deadline = time.monotonic() + 60
        while ids[1] not in manager.lost:
            assert time.monotonic() < deadline
            time.sleep(0.1)
    finally:
        manager.shutdown()
    first, second = store.runs.get_run(ids[0]), store.runs.get_run(ids[1])
    assert formed == [2] and taken == [ids[1]]
    assert first.status == "finished" and _final_val_loss(store, ids[0]) == pytest.approx(_single_val_loss(0), rel=1e-5)
    assert (second.status, second.owner, second.epoch) == ("queued", "elsewhere:1", 2)
    assert second.checkpoint_step is None  # its member saved nothing under the lost lease


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_cohort_whose_training_fails_fails_each_member_and_the_worker_goes_on(store, tmp_path, monkeypatch):
    def broken(configs, **kwargs):
        raise RuntimeError("no device for it")

    monkeypatch.setattr(cohorts_mod, "Cohort", broken)
    ids = queue_runs(store, [RUN.replace(seed=s) for s in (0, 1)], sweep_id="s3")
    manager = JobManager(store, pull=True, cohorts="on", checkpoints=tmp_path / "ckpt")
    try:
        _wait_ended(store, ids, timeout=60)
    finally:
        manager.shutdown()
    for run in map(store.runs.get_run, ids):
        assert run.status == "failed" and "the cohort that trained this run failed: no device for it" in run.error
