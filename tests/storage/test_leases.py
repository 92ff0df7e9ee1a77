"""Fencing on SQLite and PostgreSQL: every claim takes a new epoch, and an owner's write
under an epoch that is no longer the run's changes nothing and raises LeaseLostError."""

import pytest

from storage import LeaseLostError, RunNotFoundError


def _queued(store, name="r"):
    return store.runs.create_run(name=name, config={}, estimator="basis", rank=4, lam=0.0, seed=0, preset="tiny", steps=100)


def test_every_claim_takes_a_newer_epoch(store):
    a, b = _queued(store, "a"), _queued(store, "b")
    assert store.runs.get_run(a).epoch == 0
    assert store.queue.claim(a, "host:1") == 1
    store.runs.set_status(a, "interrupted", error="interrupted: gone", epoch=1)
    assert store.queue.requeue([a]) == [a] and store.runs.get_run(a).epoch == 2  # a requeue fences the old owner at once
    assert store.queue.claim_next("host:2") == (a, 3)
    assert store.queue.claim_next("host:2") == (b, 1)
    assert store.runs.run_lease(a) == (3, False)
    running = store.runs.create_run(name="c", config={}, estimator="basis", rank=4, lam=0.0, seed=0, preset="tiny",
                               steps=1, status="running", owner="host:3")
    assert store.runs.get_run(running).epoch == 1  # created running: claimed by its creator
    with pytest.raises(RunNotFoundError):
        store.runs.run_lease(999)


def test_a_stale_owner_writes_nothing_and_learns_it_lost(store):
    run_id = _queued(store)
    old = store.queue.claim(run_id, "host:old")
    store.metrics.add_metrics(run_id, [(1, 0.1, "train_loss", 5.0)], epoch=old)
    store.runs.heartbeat(run_id, 1, owner="host:old", epoch=old)
    store.runs.set_checkpoint_step(run_id, 1, epoch=old)
    store.runs.set_status(run_id, "interrupted", error="interrupted: silent", epoch=None)  # a reader's liveness verdict
    store.queue.requeue([run_id])
    new = store.queue.claim(run_id, "host:new")
    assert new > old
    before = store.runs.get_run(run_id)
    writes = [
        lambda: store.metrics.add_metrics(run_id, [(2, 0.2, "train_loss", 4.0)], epoch=old),
        lambda: store.runs.heartbeat(run_id, 99, owner="host:old", epoch=old),
        lambda: store.runs.set_status(run_id, "finished", epoch=old),
        lambda: store.runs.set_checkpoint_step(run_id, 99, epoch=old),
        lambda: store.runs.append_notes(run_id, "stale", epoch=old),
        lambda: store.metrics.delete_metrics_after(run_id, -1, epoch=old),
    ]
    for write in writes:
        with pytest.raises(LeaseLostError) as e:
            write()
        assert (e.value.run_id, e.value.epoch, e.value.current) == (run_id, old, new)
        assert str(e.value) == f"run {run_id}: lost its lease to epoch {new}; stopping without writing"
    after = store.runs.get_run(run_id)
    assert (after.status, after.steps_done, after.checkpoint_step, after.notes, after.owner, after.heartbeat_at) == (
        before.status, before.steps_done, before.checkpoint_step, before.notes, before.owner, before.heartbeat_at)
    assert store.metrics([run_id])[["step", "value"]].values.tolist() == [[1, 5.0]]
    # the holder's writes go through
    store.metrics.add_metrics(run_id, [(2, 0.2, "train_loss", 4.0)], epoch=new)
    store.runs.heartbeat(run_id, 2, owner="host:new", epoch=new)
    store.runs.set_status(run_id, "finished", epoch=new)
    assert store.runs.get_run(run_id).status == "finished" and len(store.metrics([run_id])) == 2
    with pytest.raises(RunNotFoundError):
        store.runs.heartbeat(12345, 1, epoch=1)


def test_a_slow_owner_still_holding_its_lease_takes_its_run_back(store):
    """Marked interrupted by a reader but not requeued: its lease holds, and its heartbeat
    makes the run running again."""
    run_id = _queued(store)
    epoch = store.queue.claim(run_id, "host:slow")
    store.runs.mark_interrupted({run_id: "interrupted: no heartbeat"})
    store.runs.heartbeat(run_id, 5, owner="host:slow", epoch=epoch)
    assert store.runs.get_run(run_id).status == "running"
