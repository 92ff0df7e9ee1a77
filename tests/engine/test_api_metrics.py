"""``engine.api.Lab``'s metric reads: ``metrics_chunks`` yields frames of whole runs, a
chunk of rows at a time, and joined they are ``metrics`` (same columns, dtypes and order)."""

import dataclasses

import pandas as pd
import pytest

import storage.stream as stream
from engine.api import Lab
from storage import RunStore
from tests.support.runs import TINY, fake_run


@pytest.fixture
def url(tmp_path):
    store = RunStore(f"sqlite:///{tmp_path / 'api.db'}")
    for seed in (0, 1):
        fake_run(store, dataclasses.replace(TINY, estimator="exact", seed=seed), system=True)
        fake_run(store, dataclasses.replace(TINY, rank=8, seed=seed), system=True)
    store.runs.create_run(name="queued", config={}, estimator="exact", rank=None, lam=0.0, seed=0, preset="tiny", steps=1)
    store.close()
    return f"sqlite:///{tmp_path / 'api.db'}"


@pytest.mark.parametrize("where, names", [(None, None), ("estimator == exact", None), (None, ["val_loss", "cos_mean"]),
                                          ("rank == 8", "sys/load1")])
def test_metrics_chunks_joined_are_metrics(url, where, names):
    with Lab(url) as lab:
        whole = lab.metrics(where, names)
        assert len(whole)
        parts = list(lab.metrics_chunks(where, names, rows=3))
        assert len(parts) > 1
        pd.testing.assert_frame_equal(pd.concat(parts, ignore_index=True), whole)
        runs = [set(p["run_id"]) for p in parts]
        assert all(not (a & b) for i, a in enumerate(runs) for b in runs[i + 1:])  # a run is in one frame only
        columns = ["run_id", "run_name", "name", "step", "wall_time", "value"]
        assert all(list(p.columns) == columns for p in parts)


def test_metrics_is_read_chunk_by_chunk(url, monkeypatch):
    monkeypatch.setattr(stream, "CHUNK_ROWS", 10)
    made, sizes = stream.metrics_frame, []
    monkeypatch.setattr(stream, "metrics_frame", lambda rows: sizes.append(len(rows)) or made(rows))
    with Lab(url) as lab:
        whole = lab.metrics()
        assert len(sizes) == 4 and sum(sizes) == len(whole)  # one frame per run: each holds more than 10 rows
        assert whole["run_id"].is_monotonic_increasing and whole.groupby("run_id")["name"].is_monotonic_increasing.all()


def test_no_rows_is_no_chunk_and_an_empty_frame(url):
    with Lab(url) as lab:
        assert list(lab.metrics_chunks(names=[])) == [] and list(lab.metrics_chunks("status == queued")) == []
        empty = lab.metrics(names=[])
        assert empty.empty and list(empty.columns) == ["run_id", "run_name", "name", "step", "wall_time", "value"]
        with pytest.raises(ValueError, match="unknown field"):
            lab.metrics_chunks("rnak > 1")  # the filter is checked when asked, not when iterated
