"""``MetricsFeed`` (``storage.feed``): a live reader that sees every committed metric row
exactly once, whatever the commit order, and re-reads a replaced history.

Tests that take the ``store`` or ``db_url`` fixture run on SQLite and on a throwaway
PostgreSQL (tests/conftest.py; skipped with the reason where no server can be started);
the rest are about SQLite files. Every database lives in tmp_path or that cluster."""

from __future__ import annotations

import threading
import time

import pandas as pd
import pytest
from sqlalchemy import insert, select

from storage import MetricsFeed, RunNotFoundError, RunStore
from storage.db import write_engine
from storage.models import Metric, Run
from tests.support.runs import new_run


def test_feed_sees_writers_that_commit_out_of_order_exactly_once(db_url):
    """Writer A takes its ids first but commits last; the feed polls in between."""
    store = RunStore(db_url)
    a, b = new_run(store, "a"), new_run(store, "b")
    feed = MetricsFeed()
    rows_a = [{"run_id": a, "step": s, "wall_time": float(s), "name": "train_loss", "value": 10.0 + s} for s in range(3)]
    rows_b = [(s, float(s), "train_loss", 20.0 + s) for s in range(3)]
    b_done = threading.Event()
    writer_b = RunStore(db_url)

    def write_b():
        writer_b.metrics.add_metrics(b, rows_b)
        b_done.set()

    with write_engine(store.engine).begin() as con:  # writer A, holding its transaction open
        con.execute(select(Run.id).where(Run.id == a).with_for_update())
        con.execute(insert(Metric.__table__), rows_a)
        t = threading.Thread(target=write_b)
        t.start()
        committed_b = b_done.wait(5)  # PostgreSQL: B commits now; SQLite: B waits for A's write lock
        assert committed_b == (store.engine.dialect.name == "postgresql")
        first = feed.poll(store, [a, b])
        assert first["run_id"].tolist() == ([b] * 3 if committed_b else [])
    t.join(60)
    assert b_done.is_set()
    second = feed.poll(store, [a, b])
    seen = pd.concat([first, second], ignore_index=True)
    everything = store.metrics([a, b])
    assert len(everything) == 6 and sorted(seen["id"]) == sorted(everything["id"])  # all of them, once
    assert feed.frame["id"].tolist() == everything["id"].tolist()
    assert feed.poll(store, [a, b]).empty
    if committed_b:
        # A's ids are below B's: one global "largest id seen" would have skipped A for good
        ids_a, ids_b = everything[everything.run_id == a]["id"], everything[everything.run_id == b]["id"]
        assert ids_a.max() < ids_b.min()
        assert store.metrics([a, b], after_id=int(first["id"].max()))["run_id"].tolist() == []
    writer_b.close()
    store.close()


def test_feed_under_concurrent_writers_misses_nothing(db_url):
    setup = RunStore(db_url)
    run_ids = [new_run(setup, f"w{i}") for i in range(3)]
    n_rows, batch = 300, 10
    errors: list[BaseException] = []
    done = threading.Event()
    seen: list[pd.DataFrame] = []

    def writer(w, run_id):
        st = RunStore(db_url)
        try:
            for start in range(0, n_rows, batch):
                st.metrics.add_metrics(run_id, [(i, 0.5 * i, "train_loss", w * 1e6 + i) for i in range(start, start + batch)])
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)
        finally:
            st.close()

    def reader():
        st = RunStore(db_url)
        feed = MetricsFeed()
        try:
            while True:
                finished = done.is_set()
                seen.append(feed.poll(st, run_ids))
                if finished:
                    return
                time.sleep(0.002)
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
        t.join(120)
    done.set()
    rt.join(120)
    assert not errors, errors
    got = pd.concat(seen, ignore_index=True)
    assert got["id"].is_unique and len(got) == 3 * n_rows
    for w, rid in enumerate(run_ids):
        mine = got[got.run_id == rid].sort_values("id")
        assert mine["step"].tolist() == list(range(n_rows))
        assert mine["value"].tolist() == [w * 1e6 + i for i in range(n_rows)]
    setup.close()


def test_feed_rereads_a_run_whose_history_was_replaced(store):
    a, b = new_run(store, "a"), new_run(store, "b")
    store.metrics.add_metrics(a, [(s, float(s), "train_loss", 1.0 + s) for s in range(10)])
    store.metrics.add_metrics(b, [(0, 0.0, "train_loss", 5.0)])
    feed = MetricsFeed()
    assert len(feed.poll(store, [a, b])) == 11 and feed.replaced == frozenset()

    assert store.metrics.delete_metrics_after(a, 4) == 5  # resume from the checkpoint at step 4
    assert store.runs.get_run(a).history_version == 1 and store.runs.get_run(b).history_version == 0
    store.metrics.add_metrics(a, [(s, float(s), "train_loss", 100.0 + s) for s in range(5, 8)])
    store.metrics.add_metrics(b, [(1, 1.0, "train_loss", 6.0)])
    new = feed.poll(store, [a, b])
    assert feed.replaced == frozenset({a})
    assert sorted(new[new.run_id == a]["step"]) == list(range(8))  # the whole new history of a
    assert new[new.run_id == b]["step"].tolist() == [1]  # b stays incremental
    mine = feed.frame[feed.frame.run_id == a].sort_values("step")
    assert mine["step"].tolist() == list(range(8))  # no stale step 5..9, no duplicates
    assert mine["value"].tolist() == [1.0 + s for s in range(5)] + [100.0 + s for s in range(5, 8)]
    assert len(feed.frame) == 10 and feed.frame["id"].is_unique
    assert feed.poll(store, [a, b]).empty and feed.replaced == frozenset()
    # runs no longer asked for, or deleted, are forgotten
    store.runs.delete_run(b)
    feed.poll(store, [a, b])
    assert set(feed.frame["run_id"]) == {a} and set(feed.marks()) == {a}
    with pytest.raises(RunNotFoundError):
        store.metrics.delete_metrics_after(999, 0)
