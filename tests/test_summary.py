"""Run summaries and the Table 3 form, on a database written by hand."""

import dataclasses

import numpy as np
import pytest

from engine.summary import PAPER_TABLE3, run_summary, summarize, table3
from engine.config import RunConfig
from storage import RunStore

BASE = RunConfig(preset="paper", steps=20)


def _run(store, config, val_losses, saved=900.0, exact_saved=1000.0):
    run_id = store.create_run(
        name=config.label(), config=config.to_dict(), estimator=config.estimator,
        rank=None if config.estimator == "exact" else config.rank, lam=config.lam,
        seed=config.seed, preset=config.preset, steps=config.steps,
    )
    rows = [(0, 0.0, "mem_saved_bytes", saved), (0, 0.0, "mem_saved_bytes_exact", exact_saved)]
    rows += [(step, float(step), "val_loss", v) for step, v in val_losses.items()]
    rows += [(step, float(step), "train_loss", v + 0.5) for step, v in val_losses.items()]
    store.add_metrics(run_id, rows)
    return run_id


@pytest.fixture
def store(tmp_path):
    return RunStore(f"sqlite:///{tmp_path / 's.db'}")


def test_summary_takes_last_values_up_to_a_step_and_deltas_to_the_same_seed(store):
    exact0 = _run(store, dataclasses.replace(BASE, estimator="exact", seed=0), {10: 7.0, 20: 6.0}, saved=1000.0)
    exact1 = _run(store, dataclasses.replace(BASE, estimator="exact", seed=1), {10: 7.5, 20: 6.5}, saved=1000.0)
    r8 = _run(store, dataclasses.replace(BASE, rank=8, seed=1), {10: 8.0, 20: 6.75})
    other = _run(store, dataclasses.replace(BASE, rank=8, seed=1, lr=0.1), {10: 9.0, 20: 9.0})
    s = run_summary(store, [exact0, exact1, r8, other]).set_index("run_id")
    assert s.at[r8, "val_loss"] == 6.75 and s.at[r8, "train_loss"] == 7.25 and s.at[r8, "step"] == 20
    assert s.at[r8, "delta_val_vs_exact"] == pytest.approx(0.25)  # against seed 1, not seed 0
    assert np.isnan(s.at[other, "delta_val_vs_exact"])  # lr differs: no comparable exact run
    at10 = run_summary(store, [r8, exact1], at_step=10).set_index("run_id")
    assert at10.at[r8, "val_loss"] == 8.0 and at10.at[r8, "delta_val_vs_exact"] == pytest.approx(0.5)
    # the pure form ignores rows of other runs and other metric names
    records = [r for r in store.list_runs() if r.id in (r8, exact1)]
    noisy = store.metrics([exact0, exact1, r8, other])
    assert summarize(records, noisy).equals(run_summary(store, [r8, exact1]))


def test_table3_pools_seeds_within_a_config_only(store):
    ids = [
        _run(store, dataclasses.replace(BASE, estimator="exact", seed=0), {20: 6.0}, saved=1000.0),
        _run(store, dataclasses.replace(BASE, estimator="exact", seed=1), {20: 6.2}, saved=1000.0),
        _run(store, dataclasses.replace(BASE, rank=32, seed=0), {20: 6.1}, saved=500.0),
        _run(store, dataclasses.replace(BASE, rank=32, seed=1), {20: 6.5}, saved=500.0),
        _run(store, dataclasses.replace(BASE, rank=32, seed=0, steps=40), {20: 9.0}),
    ]
    t = table3(run_summary(store, ids))
    assert len(t) == 3  # the 40-step run is a config of its own
    r32 = t[(t["estimator"] == "basis") & (t["seeds"] == 2)].iloc[0]
    assert r32["val_loss"] == pytest.approx(6.3) and r32["val_loss_std"] == pytest.approx(np.std([6.1, 6.5], ddof=1))
    assert r32["delta_vs_exact"] == pytest.approx(np.mean([0.1, 0.3]))
    assert r32["compression"] == pytest.approx(2.0)
    assert r32["paper_val_loss"] == PAPER_TABLE3[32]
    exact = t[t["estimator"] == "exact"].iloc[0]
    assert exact["paper_val_loss"] == PAPER_TABLE3[None] and exact["delta_vs_exact"] == pytest.approx(0.0)
