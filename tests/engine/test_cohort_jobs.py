"""Cohorts through the real worker path (``engine.runner.cohorts``), forced on the CPU.

A worker that forms cohorts claims a sweep's seeds of one setup together, in one transaction,
each under its own lease (a seed claimed elsewhere meanwhile is no member), and trains them as
one program (a tuning campaign's trials of one method too: they differ by learning rate); each
stays a run of its own (its row, metrics, status, checkpoints), a cancelled
member stops alone and resumes (alone or in a cohort) from its own checkpoints, and every
member's results are its single run's.
"""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import event

import engine.runner.cohorts as cohorts_mod
from engine.config import ConfigError, RunConfig
from engine.runner import liveness
from engine.runner.jobs import JobManager
from engine.runner.paths import run_folders
from engine.runner.queueing import queue_runs
from engine.training.cohort import cohorts_pay
from engine.training.loop import train
from storage import StorageError
from tests.support.runs import wait_for

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


def _claims(store, monkeypatch, take_elsewhere=(), skipped_by=None):
    """Record each ``claim_many`` (its ids, and the commits its own thread made during it) and
    each single ``claim``; before the first ``claim_many`` runs, claim ``take_elsewhere`` for
    another process (and have ``skipped_by``, a ``Cohorts``, skip them as a worker thread would)."""
    many: list[tuple[list[int], int]] = []
    singles: list[int] = []
    commits: dict[int, int] = {}
    event.listen(store.engine, "commit",
                 lambda conn: commits.__setitem__(threading.get_ident(), commits.get(threading.get_ident(), 0) + 1))
    real_many, real_one = store.queue.claim_many, store.queue.claim

    def claim_many(run_ids, owner, worker_id=None, **kwargs):
        run_ids = list(run_ids)
        if not many:
            for run_id in take_elsewhere:
                assert real_one(run_id, "elsewhere:1") == 1
                if skipped_by is not None:
                    assert skipped_by.skip(run_id)
        before = commits.get(threading.get_ident(), 0)
        leases = real_many(run_ids, owner, worker_id, **kwargs)
        many.append((run_ids, commits.get(threading.get_ident(), 0) - before))
        return leases

    def claim(run_id, owner, worker_id=None):
        singles.append(run_id)
        return real_one(run_id, owner, worker_id)

    monkeypatch.setattr(store.queue, "claim_many", claim_many)
    monkeypatch.setattr(store.queue, "claim", claim)
    return many, singles


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_cohort_is_claimed_in_one_transaction_and_a_seed_claimed_elsewhere_meanwhile_is_no_member(
        store, tmp_path, formed, monkeypatch):
    ids = queue_runs(store, [RUN.replace(seed=s) for s in (0, 1, 2, 3)], sweep_id="s4")
    many, singles = _claims(store, monkeypatch, take_elsewhere=[ids[2]])
    manager = JobManager(store, pull=True, cohorts="on", checkpoints=tmp_path / "ckpt")
    try:
        _wait_ended(store, [ids[0], ids[1], ids[3]])
        assert manager.wait([ids[0], ids[1], ids[3]], timeout=60)
    finally:
        manager.shutdown()
    # the lead by claim_next, its three siblings together: one call, one commit, no single claim
    assert many == [([ids[1], ids[2], ids[3]], 1)] and singles == []
    assert formed == [3]
    for run_id, seed in ((ids[0], 0), (ids[1], 1), (ids[3], 3)):
        run = store.runs.get_run(run_id)
        assert (run.status, run.epoch, run.worker_id) == ("finished", 1, manager.worker_id)
        assert _final_val_loss(store, run_id) == pytest.approx(_single_val_loss(seed), rel=1e-5)
    taken = store.runs.get_run(ids[2])  # trained by no one here: still the other process's
    assert (taken.status, taken.owner, taken.epoch, taken.steps_done) == ("running", "elsewhere:1", 1, 0)
    assert manager.started_runs == 3 and ids[2] not in manager.pending()


def _idle_manager(store, tmp_path, ids):
    """A manager (no pull) whose own queue holds ``ids`` as ``_enqueue`` would mark them, none
    handed to its worker thread yet: ``Cohorts.gather`` is called by the test itself."""
    manager = JobManager(store, cohorts="on", checkpoints=tmp_path / "ckpt")
    with manager._lock:
        for run_id in ids:
            manager._pending.add(run_id)
            manager._events.setdefault(run_id, threading.Event())
    return manager


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_the_lead_and_its_siblings_are_claimed_together_and_what_was_not_is_left_to_its_worker(
        store, tmp_path, monkeypatch):
    ids = queue_runs(store, [RUN.replace(seed=s) for s in (0, 1, 2, 3)], sweep_id="s5",
                     owner=liveness.current_owner())
    manager = _idle_manager(store, tmp_path, ids)
    many, singles = _claims(store, monkeypatch, take_elsewhere=[ids[2]], skipped_by=manager.cohorts)
    try:
        members = manager.cohorts.gather(ids[0], None)
        assert members == [(ids[0], 1), (ids[1], 1), (ids[3], 1)]
        assert many == [(ids, 1)] and singles == []
        assert manager.cohorts.taken == {ids[1], ids[3]}  # their worker thread skips them: they train here
        # the sibling its worker thread had skipped, handed back, is tried alone: claimed elsewhere,
        # it ends here untrained; a member reaching its worker thread is skipped (its cohort trains it)
        manager._queue.put(ids[1])
        assert manager.wait([ids[2]], timeout=60) and singles == [ids[2]]
        wait_for(lambda: manager.cohorts.taken == {ids[3]}, timeout=60, what="the member skipped")
        assert [store.runs.get_run(i).owner for i in ids] == [manager.owner] * 2 + ["elsewhere:1", manager.owner]
    finally:
        manager.shutdown()


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_lead_not_claimed_claims_no_sibling_and_a_failed_claim_undoes_every_mark(store, tmp_path, monkeypatch):
    ids = queue_runs(store, [RUN.replace(seed=s) for s in (0, 1, 2)], sweep_id="s6", owner=liveness.current_owner())
    manager = _idle_manager(store, tmp_path, ids)
    many, _ = _claims(store, monkeypatch, take_elsewhere=[ids[0]])
    try:
        assert manager.cohorts.gather(ids[0], None) is None  # the lead was taken: no member is
        assert many == [(ids, 1)] and manager.cohorts.taken == set()
        assert [store.runs.get_run(i).status for i in ids[1:]] == ["queued", "queued"]

        def broken(*args, **kwargs):
            raise StorageError("database is locked")

        monkeypatch.setattr(store.queue, "claim_many", broken)
        with manager._lock:
            before = (manager.started_runs, set(manager._pending))
        assert manager.cohorts.gather(ids[1], 7) is None  # the caller trains ids[1] alone, under its lease
        assert manager.cohorts.taken == set()
        with manager._lock:
            assert (manager.started_runs, set(manager._pending)) == before
    finally:
        manager.shutdown()


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_campaigns_trials_of_one_method_train_as_one_cohort_each_at_its_learning_rate(store, tmp_path, formed):
    """[fair]'s trials differ by learning rate: the optimizer takes it as data, so a method's
    trials (3 points × 1 tuning seed) are one cohort; each ends with its single run's loss."""
    from engine.config.sweep import Sweep
    from engine.config.tuning import Range, TuneSpec
    from engine.runner import campaigns

    spec = TuneSpec(Sweep(RUN, estimators=("basis",), ranks=(4,)), (Range("lr", 0.002, 0.05),), 3, (0,), (1,))
    _, ids = campaigns.start(store, spec)
    manager = JobManager(store, pull=True, cohorts="on", checkpoints=tmp_path / "ckpt", max_runs=3)
    try:
        _wait_ended(store, ids)
    finally:
        manager.shutdown()
    runs = [store.runs.get_run(i) for i in ids]
    assert [r.status for r in runs] == ["finished"] * 3 and formed[0] == 3
    configs = [RunConfig.from_dict(r.config) for r in runs]
    assert len({c.lr for c in configs}) == 3 and len({c.cohort() for c in configs}) == 1
    for run, config in zip(runs, configs):
        single = [r for r in train(config)][-1].values["val_loss"]
        assert _final_val_loss(store, run.id) == pytest.approx(single, rel=1e-5)
