"""The run queue (``storage.queue``): the status lifecycle, claiming (the oldest first,
each run once across threads and processes), cancel and requeue.

Tests that take the ``store`` or ``db_url`` fixture run on SQLite and on a throwaway
PostgreSQL (tests/conftest.py; skipped with the reason where no server can be started);
the rest are about SQLite files. Every database lives in tmp_path or that cluster."""

from __future__ import annotations

import multiprocessing
import threading

import pytest

import storage
from storage import RunNotFoundError, RunStore
from tests.support.runs import new_run


def test_status_lifecycle_claim_cancel(store):
    a = new_run(store, "a")
    assert store.queue.claim(a, "host:1") == 1  # the first lease
    assert store.queue.claim(a, "host:2") is None  # only from queued
    rec = store.runs.get_run(a)
    assert rec.status == "running" and rec.owner == "host:1" and rec.started_at and rec.heartbeat_at
    before = rec.heartbeat_at
    store.runs.heartbeat(a, 17)
    rec = store.runs.get_run(a)
    assert rec.steps_done == 17 and rec.heartbeat_at >= before

    # cancel a running run: only the flag, the worker stops itself
    assert store.runs.cancel_requested(a) is False
    assert store.runs.request_cancel(a) is True
    rec = store.runs.get_run(a)
    assert rec.status == "running" and rec.cancel_requested and store.runs.cancel_requested(a)
    store.runs.set_status(a, "cancelled")
    rec = store.runs.get_run(a)
    assert rec.status == "cancelled" and rec.finished_at is not None
    assert store.runs.request_cancel(a) is False  # already ended

    # cancel a queued run: cancelled at once, and it can no longer be claimed
    b = new_run(store, "b")
    assert store.runs.request_cancel(b) is True
    assert store.runs.get_run(b).status == "cancelled" and store.runs.get_run(b).finished_at is not None
    assert store.queue.claim(b, "host:1") is None

    c = new_run(store, "c")
    store.queue.claim(c, "host:1")
    store.runs.set_status(c, "failed", error="boom")
    rec = store.runs.get_run(c)
    assert (rec.status, rec.error) == ("failed", "boom") and rec.finished_at is not None
    assert not store.queue.claim(c, "host:1")
    with pytest.raises(ValueError, match="queued, running"):
        store.runs.set_status(c, "exploded")
    assert [r.id for r in store.runs.list_runs(statuses=["cancelled"])] == [a, b]
    assert [r.id for r in store.runs.list_runs(statuses=storage.ACTIVE_STATUSES)] == []
    assert store.frames.runs_frame().set_index("id").loc[c, "status"] == "failed"


def _claim_all(url, owner, out):
    st = RunStore(url)
    got = []
    try:
        while (lease := st.queue.claim_next(owner, worker_id=owner)) is not None:
            got.append(lease.run_id)
    finally:
        st.close()
    out.put((owner, got))


def _check_claims(store, queued, claims):
    everything = [rid for _, got in claims for rid in got]
    assert sorted(everything) == sorted(queued)  # every run claimed, exactly once
    for owner, got in claims:
        for rid in got:
            rec = store.runs.get_run(rid)
            assert (rec.status, rec.owner, rec.worker_id) == ("running", owner, owner)
            assert rec.started_at is not None and rec.heartbeat_at is not None


def test_claim_next_takes_the_oldest_queued_and_skips_cancelled(store):
    a, b, c = new_run(store, "a"), new_run(store, "b"), new_run(store, "c")
    store.runs.request_cancel(a)
    assert store.queue.claim_next("host:1", "w1") == (b, 1)
    assert store.queue.claim_next("host:2") == (c, 1)
    assert store.queue.claim_next("host:3") is None
    assert store.runs.get_run(c).worker_id is None and store.runs.get_run(b).worker_id == "w1"


def test_claim_next_race_between_threads_claims_each_run_once(db_url):
    setup = RunStore(db_url)
    queued = [new_run(setup, f"q{i}") for i in range(12)]
    import queue as queue_mod

    out = queue_mod.Queue()
    threads = [threading.Thread(target=_claim_all, args=(db_url, f"thread-{i}", out)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    claims = [out.get_nowait() for _ in threads]
    _check_claims(setup, queued, claims)
    setup.close()


def test_claim_next_race_between_processes_on_postgresql(pg_url):
    setup = RunStore(pg_url)
    queued = [new_run(setup, f"q{i}") for i in range(12)]
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_claim_all, args=(pg_url, f"proc-{i}", out)) for i in range(3)]
    for p in procs:
        p.start()
    claims = [out.get(timeout=180) for _ in procs]
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    _check_claims(setup, queued, claims)
    setup.close()


def test_requeue_moves_ended_runs_back_to_queued(store):
    fin, fail, canc, intr, run, que = (new_run(store, n) for n in ("fin", "fail", "canc", "intr", "run", "que"))
    for rid in (fin, fail, canc, intr, run):
        assert store.queue.claim(rid, "host:1", "w1")
    store.runs.heartbeat(intr, 40)
    store.runs.set_checkpoint_step(intr, 30)
    store.metrics.add_metrics(intr, [(s, float(s), "train_loss", 1.0) for s in range(0, 41, 10)])
    store.runs.set_status(fin, "finished")
    store.runs.set_status(fail, "failed", error="boom")
    store.runs.request_cancel(canc)
    store.runs.set_status(canc, "cancelled")
    store.runs.set_status(intr, "interrupted", error="interrupted: worker gone")
    assert store.queue.requeue([fin, fail, canc, intr, run, que]) == sorted([fail, canc, intr])
    for rid in (fail, canc, intr):
        rec = store.runs.get_run(rid)
        assert (rec.status, rec.error, rec.finished_at, rec.cancel_requested, rec.owner, rec.worker_id) == (
            "queued", None, None, False, None, None)
    assert {r.id: r.status for r in store.runs.list_runs()}[fin] == "finished"
    assert store.runs.get_run(run).status == "running" and store.runs.get_run(que).status == "queued"
    rec = store.runs.get_run(intr)
    assert (rec.steps_done, rec.checkpoint_step, len(store.metrics([intr]))) == (40, 30, 5)
    assert store.queue.claim_next("host:2") == (fail, 3)  # claimable again, oldest first, under a new lease
    with pytest.raises(RunNotFoundError):
        store.queue.requeue([canc, 999])
    assert store.runs.get_run(canc).status == "queued"


def test_an_interruption_cause_is_kept_while_interrupted_and_cleared_by_what_restarts_the_run(store):
    rid = new_run(store, "x")
    epoch = store.queue.claim(rid, "h:1")
    store.runs.set_status(rid, "interrupted", error="disk full: free space", cause="disk_full", epoch=epoch)
    assert store.runs.get_run(rid).interruption_cause == "disk_full"
    with pytest.raises(ValueError, match="unknown interruption cause 'tired'; expected one of signal, stale"):
        store.runs.set_status(rid, "interrupted", cause="tired")
    with pytest.raises(ValueError, match="for interrupted runs, not 'failed'"):
        store.runs.set_status(rid, "failed", cause="crash")
    assert (store.runs.get_run(rid).status, store.runs.get_run(rid).interruption_cause) == ("interrupted", "disk_full")
    assert store.queue.requeue(rid) == [rid] and store.runs.get_run(rid).interruption_cause is None
    assert store.queue.claim_next("h:2") == (rid, epoch + 2)
    assert store.runs.mark_interrupted({rid: "worker h:2 is no longer running"}) == [rid]
    assert store.runs.get_run(rid).interruption_cause == "stale"
    store.runs.heartbeat(rid, 3, owner="h:2")  # only slow after all: running again
    assert (store.runs.get_run(rid).status, store.runs.get_run(rid).interruption_cause) == ("running", None)
    store.runs.set_status(rid, "interrupted", cause="signal")
    store.runs.set_status(rid, "finished")
    assert store.runs.get_run(rid).interruption_cause is None
    assert store.runs.mark_interrupted({}) == []
