"""Metric rows (``storage.metrics``): writers and a polling reader that lose nothing,
incremental reads, ids never reused, and reads at the scale of 50 runs and 100k rows.

Tests that take the ``store`` or ``db_url`` fixture run on SQLite and on a throwaway
PostgreSQL (tests/conftest.py; skipped with the reason where no server can be started);
the rest are about SQLite files. Every database lives in tmp_path or that cluster."""

from __future__ import annotations

import math
import threading
import time

import pandas as pd
import pytest
from sqlalchemy import event, func, select, text

from storage import RunStore
from storage.models import Metric
from tests.support.runs import new_run
from tests.support.sqlite import sqlite_url


def test_concurrent_writers_and_polling_reader_lose_nothing(tmp_path):
    url = sqlite_url(tmp_path)
    setup = RunStore(url)
    run_ids = [new_run(setup, name=f"w{i}") for i in range(2)]
    n_rows, batch = 4000, 40
    names = ("train_loss", "val_loss")
    errors: list[BaseException] = []
    done = threading.Event()
    seen: list[pd.DataFrame] = []

    def expected(w, i):
        return (i // 2, 0.5 * i, names[i % 2], w * 1e6 + i + 0.125)

    def writer(w, run_id):
        st = RunStore(url)  # own engine and connections, like a separate process
        try:
            for start in range(0, n_rows, batch):
                st.metrics.add_metrics(run_id, [expected(w, i) for i in range(start, start + batch)])
                st.runs.heartbeat(run_id, start + batch)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)
        finally:
            st.close()

    def reader():
        st = RunStore(url)
        last = 0
        try:
            while True:
                finished = done.is_set()
                frame = st.metrics(run_ids, after_id=last)
                if len(frame):
                    assert frame["id"].is_monotonic_increasing and frame["id"].iloc[0] > last
                    last = int(frame["id"].iloc[-1])
                    seen.append(frame)
                if finished:
                    return
                time.sleep(0.005)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)
        finally:
            st.close()

    threads = [threading.Thread(target=writer, args=(w, rid)) for w, rid in enumerate(run_ids)]
    rt = threading.Thread(target=reader)
    rt.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    done.set()
    rt.join(60)
    assert not errors, errors
    assert len(seen) > 2  # the reader really polled while writing

    got = pd.concat(seen, ignore_index=True)
    assert got["id"].is_unique and got["id"].is_monotonic_increasing
    assert len(got) == 2 * n_rows
    everything = setup.metrics(run_ids)
    assert everything["id"].tolist() == got["id"].tolist()
    for w, run_id in enumerate(run_ids):
        mine = got[got["run_id"] == run_id]
        assert len(mine) == n_rows
        rows = list(zip(mine["step"], mine["wall_time"], mine["name"], mine["value"]))
        assert rows == [expected(w, i) for i in range(n_rows)]
    assert setup.runs.get_run(run_ids[0]).steps_done == n_rows
    setup.close()


def test_incremental_reads_return_exactly_the_newer_rows(store):
    a, b = new_run(store, "a"), new_run(store, "b")
    store.metrics.add_metrics(a, [(s, float(s), "train_loss", s / 10) for s in range(5)])
    store.metrics.add_metrics(b, [(s, float(s), "train_loss", -s) for s in range(5)])
    first = store.metrics([a, b])
    assert list(first.columns) == ["id", "run_id", "step", "wall_time", "name", "value"]
    assert len(first) == 10 and first["id"].is_monotonic_increasing
    last = int(first["id"].max())
    assert store.metrics([a, b], after_id=last).empty

    store.metrics.add_metrics(a, [(5, 5.0, "train_loss", 0.5), (5, 5.0, "val_loss", 0.7)])
    store.metrics.add_metrics(b, [(5, 5.0, "train_loss", -5.0)])
    newer = store.metrics([a, b], after_id=last)
    assert list(zip(newer["run_id"], newer["name"], newer["value"])) == [
        (a, "train_loss", 0.5), (a, "val_loss", 0.7), (b, "train_loss", -5.0)
    ]
    assert (newer["id"] > last).all()
    only_a = store.metrics([a], after_id=last)
    assert set(only_a["run_id"]) == {a} and len(only_a) == 2
    val = store.metrics([a, b], names=["val_loss"], after_id=0)
    assert val["value"].tolist() == [0.7]
    assert store.metrics([], after_id=0).empty
    assert store.metrics([a], names=[]).empty

    # NaN (a diverged loss) is stored and read back as NaN, not an error
    store.metrics.add_metrics(a, [(6, 6.0, "train_loss", float("nan"))])
    assert math.isnan(store.metrics([a], after_id=int(newer["id"].max()))["value"].iloc[0])


def test_metric_ids_are_never_reused_after_delete(store):
    a, b = new_run(store, "a"), new_run(store, "b")
    store.metrics.add_metrics(a, [(0, 0.0, "x", 1.0)])
    store.metrics.add_metrics(b, [(s, 0.0, "x", 1.0) for s in range(3)])
    high = int(store.metrics([b])["id"].max())
    store.runs.delete_run(b)
    assert store.metrics([b]).empty
    with store.engine.connect() as con:
        assert con.execute(select(func.count()).select_from(Metric).where(Metric.run_id == b)).scalar() == 0
    store.metrics.add_metrics(a, [(1, 1.0, "x", 2.0)])
    assert int(store.metrics([a])["id"].max()) > high


@pytest.fixture
def sqlite_store(tmp_path):
    s = RunStore(sqlite_url(tmp_path))
    yield s
    s.close()


def _statements(store, fn):
    """``fn()``'s result and the SQL statements it sent."""
    sent: list[str] = []
    listen = lambda conn, cursor, statement, *rest: sent.append(statement)  # noqa: E731
    event.listen(store.engine, "before_cursor_execute", listen)
    try:
        return fn(), sent
    finally:
        event.remove(store.engine, "before_cursor_execute", listen)


def test_polling_reads_by_index_with_50_runs_and_100k_metrics(sqlite_store):
    """The dashboard's reads stay cheap at scale by construction, not by a clock: the
    incremental poll is one indexed search (never a table scan), and the runs table and
    the full read send a fixed number of statements, whatever the number of runs.
    Their speed is measured in ``bench/fleet.py``."""
    store = sqlite_store
    run_ids = [new_run(store, f"r{i}") for i in range(50)]
    for rid in run_ids:
        store.metrics.add_metrics(rid, [(s // 2, float(s), ("train_loss", "val_loss")[s % 2], s * 1e-3) for s in range(2000)])
    with store.engine.connect() as con:
        plan = " ".join(str(r[-1]) for r in con.execute(text(
            "EXPLAIN QUERY PLAN SELECT id, run_id, step, wall_time, name, value FROM metrics "
            "WHERE run_id IN (1, 2, 3) AND id > 99000 ORDER BY id")))
    assert "SEARCH metrics USING INDEX ix_metrics_run_id_id" in plan and "SCAN metrics" not in plan, plan

    with store.engine.connect() as con:
        before = con.execute(text("SELECT max(id) FROM metrics")).scalar()
    store.metrics.add_metrics(run_ids[-1], [(1000, 1.0, "train_loss", 0.5)])
    frame, polls = _statements(store, lambda: store.metrics(run_ids, after_id=before))
    assert len(frame) == 1 and len([s for s in polls if "metrics" in s.lower()]) == 1, polls

    frame, few = _statements(store, lambda: store.frames.runs_frame())
    assert len(frame) == 50 and frame.set_index("id").loc[run_ids[-1], "last_train_loss"] == 0.5
    new_run(store, "r50")
    _, more = _statements(store, lambda: store.frames.runs_frame())
    assert len(more) == len(few), (few, more)  # no statement per run

    everything, reads = _statements(store, lambda: store.metrics(run_ids))
    assert len(everything) == 100_001 and len(reads) <= 2, reads
