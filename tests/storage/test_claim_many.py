"""``QueueRepository.claim_many``: the runs of a cohort claimed together, in one transaction,
each under a new lease exactly as ``claim`` takes one; what ``claim`` refuses is left out, a
run is claimed once however many claimers race, and on PostgreSQL a row another transaction
holds is skipped (``FOR UPDATE SKIP LOCKED``) instead of waited for.

Tests that take ``store`` run on SQLite and on a throwaway PostgreSQL (tests/conftest.py;
skipped with the reason where no server can be started)."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import event, select

from storage import RunStore
from storage.models import Run
from tests.support.runs import new_run


def _commits(store: RunStore) -> list[int]:
    """A list that grows by one at every transaction committed on ``store``'s engine."""
    seen: list[int] = []
    event.listen(store.engine, "commit", lambda conn: seen.append(1))
    return seen


def _leftovers(store: RunStore) -> int:
    """A queued run that still carries an earlier end (a finish time, an error)."""
    run_id = new_run(store, "leftover")
    store.runs.set_status(run_id, "failed", error="boom")
    store.runs.set_status(run_id, "queued")  # keeps finished_at and the error
    rec = store.runs.get_run(run_id)
    assert rec.status == "queued" and rec.finished_at is not None and rec.error == "boom"
    return run_id


def test_every_queued_run_is_claimed_under_a_new_lease_in_one_commit(store):
    a, b = new_run(store, "a"), new_run(store, "b")
    again = new_run(store, "again")  # claimed, stopped and queued again: epoch 2 now
    assert store.queue.claim(again, "host:9") == 1
    store.runs.set_status(again, "interrupted", error="signal", cause="signal")
    assert store.queue.requeue([again]) == [again]
    leftover = _leftovers(store)
    commits = _commits(store)
    leases = store.queue.claim_many([a, b, again, leftover], "host:1", "w-1")
    assert len(commits) == 1
    assert leases == {a: 1, b: 1, again: 3, leftover: 1}
    for run_id, epoch in leases.items():
        rec = store.runs.get_run(run_id)
        assert (rec.status, rec.owner, rec.worker_id, rec.epoch) == ("running", "host:1", "w-1", epoch)
        assert rec.started_at is not None and rec.heartbeat_at is not None
        assert (rec.finished_at, rec.error, rec.interruption_cause) == (None, None, None)
        assert store.runs.run_lease(run_id)[0] == epoch


def test_a_single_claim_writes_the_same_lease(store):
    leftover = _leftovers(store)
    assert store.queue.claim(leftover, "host:1", "w-1") == 1
    rec = store.runs.get_run(leftover)
    assert (rec.status, rec.owner, rec.worker_id) == ("running", "host:1", "w-1")
    assert (rec.finished_at, rec.error, rec.interruption_cause) == (None, None, None)


def test_what_claim_refuses_is_left_out_and_a_second_claim_gets_nothing(store):
    queued, foreign = new_run(store, "queued"), new_run(store, "foreign")
    cancelled, running, finished, flagged = (new_run(store, n) for n in ("cancelled", "running", "finished", "flagged"))
    assert store.runs.request_cancel(cancelled)
    assert store.queue.claim(running, "host:2") == 1
    store.queue.claim(finished, "host:2")
    store.runs.set_status(finished, "finished")
    with store.db.session(write=True) as s:
        s.get_one(Run, foreign).owner = "elsewhere:1"  # queued by another process: claimable, as by claim
        s.get_one(Run, flagged).cancel_requested = True  # queued, but a cancel was asked for
    ids = [queued, foreign, cancelled, running, finished, flagged, 10**6]
    assert store.queue.claim_many(ids, "host:1") == {queued: 1, foreign: 1}
    assert store.runs.get_run(running).owner == "host:2" and store.runs.get_run(running).epoch == 1
    assert store.runs.get_run(flagged).status == "queued" and store.runs.get_run(cancelled).status == "cancelled"

    assert store.queue.claim_many(ids, "host:3") == {}  # each run once: nothing is queued any more
    assert store.runs.get_run(queued).owner == "host:1" and store.runs.get_run(queued).epoch == 1
    commits = _commits(store)
    assert store.queue.claim_many([], "host:1") == {} and commits == []  # no transaction at all


def test_with_a_lead_it_is_all_or_nothing_on_the_lead(store):
    lead, sibling = new_run(store, "lead"), new_run(store, "sibling")
    assert store.runs.request_cancel(lead)
    assert store.queue.claim_many([lead, sibling], "host:1", lead=lead) == {}
    assert store.runs.get_run(sibling).status == "queued" and store.runs.get_run(sibling).epoch == 0
    other = new_run(store, "other")
    assert store.queue.claim_many([other, sibling], "host:1", lead=other) == {other: 1, sibling: 1}


def test_racing_claimers_take_each_run_once(store):
    ids = [new_run(store, f"r{i}") for i in range(12)]
    got: dict[str, dict[int, int]] = {}
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def claim(owner: str) -> None:
        try:
            start.wait()
            got[owner] = store.queue.claim_many(ids, owner)
        except BaseException as e:  # reported below, not lost in the thread
            errors.append(e)

    threads = [threading.Thread(target=claim, args=(f"host:{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and len(got) == 4
    claimed = [rid for leases in got.values() for rid in leases]
    assert sorted(claimed) == ids  # every run, exactly once
    for owner, leases in got.items():
        for rid, epoch in leases.items():
            rec = store.runs.get_run(rid)
            assert (rec.owner, rec.epoch, rec.status) == (owner, epoch, "running")


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_a_row_another_transaction_holds_is_skipped_without_waiting(store):
    a, held, c = new_run(store, "a"), new_run(store, "held"), new_run(store, "c")
    other = RunStore(store.db.engine.url.render_as_string(hide_password=False))
    result: dict[str, dict[int, int]] = {}
    try:
        with other.engine.connect() as conn, conn.begin():
            assert conn.execute(select(Run.id).where(Run.id == held).with_for_update()).scalar_one() == held
            claimer = threading.Thread(target=lambda: result.update(
                many=store.queue.claim_many([a, held, c], "host:1"),
                lead=store.queue.claim_many([held], "host:1", lead=held)))
            claimer.start()
            claimer.join(20)  # a claim that waited for the lock would still be waiting here
            assert not claimer.is_alive(), "claim_many waited for a row another transaction holds"
        assert result == {"many": {a: 1, c: 1}, "lead": {}}
        assert store.runs.get_run(held).status == "queued"
        assert store.queue.claim_many([a, held, c], "host:2") == {held: 1}  # released: claimable again
    finally:
        other.close()


def test_a_run_interrupted_before_its_claim_is_marked_only_while_it_is_still_queued(store):
    """A process stopping before it claims a run of its queue marks it interrupted, resumable;
    one cancelled or claimed elsewhere meanwhile keeps its status (no overwrite of another's end)."""
    queued, cancelled, taken = (new_run(store, name) for name in ("queued", "cancelled", "taken"))
    store.runs.set_status(cancelled, "cancelled")
    store.queue.claim(taken, "elsewhere:1")
    said = "interrupted before it started; resume it to train it"
    assert store.queue.interrupt_queued(queued, said, "signal")
    assert not store.queue.interrupt_queued(cancelled, said, "signal")
    assert not store.queue.interrupt_queued(taken, said, "signal")
    run = store.runs.get_run(queued)
    assert (run.status, run.error, run.interruption_cause) == ("interrupted", said, "signal")
    assert run.finished_at is not None
    assert store.runs.get_run(cancelled).status == "cancelled" and store.runs.get_run(taken).status == "running"
