"""Run rows (``storage.runs`` and the runs frame): their fields, rename, notes, delete and
resolve, uids, sweeps, tags and checkpoint steps, ids never reused.

Tests that take the ``store`` or ``db_url`` fixture run on SQLite and on a throwaway
PostgreSQL (tests/conftest.py; skipped with the reason where no server can be started);
the rest are about SQLite files. Every database lives in tmp_path or that cluster."""

from __future__ import annotations

from datetime import timedelta

import pandas as pd
import pytest

from storage import RunNotFoundError, StorageError
from tests.support.runs import new_run


def test_runs_frame_and_record_fields(store):
    a = new_run(store, "a", versions={"jax": "0.4"}, git_commit="abc123", device="cpu")
    b = new_run(store, "b", rank=None)
    store.metrics.add_metrics(a, [(1, 1.0, "train_loss", 3.0), (2, 2.0, "train_loss", 2.0), (1, 1.0, "val_loss", 4.0),
                          (2, 2.0, "cos_mean", 0.9)])
    rec = store.runs.get_run(a)
    assert rec.config["model"] == {"width": 64, "depth": 2} and rec.versions == {"jax": "0.4"}
    assert rec.created_at.tzinfo is not None and rec.created_at.utcoffset() == timedelta(0)
    assert (rec.git_commit, rec.device, rec.status, rec.rank) == ("abc123", "cpu", "queued", 8)
    frame = store.frames.runs_frame()
    assert frame["id"].tolist() == [a, b]
    assert {"config", "versions"}.isdisjoint(frame.columns)
    for col in ("name", "status", "created_at", "heartbeat_at", "estimator", "rank", "lam", "seed", "preset",
                "steps", "steps_done", "error", "notes", "git_commit", "device", "owner", "cancel_requested"):
        assert col in frame.columns
    row = frame.set_index("id").loc[a]
    assert (row["last_train_loss"], row["last_val_loss"], row["last_mean_cos"]) == (2.0, 4.0, 0.9)
    assert frame.set_index("id").loc[b, ["last_train_loss", "last_val_loss"]].isna().all()
    assert pd.isna(frame.set_index("id").loc[b, "rank"])
    assert str(frame["created_at"].dt.tz) == "UTC"


def test_rename_notes_delete_and_resolve(store):
    a, b, c = new_run(store, "alpha"), new_run(store, "beta"), new_run(store, "beta")
    store.metrics.add_metrics(a, [(0, 0.0, "train_loss", 1.0)])
    store.runs.rename_run(a, "gamma")
    store.runs.set_notes(a, "lr too high")
    rec = store.runs.get_run(a)
    assert (rec.name, rec.notes) == ("gamma", "lr too high")
    assert store.runs.resolve_runs(["gamma", str(b), a]) == [a, b]
    with pytest.raises(StorageError, match="ambiguous"):
        store.runs.resolve_runs(["beta"])
    with pytest.raises(StorageError, match="list the runs"):
        store.runs.resolve_runs(["nope"])
    with pytest.raises(StorageError, match=r"no run 999; list the runs to see their ids"):
        store.runs.get_run(999)
    with pytest.raises(KeyError):
        store.runs.get_run(999)
    store.queue.claim(c, "worker-host:1")
    with pytest.raises(StorageError, match="cancel it first") as info:
        store.runs.delete_run(c)
    assert "python -m" not in str(info.value)  # storage names no CLI
    store.runs.delete_run(a)
    assert [r.id for r in store.runs.list_runs()] == [b, c]
    assert store.metrics([a]).empty
    with pytest.raises(RunNotFoundError):
        store.metrics.add_metrics(a, [(1, 1.0, "x", 1.0)])


def test_run_ids_are_never_reused_after_delete(store):
    ids = [new_run(store, f"r{i}") for i in range(3)]
    assert ids == [1, 2, 3]
    store.runs.delete_run(3)
    assert new_run(store, "new") == 4


def test_uid_sweep_tags_checkpoint_fields(store):
    a = new_run(store, "a", sweep_id="sweep-1", tags=["paper", "table3", "paper"])
    b = new_run(store, "b")
    ra, rb = store.runs.get_run(a), store.runs.get_run(b)
    assert len(ra.uid) == 32 and int(ra.uid, 16) >= 0 and ra.uid != rb.uid
    assert (ra.sweep_id, ra.tags, ra.checkpoint_step, ra.worker_id) == ("sweep-1", ["paper", "table3"], None, None)
    assert (rb.sweep_id, rb.tags) == (None, [])
    store.runs.set_tags(a, [" x ", "y"])
    store.runs.set_checkpoint_step(a, 200)
    ra2 = store.runs.get_run(a)
    assert (ra2.tags, ra2.checkpoint_step, ra2.uid) == (["x", "y"], 200, ra.uid)
    with pytest.raises(ValueError, match="tag cannot be empty"):
        store.runs.set_tags(a, ["ok", " "])
    assert store.runs.get_run(a).tags == ["x", "y"]
    with pytest.raises(RunNotFoundError):
        store.runs.set_tags(999, ["x"])
    with pytest.raises(RunNotFoundError):
        store.runs.set_checkpoint_step(999, 1)
    frame = store.frames.runs_frame().set_index("id")
    assert frame.loc[a, "uid"] == ra.uid and frame.loc[a, "sweep_id"] == "sweep-1"
    assert frame.loc[a, "tags"] == ["x", "y"] and frame.loc[a, "checkpoint_step"] == 200
    assert pd.isna(frame.loc[b, "checkpoint_step"]) and frame.loc[b, "tags"] == []
    # a deleted run's uid is never handed out again, even where its id could be
    store.runs.delete_run(b)
    assert store.runs.get_run(new_run(store, "c")).uid not in {ra.uid, rb.uid}
