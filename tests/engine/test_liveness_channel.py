"""One liveness channel per process (``engine.runner.liveness.Channel`` over
``storage.lease.LeasesRepository.beat``), on SQLite and PostgreSQL: one transaction per beat
stamps every run, diagnosis and worker it holds and reads back their leases and cancel
flags; the training threads read what it published, never the database."""

from __future__ import annotations

import dataclasses
import threading

import pytest
from sqlalchemy import event, make_url

from engine.config import RunConfig
from engine.runner import jobs, liveness
from engine.runner.liveness import Channel
from storage import RunStore
from storage.db import CONNECT_TIMEOUT_S
from storage.runs import RunsRepository
from tests.support.runs import new_run

TINY = RunConfig(preset="tiny", steps=3)


def _commits(store: RunStore) -> list[int]:
    """A list that grows by one at every transaction committed on ``store``'s engine."""
    seen: list[int] = []
    event.listen(store.engine, "commit", lambda conn: seen.append(1))
    return seen


def test_one_transaction_stamps_every_held_run_and_reads_back_each_lease(store):
    a, b, lost, queued = (new_run(store, name=n) for n in ("a", "b", "lost", "queued"))
    store.workers.register_worker("w-1", "here", 1)
    epochs = {r: store.queue.claim(r, "here:1", "w-1") for r in (a, b, lost)}
    store.runs.set_status(lost, "interrupted")
    store.queue.requeue([lost])  # a new lease: the old one's beat must stamp nothing
    store.runs.request_cancel(b)
    with store.db.session(write=True) as s:
        from storage.models import Run

        s.get(Run, queued).owner = "here:1"
    before = store.runs.get_run(lost)
    commits = _commits(store)
    back = store.leases.beat({r: (e, 7) for r, e in epochs.items()}, owner="here:1", worker="w-1", current=a,
                             queued=[queued])
    assert len(commits) == 1
    assert back.runs[a] == (epochs[a], False) and back.runs[b] == (epochs[b], True)
    assert back.runs[lost].epoch == epochs[lost] + 1
    assert store.runs.get_run(a).steps_done == 7 and store.runs.get_run(a).heartbeat_at is not None
    after = store.runs.get_run(lost)
    assert (after.steps_done, after.heartbeat_at, after.status) == (before.steps_done, before.heartbeat_at, "queued")
    assert store.runs.get_run(queued).heartbeat_at is not None
    worker = next(w for w in store.workers.list_workers() if w.id == "w-1")
    assert worker.current_run_id == a
    store.runs.delete_run(a, force=True)
    assert a not in store.leases.beat({a: (epochs[a], 8)}, owner="here:1").runs  # deleted: nothing read back


def test_a_beat_takes_back_a_run_a_sweep_marked_interrupted_while_its_owner_was_slow(store):
    run_id = new_run(store)
    epoch = store.queue.claim(run_id, "elsewhere:1")
    store.runs.mark_interrupted({run_id: "no heartbeat"})
    store.leases.beat({run_id: (epoch, 3)}, owner="elsewhere:1")
    assert store.runs.get_run(run_id).status == "running"


@pytest.mark.parametrize("status, cause", [("interrupted", "signal"), ("finished", None), ("failed", None)])
def test_a_late_beat_leaves_a_run_its_owner_ended_as_it_ended(store, status, cause):
    """The beat copies the held runs, then writes: a run that ended in between (stopped on
    purpose, finished) keeps its end, its cause and its last progress; only a sweep's
    ``stale`` mark is undone (above)."""
    run_id = new_run(store)
    epoch = store.queue.claim(run_id, "here:1")
    store.runs.heartbeat(run_id, 10, owner="here:1", epoch=epoch)
    store.runs.set_status(run_id, status, error="ended", epoch=epoch, cause=cause)
    store.leases.beat({run_id: (epoch, 4)}, owner="here:1")
    run = store.runs.get_run(run_id)
    assert (run.status, run.interruption_cause, run.steps_done, run.finished_at is not None) == (status, cause, 10, True)
    if status == "interrupted":
        assert store.queue.requeue([run_id]) == [run_id]  # given back to the queue, as a Slurm job's stop does


def test_the_channel_publishes_cancel_lost_lease_and_deletion_to_memory(store):
    cancelled, taken, deleted = (new_run(store, name=n) for n in ("c", "t", "d"))
    channel = Channel(store, "here:1")  # not started: beaten by hand
    states = {r: channel.hold(r, store.queue.claim(r, "here:1")) for r in (cancelled, taken, deleted)}
    channel.beat()
    assert all(s.lost is None and not s.cancelled.is_set() for s in states.values())
    store.runs.request_cancel(cancelled)
    store.runs.set_status(taken, "interrupted")
    store.queue.requeue([taken])
    assert store.queue.claim(taken, "there:2")
    store.runs.set_status(deleted, "cancelled")
    store.runs.delete_run(deleted)
    assert not states[cancelled].cancelled.is_set()  # nothing changes in memory before the next beat
    channel.beat()
    assert states[cancelled].cancelled.is_set() and states[cancelled].lost is None
    assert states[taken].lost is not None and states[taken].lost.current > states[taken].epoch
    assert states[deleted].cancelled.is_set()
    channel.release(taken)
    store.runs.request_cancel(taken)
    commits = _commits(store)
    channel.beat()
    assert len(commits) == 1  # three runs held, one transaction


def test_a_diagnosis_is_stamped_and_hears_its_cancel_through_the_channel(store):
    run_id = new_run(store)
    diag_id = store.diagnostics.create_diagnostic(run_id, step=0, settings={})
    assert store.diagnostics.claim_diagnostic(diag_id, "here:1")
    cancel = threading.Event()
    channel = Channel(store, "here:1")
    channel.watch(diag_id, cancel)
    store.diagnostics.set_diagnostic_status(diag_id, "interrupted", error="no heartbeat")  # a sweep while it was slow
    channel.beat()
    assert not cancel.is_set()
    assert store.frames.diagnostics_frame().set_index("id").loc[diag_id, "status"] == "running"
    store.diagnostics.request_cancel_diagnostic(diag_id)
    channel.beat()
    assert cancel.is_set()


def test_the_sweep_runs_on_the_channel_at_most_every_sweep_period(store, monkeypatch):
    swept: list[int] = []
    monkeypatch.setattr(liveness, "sweep", lambda s: swept.append(1) or [])
    monkeypatch.setattr(liveness, "SWEEP_S", 3600.0)
    channel = Channel(store, "here:1", sweep=True)
    for _ in range(3):
        channel.beat()
    assert len(swept) == 1
    monkeypatch.setattr(liveness, "SWEEP_S", 0.0)
    channel.beat()
    assert len(swept) == 2
    assert Channel(store, "here:1").beat() is None and len(swept) == 2  # a channel without the sweep never sweeps


def test_a_manager_has_one_heartbeat_thread_and_its_runs_never_query_their_lease(store, monkeypatch, tmp_path):
    """Two runs train at once; the only heartbeat is the channel's, and ``run_lease`` (the old
    per-run poll) is never called: the runs learn their cancel from the channel."""
    started, names = threading.Barrier(3), []

    def train(config, *, should_stop, **hooks):
        started.wait(timeout=120)
        names.extend(t.name for t in threading.enumerate())
        while not should_stop():
            threading.Event().wait(0.01)
        yield from ()

    def never(*args, **kwargs):
        raise AssertionError("a run read its lease from the database")

    monkeypatch.setattr("engine.runner.execution.train", train)
    monkeypatch.setattr(RunsRepository, "run_lease", never)
    manager = jobs.JobManager(store, max_concurrent=2, checkpoints=tmp_path / "ckpt", cohorts="off")
    try:
        ids = manager.submit([TINY, dataclasses.replace(TINY, seed=1)])
        started.wait(timeout=120)
        for run_id in ids:
            store.runs.request_cancel(run_id)  # from "another process": only the database knows
        assert manager.wait(ids, timeout=120)
    finally:
        manager.shutdown()
    assert [store.runs.get_run(r).status for r in ids] == ["cancelled", "cancelled"]
    beating = {n for n in names if "heartbeat" in n or "liveness" in n}
    assert beating == {"basis-liveness"}, beating


def test_postgresql_connections_time_out_unless_the_url_says_otherwise(pg_url):
    own = make_url(pg_url).update_query_dict({"connect_timeout": "3"}).render_as_string(hide_password=False)
    for url, expected in ((pg_url, str(CONNECT_TIMEOUT_S)), (own, "3")):
        store = RunStore(url)
        try:
            with store.engine.connect() as conn:
                assert conn.connection.dbapi_connection.info.get_parameters()["connect_timeout"] == expected
        finally:
            store.close()


@pytest.mark.parametrize("period", [0, -1.0])
def test_a_channel_refuses_a_period_that_is_not_positive(store, period):
    with pytest.raises(ValueError, match="period must be > 0"):
        Channel(store, "here:1", period=period)
