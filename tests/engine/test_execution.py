"""``RunExecution``: one run's life here, its claim, its stop signals and its lease, as its
process's liveness channel reads them back from a real database (no training; ``test_jobs``, ``test_durable`` and
``test_exactly_once`` train runs through it end to end)."""

from __future__ import annotations

import threading

import pytest

from engine.runner.execution import RunExecution
from engine.runner.liveness import Channel
from engine.runner.writer import StoreWriter
from storage import LeaseLostError, RunStore
from tests.support.runs import new_run


@pytest.fixture
def lab(tmp_path):
    store = RunStore(f"sqlite:///{tmp_path / 'lab.db'}")
    yield store, StoreWriter(store)
    store.close()


def _execution(lab, run_id, tmp_path, **kw) -> RunExecution:
    store, writer = lab
    args = dict(owner="here:1", stop=threading.Event(), interrupted=threading.Event(), checkpoints=tmp_path / "ckpt",
                channel=Channel(store, "here:1"))  # not started: a test beats it by hand
    return RunExecution(store, writer, run_id, **{**args, **kw})


def test_a_claim_takes_a_new_lease_once(lab, tmp_path):
    store, _ = lab
    run_id = new_run(store)
    run = _execution(lab, run_id, tmp_path)
    assert run.claim("w1") and run.epoch == store.runs.run_lease(run_id)[0]
    assert store.runs.get_run(run_id).status == "running"
    other = _execution(lab, run_id, tmp_path)
    assert not other.claim("w2") and other.epoch is None  # not queued any more: trained by one owner


def test_a_run_interrupted_before_its_claim_is_marked_interrupted_not_claimed(lab, tmp_path):
    store, _ = lab
    run_id = new_run(store)
    interrupted = threading.Event()
    interrupted.set()
    run = _execution(lab, run_id, tmp_path, interrupted=interrupted)
    assert not run.claim("w1") and run.epoch is None
    row = store.runs.get_run(run_id)
    assert row.status == "interrupted" and "resume it" in row.error


def _held(run: RunExecution) -> None:
    """What ``execute`` does first: the run's lease held by its channel."""
    run.run = run.store.runs.get_run(run.run_id)
    run.lease_state = run.channel.hold(run.run_id, run.lease)


def test_a_cancel_request_stops_it_at_the_channels_next_beat_and_not_before(lab, tmp_path):
    store, _ = lab
    run_id = new_run(store)
    run = _execution(lab, run_id, tmp_path)
    run.claim("w1")
    _held(run)
    assert not run.should_stop()
    store.runs.request_cancel(run_id)
    assert not run.should_stop()  # the training thread reads memory only: the beat brings it the news
    run.channel.beat()
    assert run.should_stop() and run.stop_event.is_set() and run.lost is None
    assert run.ending() == ("cancelled", None, None)


def test_a_lease_taken_by_another_claim_stops_it_and_refuses_its_checkpoints(lab, tmp_path):
    store, _ = lab
    run_id = new_run(store)
    run = _execution(lab, run_id, tmp_path)
    run.claim("w1")
    _held(run)
    run.channel.beat()
    run.hold_lease(10)  # the lease holds: the save may go on
    store.runs.set_status(run_id, "interrupted")
    store.queue.requeue([run_id])
    assert _execution(lab, run_id, tmp_path).claim("w2")  # a new owner
    run.channel.beat()
    assert run.should_stop() and isinstance(run.lost, LeaseLostError) and not run.stop_event.is_set()
    with pytest.raises(LeaseLostError):
        run.hold_lease(20)
