"""Streamed exports: the metric rows are read and written a chunk at a time (memory bounded
by the chunk, not the table), and the file is byte for byte the whole-table one. The chunk
size is made tiny here, so a handful of rows makes many chunks. Every database lives in tmp_path."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from sqlalchemy import event

import storage.stream as stream
from storage import RunStore, StorageError, export_csv, long_frame, to_csv_bytes, wide_frame
from storage.export import LONG_COLUMNS, _run_info, csv_chunks, export_bytes, write_file
from tests.support.runs import new_run


@pytest.fixture
def store(tmp_path):
    s = RunStore(f"sqlite:///{tmp_path / 'lab.db'}")
    yield s
    s.close()


def _runs(store) -> list[int]:
    """Four runs of 0, 5, 12 and 30 rows: text that needs neutralising, a metric named as a
    column, NaN values and a sparse metric."""
    rng = np.random.default_rng(1)
    ids = []
    for i, n in enumerate((0, 5, 12, 30)):
        rid = new_run(store, f"=run {i}" if i % 2 else f"run {i}", seed=i,
                      config={"lr": 0.1 * (i + 1), "model": {"width": 8 * (i + 1)}, "note": "-x" if i else "x"})
        names = ("val_loss", "=cos", "step", "train_loss")
        rows = [(k // 4, 0.5 * k, names[k % 4], float(rng.normal()) if k % 7 else float("nan")) for k in range(n)]
        store.metrics.add_metrics(rid, rows)
        ids.append(rid)
    return ids


def _reference_long(store, ids) -> pd.DataFrame:
    """The long table as it was built before exports streamed: all rows in one frame."""
    runs = [store.runs.get_run(i) for i in ids]
    m = store.metrics(ids).merge(_run_info(runs, None), on="run_id", how="left")
    m = m.rename(columns={"name": "metric", "wall_time": "wall_time_s"}).sort_values(["run_id", "id"], kind="stable")
    return m[LONG_COLUMNS].reset_index(drop=True)


class Chunks:
    """Every frame the streamed reader yields (its run ids), and the metric queries issued."""

    def __init__(self, store, monkeypatch, rows: int, run_batch: int = 2):
        self.frames: list[list[int]] = []
        self.queries = 0
        monkeypatch.setattr(stream, "CHUNK_ROWS", rows)
        monkeypatch.setattr(stream, "RUN_BATCH", run_batch)
        made = stream.metrics_frame

        def recorded(rows_):
            frame = made(rows_)
            self.frames.append(frame["run_id"].tolist())
            return frame

        monkeypatch.setattr(stream, "metrics_frame", recorded)

        @event.listens_for(store.engine, "before_cursor_execute")
        def count(conn, cursor, statement, parameters, context, executemany):
            if statement.lstrip().upper().startswith("SELECT METRICS.ID"):
                self.queries += 1


def test_a_long_export_is_read_and_written_chunk_by_chunk_and_equals_the_whole_table(store, tmp_path, monkeypatch):
    ids = _runs(store)
    whole = to_csv_bytes(_reference_long(store, ids))
    chunks = Chunks(store, monkeypatch, rows=4)
    assert export_csv(store, tmp_path / "long.csv", ids, fmt="long") == 47
    assert (tmp_path / "long.csv").read_bytes() == whole
    assert len(chunks.frames) == 12 and max(map(len, chunks.frames)) == 4  # 47 rows, 4 at a time
    assert chunks.queries == 2  # four runs, two per query
    assert to_csv_bytes(long_frame(store, ids)) == whole
    assert b"".join(csv_chunks(store, ids, "long", size=1)) == whole == export_bytes(store, ids, "long")


def test_a_wide_export_pivots_whole_runs_per_chunk_and_equals_the_whole_table(store, tmp_path, monkeypatch):
    ids = _runs(store)
    whole = (tmp_path / "whole.csv")
    export_csv(store, whole, ids, fmt="wide")  # one chunk: every run at once
    back = pd.read_csv(whole)
    assert list(back.columns[-4:]) == ["'=cos", "metric.step", "train_loss", "val_loss"]
    chunks = Chunks(store, monkeypatch, rows=4)
    assert export_csv(store, tmp_path / "wide.csv", ids, fmt="wide") == len(back) == 2 + 3 + 8  # (run, step) rows
    assert len(chunks.frames) == 3
    assert [sorted(set(f)) for f in chunks.frames] == [[ids[1]], [ids[2]], [ids[3]]]  # a run is never split
    assert max(map(len, chunks.frames)) == 30  # a run larger than the chunk is a chunk of its own
    assert (tmp_path / "wide.csv").read_bytes() == whole.read_bytes() == to_csv_bytes(wide_frame(store, ids))


def test_lab_sized_chunks_hold_whole_runs_and_every_row_once(store, monkeypatch):
    ids = _runs(store)
    chunks = Chunks(store, monkeypatch, rows=20, run_batch=3)
    frames = list(store.metrics.chunks(ids, whole_runs=True))
    assert [sorted(set(f["run_id"])) for f in frames] == [[ids[1], ids[2]], [ids[3]]]  # 17 rows, then 30
    assert chunks.queries == 2
    got = pd.concat(frames, ignore_index=True)
    pd.testing.assert_frame_equal(got, store.metrics(ids).sort_values(["run_id", "id"], ignore_index=True))
    assert list(store.metrics.chunks(ids, names=[])) == []
    assert store.metrics.metric_names(ids[:2]) == ["=cos", "step", "train_loss", "val_loss"]
    assert store.metrics.metric_names([ids[0]]) == []


def test_an_error_while_streaming_leaves_no_file_and_no_temporary(store, tmp_path, monkeypatch):
    ids = _runs(store)
    Chunks(store, monkeypatch, rows=4)
    made = stream.metrics_frame
    seen = []

    def failing(rows):
        seen.append(len(rows))
        if len(seen) == 3:
            raise StorageError("database error on the third chunk")
        return made(rows)

    monkeypatch.setattr(stream, "metrics_frame", failing)
    with pytest.raises(StorageError, match="third chunk"):
        export_csv(store, tmp_path / "out.csv", ids)
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("lab.db")) == []


def test_write_file_writes_an_iterable_piece_by_piece(tmp_path):
    pieces = (f"line {i}\n".encode() for i in range(3))
    assert write_file(None, tmp_path / "f.txt", pieces) == tmp_path / "f.txt"
    assert (tmp_path / "f.txt").read_text() == "line 0\nline 1\nline 2\n"


def test_an_incremental_read_of_many_runs_each_at_its_own_mark(store, monkeypatch):
    ids = _runs(store)
    every = store.metrics(ids)
    marks = {rid: int(every.loc[every["run_id"] == rid, "id"].min()) if rid != ids[0] else 0 for rid in ids}
    want = every[every["id"] > every["run_id"].map(marks)].reset_index(drop=True)
    many = {**marks, **{10_000 + i: i for i in range(1_100)}}  # once an SQLite "expression tree is too large"
    pd.testing.assert_frame_equal(store.metrics.metrics_after(many), want)
    monkeypatch.setattr("storage.metrics.MARK_BATCH", 1)  # a query per mark: still one frame, by id
    pd.testing.assert_frame_equal(store.metrics.metrics_after(marks), want)
