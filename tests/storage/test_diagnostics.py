"""Stored diagnoses (``storage.diagnostics``): rows, results and their cascade with the
run.

Tests that take the ``store`` or ``db_url`` fixture run on SQLite and on a throwaway
PostgreSQL (tests/conftest.py; skipped with the reason where no server can be started);
the rest are about SQLite files. Every database lives in tmp_path or that cluster."""

from __future__ import annotations

import pandas as pd
import pytest

from storage import RunNotFoundError, StorageError
from tests.support.runs import new_run


def test_diagnostics_store_and_cascade(store):
    run = new_run(store, "r")
    other = new_run(store, "o")
    d1 = store.diagnostics.create_diagnostic(run, 200, {"keys": 64, "ranks": (4, 8)})
    d2 = store.diagnostics.create_diagnostic(other, None)
    frame = store.frames.diagnostics_frame(run)
    assert frame["id"].tolist() == [d1]
    row = frame.iloc[0]
    assert (row["status"], row["step"], row["settings"], len(row["uid"])) == ("queued", 200, {"keys": 64, "ranks": [4, 8]}, 32)
    assert store.diagnostics.claim_diagnostic(d1, "host:1") and not store.diagnostics.claim_diagnostic(d1, "host:2")
    results = [
        {"layer": "h0.mlp", "estimator": "ep", "rank": 4, "lam": 0.5, "bias2": 1e-3, "bias2_se": 2e-4,
         "variance": 0.1, "mse": 0.101, "cos_mean": 0.9, "keys": 64, "batches": 8},
        {"layer": "h0.attn", "estimator": "bp", "rank": 8, "bias2": float("nan")},
    ]
    store.diagnostics.add_diagnostic_results(d1, results)
    back = store.diagnostics.diagnostic_results(d1)
    assert back.iloc[0].to_dict() == results[0]
    assert back.loc[1, "layer"] == "h0.attn" and pd.isna(back.loc[1, "lam"]) and pd.isna(back.loc[1, "mse"])
    store.diagnostics.set_diagnostic_status(d1, "finished")
    store.diagnostics.set_diagnostic_status(d2, "failed", error="no checkpoint")
    done = store.frames.diagnostics_frame().set_index("id")
    assert done.loc[d1, "status"] == "finished" and done.loc[d1, "finished_at"] is not pd.NaT
    assert done.loc[d2, "error"] == "no checkpoint"
    with pytest.raises(ValueError, match="unknown diagnostic result fields"):
        store.diagnostics.add_diagnostic_results(d1, [{"lyer": "typo"}])
    with pytest.raises(ValueError, match="unknown run status"):
        store.diagnostics.set_diagnostic_status(d1, "done")
    with pytest.raises(RunNotFoundError):
        store.diagnostics.create_diagnostic(999, 1)
    with pytest.raises(StorageError, match="no diagnosis 999"):
        store.diagnostics.add_diagnostic_results(999, results)
    store.runs.delete_run(run)  # the run's diagnostics and their results go with it
    assert store.frames.diagnostics_frame()["id"].tolist() == [d2]
    assert store.diagnostics.diagnostic_results(d1).empty


def test_a_diagnosis_is_cancelled_queued_or_flagged_running_and_deleted_with_its_rows(store):
    run_id = new_run(store, "diagnosed")
    queued = store.diagnostics.create_diagnostic(run_id, 0, {"keys": 4})
    assert store.diagnostics.request_cancel_diagnostic(queued)
    row = store.frames.diagnostics_frame().set_index("id").loc[queued]
    assert row["status"] == "cancelled" and "before it started" in row["error"]
    running = store.diagnostics.create_diagnostic(run_id, 0, {"keys": 4})
    assert store.diagnostics.claim_diagnostic(running, "here:1") and not store.diagnostics.diagnostic_cancel_requested(running)
    assert store.diagnostics.request_cancel_diagnostic(running) and store.diagnostics.diagnostic_cancel_requested(running)
    assert store.frames.diagnostics_frame().set_index("id").loc[running, "status"] == "running"  # its process ends it
    store.diagnostics.add_diagnostic_results(running, [{"layer": "all", "estimator": "basis", "rank": 1, "lam": 0.0, "mse": 1.0}])
    with pytest.raises(StorageError, match="cancel it first"):
        store.diagnostics.delete_diagnostic(running)
    store.diagnostics.set_diagnostic_status(running, "cancelled")
    assert not store.diagnostics.request_cancel_diagnostic(running)  # already ended
    store.diagnostics.delete_diagnostic(running)
    assert running not in set(store.frames.diagnostics_frame()["id"]) and store.diagnostics.diagnostic_results(running).empty
    with pytest.raises(StorageError, match="no diagnosis"):
        store.diagnostics.delete_diagnostic(running)
