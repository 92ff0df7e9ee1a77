"""The liveness policy (``engine.runner.liveness``) on a real store: which runs are stale
and are marked interrupted; and ``Heartbeat``, the one sign-of-life thread of runs,
diagnoses and workers.

Timing is checked only from below (a beat never comes sooner than its period after
the previous one, or after the start); how late a beat comes on a busy machine is not
bounded here.
"""

import logging
import socket
import threading
import time
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import update

from engine.runner.liveness import (
    HEARTBEAT_S,
    STALE_AFTER_S,
    Heartbeat,
    current_owner,
    mark_stale_interrupted,
    stale_runs,
)
from storage.models import Run
from tests.support.runs import dead_pid, new_run

PERIOD = 0.05


def wait_until(predicate, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(PERIOD / 5)


def test_it_beats_at_its_period_until_the_block_ends():
    times = []
    start = time.monotonic()
    with Heartbeat(lambda: times.append(time.monotonic()), period=PERIOD, name="test-beat") as beat:
        assert beat.period == PERIOD
        wait_until(lambda: len(times) >= 4)
    ended = time.monotonic()
    gaps = [b - a for a, b in zip([start, *times], times)]
    assert min(gaps) >= PERIOD * 0.95  # never sooner than a period (the first: after the start)
    assert beat.beats == len(times) and beat.failures == 0 and beat.last_error is None
    assert not beat._thread.is_alive()
    n = len(times)
    time.sleep(4 * PERIOD)
    assert len(times) == n and all(t <= ended for t in times)  # nothing after stop()


def test_stop_waits_for_a_beat_in_progress():
    started, finished = threading.Event(), threading.Event()

    def slow():
        started.set()
        time.sleep(5 * PERIOD)
        finished.set()

    beat = Heartbeat(slow, period=PERIOD).start()
    assert started.wait(60)
    beat.stop()
    assert finished.is_set()
    assert beat.beats == 1


def test_a_failed_beat_is_reported_and_the_next_one_tried(caplog):
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) == 1:
            raise ConnectionError("database is busy")

    with caplog.at_level(logging.WARNING, logger="engine.runner.liveness"):
        with Heartbeat(flaky, period=PERIOD, name="run-7-beat") as beat:
            wait_until(lambda: beat.beats >= 2)
    assert beat.failures == 1
    assert isinstance(beat.last_error, ConnectionError) and str(beat.last_error) == "database is busy"
    assert len(calls) == beat.beats + beat.failures
    [record] = [r for r in caplog.records if "run-7-beat" in r.getMessage()]
    assert "ConnectionError: database is busy" in record.getMessage()


def test_bad_period_and_second_start_are_refused():
    with pytest.raises(ValueError, match="period must be > 0"):
        Heartbeat(lambda: None, period=0)
    beat = Heartbeat(lambda: None, period=PERIOD).start()
    try:
        with pytest.raises(RuntimeError, match="started already"):
            beat.start()
    finally:
        beat.stop()


def test_a_beat_comes_well_within_the_stale_timeout():
    """A live worker is never mistaken for a dead one: many beats fit in the timeout."""
    assert STALE_AFTER_S >= 10 * HEARTBEAT_S
    assert Heartbeat(lambda: None).period == HEARTBEAT_S


def test_mark_stale_interrupted(store):
    host = socket.gethostname()
    old = datetime.now(timezone.utc) - timedelta(hours=1)

    def running(name, owner, heartbeat=None):
        rid = new_run(store, name)
        assert store.queue.claim(rid, owner)
        if heartbeat is not None:
            with store.engine.begin() as con:
                con.execute(update(Run).where(Run.id == rid).values(heartbeat_at=heartbeat))
        return rid

    dead_old = running("dead-old", f"{host}:{dead_pid()}", old)
    dead_fresh = running("dead-fresh", f"{host}:{dead_pid()}")
    remote_old = running("remote-old", "elsewhere.example:1234", old)
    live = running("live", current_owner())
    remote_fresh = running("remote-fresh", "elsewhere.example:1234")
    queued = new_run(store, "queued")

    assert mark_stale_interrupted(store, 120) == sorted([dead_old, dead_fresh, remote_old])
    status = {r.id: r.status for r in store.runs.list_runs()}
    assert status == {dead_old: "interrupted", dead_fresh: "interrupted", remote_old: "interrupted",
                      live: "running", remote_fresh: "running", queued: "queued"}
    rec = store.runs.get_run(dead_old)
    assert rec.finished_at is not None and rec.interruption_cause == "stale" and "no longer running" in rec.error
    assert mark_stale_interrupted(store) == []  # idempotent


def test_liveness_primitives_and_policy(store):
    now = datetime.now(timezone.utc)
    a, b, q = new_run(store, "a"), new_run(store, "b"), new_run(store, "q")
    store.queue.claim(a, "far.example:1")
    store.queue.claim(b, "far.example:2")
    rows = store.runs.active_runs_heartbeats()
    assert [(r, o) for r, o, _ in rows] == [(a, "far.example:1"), (b, "far.example:2")]
    assert all(abs((last - now).total_seconds()) < 60 for _, _, last in rows)
    rows = [(a, "far.example:1", now - timedelta(seconds=200)), (b, "far.example:2", now - timedelta(seconds=10)),
            (q, None, None), (77, f"{socket.gethostname()}:{dead_pid()}", now), (78, current_owner(), now),
            (79, current_owner(), now - timedelta(days=1))]  # alive here, however silent: stopped, not dead
    stale = stale_runs(rows, now, 120, socket.gethostname())
    assert sorted(stale) == [a, q, 77] and "no longer running" in stale[77] and "no heartbeat" in stale[a]
    assert store.runs.mark_interrupted({a: "interrupted: test", q: "interrupted: not running"}) == [a]
    assert store.runs.get_run(a).status == "interrupted" and store.runs.get_run(a).error == "interrupted: test"
    assert store.runs.get_run(q).status == "queued"  # only running rows change
    assert store.runs.mark_interrupted({a: "again"}) == [] and store.runs.get_run(a).error == "interrupted: test"
