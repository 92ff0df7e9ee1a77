"""The per-batch losses of every evaluation (``storage.eval_losses``): written with a record's
metrics in one transaction, stored once per (run, step, split), NaN as null, truncated with
the metrics on resume, fenced by the lease, and gone with their run.

Every test takes the ``store`` fixture: it runs on SQLite and on a throwaway PostgreSQL
(tests/conftest.py; skipped with the reason where no server can be started)."""

from __future__ import annotations

import numpy as np
import pytest
from sqlalchemy import select

from storage import EvalLosses, InvalidValueError, LeaseLostError
from tests.support.runs import new_run


def _losses(store, run_id, split="val"):
    """``{step: losses as a list}`` of the run's rows on ``split`` (NaN as "nan", so lists compare)."""
    frame = store.eval_losses([run_id], split=split)
    return {int(s): ["nan" if np.isnan(x) else float(x) for x in a] for s, a in zip(frame["step"], frame["losses"])}


def test_losses_round_trip_as_float64_arrays_by_run_and_step(store):
    a, b = new_run(store, "a"), new_run(store, "b")
    val0 = np.array([10.5, 10.25, 10.75], dtype=np.float32)
    store.metrics.add_metrics(a, [(0, 0.1, "val_loss", float(val0.astype(np.float64).mean()))],
                      eval_losses=[(0, "val", val0)])
    store.metrics.add_metrics(b, [(3, 0.2, "val_loss", 4.0)], eval_losses=[(3, "val", [3.0, 5.0])])
    store.metrics.add_metrics(a, [(2, 0.3, "val_loss", 1.0)], eval_losses=[(2, "val", [1.0, float("nan"), float("inf")]),
                                                                    (2, "test", [7.0])])
    frame = store.eval_losses([b, a])
    assert list(frame.columns) == ["run_id", "step", "losses"]
    assert [(int(r), int(s)) for r, s in zip(frame["run_id"], frame["step"])] == [(a, 0), (a, 2), (b, 3)]
    assert str(frame["run_id"].dtype) == str(frame["step"].dtype) == "int64"
    first = frame["losses"].iloc[0]
    assert isinstance(first, np.ndarray) and first.dtype == np.float64
    np.testing.assert_array_equal(first, val0)  # float32 values come back exactly
    assert first.mean() == store.metrics([a], names=["val_loss"])["value"].iloc[0]
    # a non-finite loss is stored as null and read back as NaN; the row keeps every batch
    assert _losses(store, a) == {0: [10.5, 10.25, 10.75], 2: [1.0, "nan", "nan"]}
    with store.db.session() as s:
        assert s.execute(select(EvalLosses.losses).where(EvalLosses.run_id == a, EvalLosses.step == 2,
                                                         EvalLosses.split == "val")).scalar() == [1.0, None, None]
    assert _losses(store, a, split="test") == {2: [7.0]}
    empty = store.eval_losses([])
    assert empty.empty and list(empty.columns) == ["run_id", "step", "losses"]
    assert store.eval_losses(a, split="none").empty


def test_a_stored_step_is_kept_and_a_resume_replaces_what_it_deletes(store):
    """As for metrics: a second write of a (step, split) (a retried write) changes nothing;
    ``delete_metrics_after`` (a resume) deletes the losses past its step with the metrics,
    and the recomputed ones are then stored."""
    a, b = new_run(store, "a"), new_run(store, "b")
    for step in (0, 2, 4):
        store.metrics.add_metrics(a, [(step, 0.0, "val_loss", float(step))], eval_losses=[(step, "val", [step, step + 1.0])])
    store.metrics.add_metrics(b, [(4, 0.0, "val_loss", 9.0)], eval_losses=[(4, "val", [9.0])])
    store.metrics.add_metrics(a, [(4, 0.0, "val_loss", 99.0)], eval_losses=[(4, "val", [99.0, 99.0])])
    store.eval_losses.add_eval_losses(a, [(4, "val", [98.0])])
    assert _losses(store, a)[4] == [4.0, 5.0]

    assert store.metrics.delete_metrics_after(a, 2) == 1
    assert sorted(_losses(store, a)) == [0, 2] and _losses(store, b) == {4: [9.0]}  # another run's rows stay
    store.metrics.add_metrics(a, [(4, 0.0, "val_loss", 3.5)], eval_losses=[(4, "val", [3.0, 4.0])])
    assert _losses(store, a) == {0: [0.0, 1.0], 2: [2.0, 3.0], 4: [3.0, 4.0]}

    assert store.eval_losses.delete_eval_losses_after(a, 0) == 2  # the repository's own truncation
    assert _losses(store, a) == {0: [0.0, 1.0]}
    store.metrics.delete_metrics_after(a, -1)  # a restart from step 0 deletes step 0's too
    assert _losses(store, a) == {}


def test_a_record_is_stored_whole_or_not_at_all(store):
    a = new_run(store, "a")
    old = store.queue.claim(a, "host:1")
    store.runs.set_status(a, "interrupted")
    store.queue.requeue([a])
    new = store.queue.claim(a, "host:2")
    with pytest.raises(LeaseLostError):  # an owner that lost the run writes neither part
        store.metrics.add_metrics(a, [(2, 0.0, "val_loss", 1.0)], eval_losses=[(2, "val", [1.0])], epoch=old)
    with pytest.raises(LeaseLostError):
        store.eval_losses.add_eval_losses(a, [(2, "val", [1.0])], epoch=old)
    with pytest.raises(InvalidValueError, match="split"):  # refused before anything is written
        store.metrics.add_metrics(a, [(2, 0.0, "val_loss", 1.0)], eval_losses=[(2, "x" * 17, [1.0])], epoch=new)
    assert store.metrics([a]).empty and store.eval_losses([a]).empty
    store.metrics.add_metrics(a, [(2, 0.0, "val_loss", 1.0)], eval_losses=[(2, "val", [1.0])], epoch=new)
    assert _losses(store, a) == {2: [1.0]} and len(store.metrics([a])) == 1


def test_deleting_a_run_deletes_its_losses(store):
    a, b = new_run(store, "a"), new_run(store, "b")
    for run_id in (a, b):
        store.metrics.add_metrics(run_id, [(0, 0.0, "val_loss", 1.0)], eval_losses=[(0, "val", [1.0, 1.0])])
    store.runs.delete_run(a)
    assert store.eval_losses([a]).empty and _losses(store, b) == {0: [1.0, 1.0]}
    with store.db.session() as s:
        assert s.execute(select(EvalLosses.run_id)).scalars().all() == [b]
