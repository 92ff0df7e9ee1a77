"""The worker registry (``storage.workers``).

Tests that take the ``store`` or ``db_url`` fixture run on SQLite and on a throwaway
PostgreSQL (tests/conftest.py; skipped with the reason where no server can be started);
the rest are about SQLite files. Every database lives in tmp_path or that cluster."""

from __future__ import annotations

from datetime import timedelta

import pandas as pd
import pytest

from storage import StorageError
from tests.support.runs import new_run


def test_worker_registry(store):
    run = new_run(store, "r")
    store.workers.register_worker("hostA:11:abcd", "hostA", 11, "gpu: H100", concurrent=2)
    store.workers.register_worker("hostB:12:ef01", "hostB", 12, "cpu", concurrent=1)
    t0 = {w.id: w.heartbeat_at for w in store.workers.list_workers()}
    store.workers.worker_heartbeat("hostA:11:abcd", run)
    workers = {w.id: w for w in store.workers.list_workers()}
    a = workers["hostA:11:abcd"]
    assert (a.host, a.pid, a.device, a.concurrent, a.status, a.current_run_id) == ("hostA", 11, "gpu: H100", 2, "active", run)
    assert a.heartbeat_at >= t0["hostA:11:abcd"] and a.started_at.utcoffset() == timedelta(0)
    store.workers.end_worker("hostB:12:ef01")
    frame = store.frames.workers_frame().set_index("id")
    assert frame.loc["hostB:12:ef01", "status"] == "stopped" and pd.isna(frame.loc["hostB:12:ef01", "current_run_id"])
    assert frame.loc["hostA:11:abcd", "current_run_id"] == run and str(frame["heartbeat_at"].dt.tz) == "UTC"
    # deleting the run a worker trains clears the worker's link, not the worker
    store.runs.set_status(run, "cancelled")
    store.runs.delete_run(run)
    assert {w.id: w.current_run_id for w in store.workers.list_workers()}["hostA:11:abcd"] is None
    with pytest.raises(StorageError, match="register it first"):
        store.workers.worker_heartbeat("nobody:1:x")
    with pytest.raises(ValueError, match="1 to 64"):
        store.workers.register_worker("x" * 65, "h", 1)
    store.workers.register_worker("hostB:12:ef01", "hostB", 12, "cpu")  # re-registering revives it
    assert {w.id: w.status for w in store.workers.list_workers()}["hostB:12:ef01"] == "active"
