"""``StoreWriter``: ordered writes of callables, retried while the database is busy,
failed for good per run, heartbeats coalesced. A recording store stands in for
``RunStore`` so each outcome (busy, refused, crashed) is chosen exactly; the writer's
sleep is recorded instead of slept."""

import threading

import pytest

from engine.runner import writer as writer_module
from engine.runner.writer import BACKOFF_S, MAX_BACKOFF_S, StoreWriter
from storage import DatabaseBusyError, StorageError


class Recorder:
    """Records every write; ``busy[name]`` answers that many calls of ``name`` with
    ``DatabaseBusyError``; ``gate`` (when set) holds ``set_status`` until released."""

    def __init__(self):
        self.calls: list[tuple] = []
        self.busy: dict[str, int] = {}
        self.gate: threading.Event | None = None

    @property
    def runs(self):
        return self  # the store's repositories that StoreWriter writes through, recorded here

    metrics = runs

    def _record(self, name, *args, **kwargs):
        if self.busy.get(name, 0):
            self.busy[name] -= 1
            raise DatabaseBusyError("database is locked")
        self.calls.append((name, args, kwargs))

    def set_status(self, *args, **kwargs):
        if self.gate is not None:
            assert self.gate.wait(60)
        self._record("set_status", *args, **kwargs)

    def add_metrics(self, *args, **kwargs):
        self._record("add_metrics", *args, **kwargs)

    def heartbeat(self, *args, **kwargs):
        self._record("heartbeat", *args, **kwargs)

    def delete_run(self, run_id):
        raise StorageError(f"run {run_id} does not exist")

    def broken(self, run_id):
        raise ZeroDivisionError("a bug")


@pytest.fixture
def store():
    return Recorder()


@pytest.fixture
def slept():
    return []


@pytest.fixture
def writer(store, slept):
    return StoreWriter(store, sleep=slept.append)


def test_writes_run_in_order_as_the_callables_given(writer, store):
    writer.call(1, store.runs.set_status, 1, "running")
    writer.metrics(1, [(0, 0.0, "loss", 3.0)])
    writer.metrics(1, [])  # nothing to write, nothing queued
    writer.call(2, store.runs.set_status, 2, "finished", error=None)
    assert writer.flush(60)
    assert store.calls == [("set_status", (1, "running"), {}), ("add_metrics", (1, [(0, 0.0, "loss", 3.0)]), {}),
                           ("set_status", (2, "finished"), {"error": None})]
    assert writer.failure(1) is None and writer.retries == 0


def test_a_busy_database_is_retried_with_doubling_backoff_and_nothing_is_lost(writer, store, slept):
    store.busy["add_metrics"] = 9
    writer.metrics(1, [(5, 1.0, "loss", 2.0)])
    writer.call(1, store.runs.set_status, 1, "finished")
    assert writer.flush(60)
    assert [c[0] for c in store.calls] == ["add_metrics", "set_status"]  # order kept across retries
    assert writer.retries == 9
    assert slept == [min(BACKOFF_S * 2**i, MAX_BACKOFF_S) for i in range(9)]
    assert slept[-1] == MAX_BACKOFF_S  # the backoff is capped
    assert writer.failure(1) is None


def test_a_refused_write_fails_its_run_for_good_and_others_go_on(writer, store, slept):
    writer.call(3, store.runs.delete_run, 3)
    writer.call(4, store.broken, 4)
    writer.call(None, store.broken, 0)  # no run to fail
    writer.call(5, store.runs.set_status, 5, "running")
    assert writer.flush(60)
    assert str(writer.failure(3)) == "run 3 does not exist"
    assert isinstance(writer.failure(4), ZeroDivisionError) and str(writer.failure(4)) == "a bug"  # a bug kept whole
    assert writer.failure(5) is None and store.calls == [("set_status", (5, "running"), {})]
    assert slept == [] and writer.retries == 0  # not retried


def test_waiting_heartbeats_of_a_run_coalesce_into_the_newest(writer, store):
    store.gate = threading.Event()
    writer.call(1, store.runs.set_status, 1, "running")  # holds the writer's thread
    for step in range(5):
        writer.heartbeat(1, step, owner="host:1")
    writer.heartbeat(2, 7, owner="host:2")
    store.gate.set()
    assert writer.flush(60)
    beats = [c for c in store.calls if c[0] == "heartbeat"]
    assert beats == [("heartbeat", (1, 4), {"owner": "host:1"}), ("heartbeat", (2, 7), {"owner": "host:2"})]
    writer.heartbeat(1, 9, owner="host:1")  # taken already: a new beat is queued anew
    assert writer.flush(60)
    assert store.calls[-1] == ("heartbeat", (1, 9), {"owner": "host:1"})


def test_a_heartbeat_retried_while_busy_keeps_its_arguments(writer, store):
    store.busy["heartbeat"] = 2
    writer.heartbeat(1, 12, owner="host:1")
    assert writer.flush(60)
    assert store.calls == [("heartbeat", (1, 12), {"owner": "host:1"})]
    assert writer.retries == 2


def test_a_full_queue_makes_the_producer_wait_instead_of_dropping(store, slept, monkeypatch):
    monkeypatch.setattr(writer_module, "MAX_PENDING", 2)
    writer = StoreWriter(store, sleep=slept.append)
    store.gate = threading.Event()
    writer.call(1, store.runs.set_status, 1, "running")  # taken by the thread, held at the gate
    done = threading.Event()

    def produce():
        for step in range(4):
            writer.metrics(1, [(step, 0.0, "loss", 1.0)])
        done.set()

    threading.Thread(target=produce, daemon=True).start()
    assert not done.wait(0.3)  # two fit in the queue; the third waits
    store.gate.set()
    assert done.wait(60) and writer.flush(60)
    assert [c[1][1][0][0] for c in store.calls if c[0] == "add_metrics"] == [0, 1, 2, 3]


def test_after_a_write_lost_for_good_only_the_runs_final_writes_are_tried(writer, store, slept):
    """A write after a lost one would leave a hole in the run's history: it is dropped; the
    run's end (``final``) is still tried, and ``forget`` starts the run's next training afresh."""
    writer.metrics(6, [(1, 0.0, "loss", 2.0)])
    writer.call(6, store.runs.delete_run, 6)  # refused for good
    writer.metrics(6, [(2, 0.0, "loss", 1.0)])
    writer.heartbeat(6, 2)
    writer.final(6, store.runs.set_status, 6, "interrupted")
    writer.metrics(7, [(2, 0.0, "loss", 1.0)])  # another run goes on
    assert writer.flush(60)
    assert [(c[0], c[1][0]) for c in store.calls] == [("add_metrics", 6), ("set_status", 6), ("add_metrics", 7)]
    assert str(writer.failure(6)) == "run 6 does not exist"
    writer.forget(6)
    writer.metrics(6, [(3, 0.0, "loss", 0.5)])
    assert writer.flush(60) and store.calls[-1][0] == "add_metrics" and writer.failure(6) is None


def test_a_lost_connection_is_waited_for_like_a_busy_database(writer, store, slept):
    from storage import DatabaseUnreachableError

    calls = []

    def flaky(run_id):
        calls.append(run_id)
        if len(calls) <= 30:  # 30 tries, about two minutes of backoff: a server restarting
            raise DatabaseUnreachableError("the database cannot be reached (connection refused)")

    writer.call(8, flaky, 8)
    writer.metrics(8, [(1, 0.0, "loss", 2.0)])
    assert writer.flush(60)
    assert len(calls) == 31 and writer.failure(8) is None and store.calls[-1][0] == "add_metrics"
    assert sum(slept) > 100
