"""Background runs on SQLite and on PostgreSQL (the ``store``/``db_url`` fixtures of
conftest.py): concurrency, cancel, failure, stale rows."""

import dataclasses
import re
import threading
import time

import numpy as np
import pytest

from engine.config import RunConfig
from engine.runner.jobs import JobManager
from storage import MetricsFeed, RunStore

TINY = RunConfig(preset="tiny", steps=40, eval_interval=2, probe_interval=4, val_batches=2, rank=4)


def test_two_parallel_runs_and_a_reader_lose_nothing(store, db_url):
    manager = JobManager(store, max_concurrent=2)
    ids = manager.submit([TINY, dataclasses.replace(TINY, estimator="exact")])
    reader = RunStore(db_url)
    seen, errors, done = {}, [], threading.Event()

    feed = MetricsFeed()

    def read():
        try:
            while not done.is_set():
                for row in feed.poll(reader, ids).itertuples():
                    assert row.id not in seen, "a row was read twice"
                    seen[row.id] = (row.run_id, row.step, row.name, row.value)
                time.sleep(0.01)
        except Exception as e:  # pragma: no cover - the assertion below reports it
            errors.append(e)

    t = threading.Thread(target=read)
    t.start()
    running_together = False
    while manager.pending():
        running_together |= sum(r.status == "running" for r in store.runs.list_runs()) == 2
        time.sleep(0.05)
    manager.wait(ids)
    done.set(), t.join()
    manager.shutdown()
    assert not errors
    assert running_together
    assert [store.runs.get_run(i).status for i in ids] == ["finished", "finished"]
    final = store.metrics(ids)
    last = feed.poll(reader, ids)
    assert not set(seen) & set(last["id"]) and set(seen) | set(last["id"]) == set(final["id"])
    for run_id in ids:
        steps = set(final.loc[(final.run_id == run_id) & (final.name == "val_loss"), "step"])
        assert steps == {0, *range(2, 41, 2)}
        assert store.runs.get_run(run_id).steps_done == 40
    probes = final[final.name == "cos_mean"]
    for run_id in ids:
        assert set(probes.loc[probes.run_id == run_id, "step"]) == set(range(4, 41, 4))
    rss = final[final.name == "sys/rss_mib"]  # the system metrics are stored with every record
    for run_id in ids:
        assert set(rss.loc[rss.run_id == run_id, "step"]) == {0, *range(2, 41, 2)}
    assert (rss["value"] > 0).all()
    exact_cos = probes.loc[probes.run_id == ids[1], "value"]
    assert exact_cos.sub(1.0).abs().max() < 1e-5  # exact against exact: the reference line
    assert probes.loc[probes.run_id == ids[0], "value"].max() < 0.999


def test_cancel_mid_run_keeps_metrics(store):
    steps_seen = []
    manager = JobManager(store, on_step=lambda run_id, step, loss: steps_seen.append(step))
    [run_id] = manager.submit(dataclasses.replace(TINY, steps=100_000))
    while len(steps_seen) < 10:
        time.sleep(0.01)
    assert manager.cancel(run_id)
    assert manager.wait([run_id], timeout=60)
    run = store.runs.get_run(run_id)
    assert run.status == "cancelled" and run.finished_at is not None
    kept = store.metrics([run_id], names=["val_loss"])
    assert len(kept) >= 5 and kept["step"].max() <= run.steps_done
    assert run.steps_done < 100_000
    manager.shutdown()


def test_cancel_from_another_process_through_the_database(store, db_url):
    steps_seen = []
    manager = JobManager(store, on_step=lambda run_id, step, loss: steps_seen.append(step))
    [run_id] = manager.submit(dataclasses.replace(TINY, steps=100_000))
    while len(steps_seen) < 5:
        time.sleep(0.01)
    other = RunStore(db_url)  # e.g. the CLI's `cancel`
    assert other.runs.request_cancel(run_id)
    assert manager.wait([run_id], timeout=60)
    assert store.runs.get_run(run_id).status == "cancelled"
    manager.shutdown()


def test_cancel_while_queued_never_starts(store):
    manager = JobManager(store, max_concurrent=1)
    first, second = manager.submit([dataclasses.replace(TINY, steps=30), TINY])
    manager.cancel(second)
    manager.wait()
    assert store.runs.get_run(second).status == "cancelled"
    assert store.runs.get_run(second).started_at is None
    assert store.metrics([second]).empty
    assert store.runs.get_run(first).status == "finished"
    manager.shutdown()


def test_forced_nan_fails_with_the_reason_and_keeps_metrics(store):
    manager = JobManager(store)
    [run_id] = manager.submit(dataclasses.replace(TINY, estimator="exact", lr=1e12, eval_interval=20))
    manager.wait()
    run = store.runs.get_run(run_id)
    assert run.status == "failed"
    assert "training loss became" in run.error and "lower lr" in run.error
    # the steps it shows done are the step it failed at, not those run before the losses were read
    failed_at = int(re.search(r"at step (\d+)", run.error).group(1))
    assert failed_at < 20 and run.steps_done == failed_at, (run.steps_done, run.error)
    assert not store.metrics([run_id], names=["val_loss"]).empty
    manager.shutdown()


def test_a_failing_run_does_not_stop_the_queue(store):
    manager = JobManager(store)
    bad, good = manager.submit([
        dataclasses.replace(TINY, dataset="files", dataset_options={"path": "/nonexistent/*.txt"}),
        dataclasses.replace(TINY, steps=4),
    ])
    manager.wait()
    assert store.runs.get_run(bad).status == "failed" and "no file matches" in store.runs.get_run(bad).error
    assert store.runs.get_run(good).status == "finished"
    manager.shutdown()


def test_stale_running_row_is_marked_interrupted_at_start_up(store):
    run_id = store.runs.create_run(name="ghost", config=TINY.to_dict(), estimator="basis", rank=4, lam=0.0, seed=0, preset="tiny", steps=40)
    assert store.queue.claim(run_id, "localhost-that-died:999999999")
    with store.db.session(write=True) as s:  # an old heartbeat, as a dead process leaves it
        from datetime import datetime, timedelta, timezone

        from storage.models import Run
        s.get(Run, run_id).heartbeat_at = datetime.now(timezone.utc) - timedelta(hours=1)
    manager = JobManager(store)
    assert manager.interrupted == [run_id]
    assert store.runs.get_run(run_id).status == "interrupted"
    manager.shutdown()


def test_run_rows_record_the_environment(store):
    manager = JobManager(store)
    [run_id] = manager.submit(dataclasses.replace(TINY, steps=2))
    manager.wait()
    run = store.runs.get_run(run_id)
    assert run.versions["jax"] and run.device.startswith("cpu")
    assert RunConfig.from_dict(run.config) == dataclasses.replace(TINY, steps=2)
    manager.shutdown()


def test_a_run_that_crashes_its_worker_thread_ends_interrupted_with_cause_crash(store, monkeypatch):
    from engine.runner.execution import RunExecution

    def crash(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(RunExecution, "execute", crash)
    manager = JobManager(store)
    try:
        run_id = manager.submit(TINY)[0]
        assert manager.wait([run_id], timeout=120)
        wait = time.monotonic() + 60
        while store.runs.get_run(run_id).status == "running" and time.monotonic() < wait:  # stored at the next beat
            time.sleep(0.2)
    finally:
        manager.shutdown()
    run = store.runs.get_run(run_id)
    assert manager.outcomes[run_id].cause == "crash"
    assert (run.status, run.interruption_cause) == ("interrupted", "crash") and "RuntimeError: boom" in run.error


def test_every_validation_step_stores_its_per_batch_losses_until_the_run_is_deleted(store):
    """A run stores, at step 0 and at every eval, one loss per validation batch (in the
    transaction of its metrics) whose mean is that step's ``val_loss``; deleting the run
    deletes them."""
    config = dataclasses.replace(TINY, steps=4, val_batches=3)
    manager = JobManager(store)
    try:
        [run_id] = manager.submit(config)
        assert manager.wait([run_id], timeout=600)
    finally:
        manager.shutdown()
    assert store.runs.get_run(run_id).status == "finished"
    val = store.metrics([run_id], names=["val_loss"]).set_index("step")["value"]
    losses = store.eval_losses([run_id]).set_index("step")["losses"]
    assert list(losses.index) == list(val.index) == [0, 2, 4]
    for step, batch_losses in losses.items():
        assert batch_losses.shape == (3,) and batch_losses.dtype == np.float64 and np.isfinite(batch_losses).all()
        assert batch_losses.mean() == pytest.approx(val[step], rel=1e-6)  # float32 losses, their mean in float64
        assert np.array_equal(batch_losses.astype(np.float32), batch_losses)  # each one a float32 value
    assert not np.array_equal(losses[0], losses[4])
    store.runs.delete_run(run_id)
    assert store.eval_losses([run_id]).empty
