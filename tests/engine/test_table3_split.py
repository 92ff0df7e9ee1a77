"""Table 3 read on the held-out test split where every run recorded one, and with free run
fields (a tuned lr) that belong to the method (issue 40's reading side): records and metric
frames built by hand, as ``RunsRepository.runs.list_runs`` and ``RunStore.metrics`` return them."""

import math
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from engine.analysis.summary import (
    TABLE3_COLUMNS,
    display_frame,
    noise_note,
    notes,
    render,
    summarize,
    table3,
)
from engine.config import RunConfig, comparable_key
from engine.core.stats import EQUIVALENT, NO_PAIR, WORSE
from engine.reads.queries import run_table3
from storage import RunStore
from tests.engine.test_summary import _run

BASE = RunConfig(preset="paper", steps=400)
SEEDS = range(5)
STEP = 400
# seed noise shared by both methods of a seed (paired), and a small per-seed wobble of Δ
EXACT_VAL = [6.00, 6.03, 5.98, 6.05, 6.01]
WOBBLE = [0.001, -0.001, 0.0005, -0.0005, 0.0]


class Lab:
    """Run records and their metrics, as a store returns them."""

    def __init__(self):
        self.records, self.rows, self.batches = [], [], {"val": [], "test": []}

    def run(self, estimator, seed, val, test=None, *, lr=0.01, status="finished", test_steps=(STEP,)):
        config = BASE.replace(estimator=estimator, seed=seed, lr=lr)
        run_id = len(self.records) + 1
        self.records.append(SimpleNamespace(
            id=run_id, name=config.label(), status=status, estimator=estimator,
            rank=None if estimator == "exact" else config.rank, lam=config.lam, seed=seed, preset=config.preset,
            config=config.to_dict(), steps_done=STEP, error=None))
        self._metric(run_id, 0, "mem_saved_bytes", 1000.0 if estimator == "exact" else 900.0)
        self._metric(run_id, 0, "mem_saved_bytes_exact", 1000.0)
        for step, value in ((0, 9.0), (200, val + 0.5), (STEP, val)):
            self._metric(run_id, step, "val_loss", value)
            self._metric(run_id, step, "train_loss", value + 0.3)
        for step in test_steps if test is not None else ():
            self._metric(run_id, step, "test_loss", test)
        return run_id

    def _metric(self, run_id, step, name, value):
        self.rows.append((len(self.rows) + 1, run_id, step, float(step), name, float(value)))

    def losses(self, run_id, split, values):
        self.batches[split].append((run_id, STEP, np.asarray(values, dtype=float)))

    @property
    def metrics(self):
        return pd.DataFrame(self.rows, columns=["id", "run_id", "step", "wall_time", "name", "value"])

    def eval_losses(self, split):
        return pd.DataFrame(self.batches[split], columns=["run_id", "step", "losses"])


def _paired(lab, test_shift=0.2, exact_test=True, basis_test=True, **basis):
    """Exact and basis on five seeds: on validation basis is Δ ≈ 0 (equivalent), on test Δ ≈
    ``test_shift`` (worse); ``*_test`` False: that method records no test loss."""
    ids = {}
    for s in SEEDS:
        e, b = EXACT_VAL[s], EXACT_VAL[s] + WOBBLE[s]
        ids["exact", s] = lab.run("exact", s, e, e + 0.1 if exact_test else None)
        ids["basis", s] = lab.run("basis", s, b, e + 0.1 + test_shift + 3 * WOBBLE[s] if basis_test else None, **basis)
    return ids


def _row(table, estimator):
    rows = table[table["estimator"] == estimator]
    assert len(rows) == 1, table
    return rows.iloc[0]


def test_auto_reads_the_test_split_where_every_run_recorded_it_and_judges_on_it():
    lab = Lab()
    _paired(lab)
    val = table3(lab.records, lab.metrics, split="val")
    auto = table3(lab.records, lab.metrics)
    assert list(auto.columns) == TABLE3_COLUMNS and TABLE3_COLUMNS[-3:] == ["split", "split_note", "tuned"]
    assert set(auto["split"]) == {"test"} and set(val["split"]) == {"val"}
    assert _row(val, "basis")["verdict"] == EQUIVALENT and _row(auto, "basis")["verdict"] == WORSE
    basis = _row(auto, "basis")
    assert basis["delta_val_mean"] == pytest.approx(0.2, abs=1e-9)
    assert basis["val_loss_mean"] == pytest.approx(np.mean(EXACT_VAL) + 0.3, abs=1e-9)
    assert _row(auto, "exact")["val_loss_mean"] == pytest.approx(np.mean(EXACT_VAL) + 0.1)
    assert basis["step"] == STEP and "Read at step 400" in basis["read"]
    said = "Read on the held-out test split: every run recorded it at step 400."
    assert said in notes(auto) and said not in notes(val)
    shown = display_frame(auto)
    assert list(shown["split"]) == ["test", "test"] and list(shown.columns).index("split") == list(shown.columns).index("step") + 1
    assert "split" not in display_frame(val).columns
    assert said in render(auto) and "evaluated split's own batches" in noise_note(auto)
    assert (auto["seeds"] == 5).all() and (auto["paired_seeds"] == [0, 5]).all()


def test_the_read_step_is_chosen_on_validation_even_where_test_is_recorded_further():
    lab = Lab()
    _paired(lab)
    lab.records[0].status = "running"  # exact s0 validated to 400 and recorded a test loss at 600 only
    lab.rows = [r for r in lab.rows if not (r[1] == 1 and r[4] == "test_loss")]
    lab._metric(1, 600, "test_loss", 6.1)
    t = table3(lab.records, lab.metrics)
    assert set(t["step"]) == {STEP} and set(t["split"]) == {"val"}
    assert "run #1 recorded it at other steps, not at step 400" in t["split_note"].iloc[0]


def test_one_run_without_a_test_loss_reads_the_group_on_validation_and_says_which():
    lab = Lab()
    ids = _paired(lab)
    old = ids["basis", 3]
    lab.rows = [r for r in lab.rows if not (r[1] == old and r[4] == "test_loss")]
    t = table3(lab.records, lab.metrics)
    assert set(t["split"]) == {"val"} and _row(t, "basis")["verdict"] == EQUIVALENT
    said = f"Read on validation: run #{old} recorded no test loss (older version, or test_tokens=0), so the table reads validation."
    assert said in notes(t)
    assert "split" not in display_frame(t).columns
    asked = table3(lab.records, lab.metrics, split="test")  # asked for: still validation, and said so
    assert set(asked["split"]) == {"val"}
    assert any(n.startswith("The test split was asked for, but read on validation") and f"#{old}" in n
               for n in notes(asked))
    # a run still training has not evaluated the test split yet
    lab.records[old - 1].status = "running"
    assert "not finished" in table3(lab.records, lab.metrics)["split_note"].iloc[0]


def test_split_val_ignores_test_losses_and_runs_without_them_read_as_before():
    lab = Lab()
    _paired(lab)
    val = table3(lab.records, lab.metrics, split="val")
    without = lab.metrics[lab.metrics["name"] != "test_loss"]
    pd.testing.assert_frame_equal(val, table3(lab.records, without, split="val"))
    pd.testing.assert_frame_equal(table3(lab.records, without), val)  # the default reads older runs as before
    assert not val["split_note"].astype(bool).any() and not val["tuned"].astype(bool).any()
    assert notes(table3(lab.records, without)) == notes(val)
    with pytest.raises(ValueError, match="auto"):
        table3(lab.records, lab.metrics, split="holdout")


def test_summarize_carries_the_test_loss_at_its_step():
    lab = Lab()
    _paired(lab)
    s = summarize(lab.records, lab.metrics)
    assert s["test_loss"].tolist() == pytest.approx([v for e in EXACT_VAL for v in (e + 0.1, e + 0.3)], abs=0.01)
    assert s.loc[0, "test_loss"] == pytest.approx(EXACT_VAL[0] + 0.1)
    assert summarize(lab.records, lab.metrics, at_step=200)["test_loss"].isna().all()


def test_free_fields_pair_each_method_at_its_own_tuned_value():
    lab = Lab()
    for s in SEEDS:
        lab.run("exact", s, EXACT_VAL[s], lr=0.03)
        lab.run("basis", s, EXACT_VAL[s] + WOBBLE[s], lr=0.1)
    apart = table3(lab.records, lab.metrics)
    assert len(apart) == 2 and set(apart["setup"]) == {"lr=0.03", "lr=0.1"}
    assert _row(apart, "basis")["paired_seeds"] == 0 and _row(apart, "basis")["verdict"] == NO_PAIR
    tuned = table3(lab.records, lab.metrics, free=("lr",))
    assert set(tuned["setup"]) == {""} and _row(tuned, "basis")["paired_seeds"] == 5
    assert _row(tuned, "basis")["verdict"] == EQUIVALENT
    assert _row(tuned, "exact")["tuned"] == "lr=0.03" and _row(tuned, "basis")["tuned"] == "lr=0.1"
    shown = display_frame(tuned)
    assert list(shown["tuned"]) == ["lr=0.03", "lr=0.1"] and list(shown.columns).index("tuned") == list(shown.columns).index("λ") + 1
    assert "tuned" not in display_frame(apart).columns
    # several values among a method's runs: every one is listed
    lab.records[-1].config = {**lab.records[-1].config, "lr": 0.0316}
    assert _row(table3(lab.records, lab.metrics, free=("lr",)), "basis")["tuned"] == "lr=0.0316, 0.1"


def test_free_fields_unknown_to_a_run_are_refused_naming_the_real_valued_ones():
    config = BASE.to_dict()
    assert comparable_key(config, ()) == comparable_key(config)
    assert comparable_key(config, ("lr",)) == comparable_key({**config, "lr": 0.5}, ("lr",))
    assert comparable_key(config) != comparable_key({**config, "lr": 0.5})
    with pytest.raises(ValueError, match="lam, lr, momentum, weight_decay"):
        comparable_key(config, ("learning_rate",))
    with pytest.raises(ValueError, match="learning_rate"):
        table3([], pd.DataFrame(columns=["id", "run_id", "step", "wall_time", "name", "value"]),
               free=("learning_rate",))


def test_the_test_batches_feed_the_interval_of_a_group_read_on_test():
    lab = Lab()
    ids = _paired(lab)
    rng = np.random.default_rng(40)
    B = 16
    effect = rng.normal(0, 0.05, B)
    for s in SEEDS:
        base = 6.1 + rng.normal(0, 0.3, B)
        lab.losses(ids["exact", s], "test", base)
        lab.losses(ids["basis", s], "test", base + 0.2 + effect + rng.normal(0, 0.01, B))
        lab.losses(ids["basis", s], "val", base[:8])  # validation batches: not what a test read uses
        lab.losses(ids["exact", s], "val", base[:8])
    with_batches = _row(table3(lab.records, lab.metrics, batches=lab.eval_losses("val"),
                               test_batches=lab.eval_losses("test")), "basis")
    assert with_batches["val_batches"] == B and with_batches["delta_val_se_batch"] > 0
    seeds_only = _row(table3(lab.records, lab.metrics, batches=lab.eval_losses("val")), "basis")
    assert seeds_only["val_batches"] == 0 and math.isnan(seeds_only["delta_val_se_batch"])
    on_val = _row(table3(lab.records, lab.metrics, split="val", batches=lab.eval_losses("val"),
                         test_batches=lab.eval_losses("test")), "basis")
    assert on_val["val_batches"] == 8


def test_run_table3_reads_the_test_batches_from_the_store_only_when_a_run_has_a_test_loss(tmp_path, monkeypatch):
    store = RunStore(f"sqlite:///{tmp_path / 's.db'}")
    rng = np.random.default_rng(7)
    for s in SEEDS:
        base = 6.1 + rng.normal(0, 0.3, 8)
        for estimator, shift in (("exact", 0.0), ("basis", 0.2 + WOBBLE[s])):
            run_id = _run(store, BASE.replace(estimator=estimator, seed=s), {0: 9.0, STEP: EXACT_VAL[s] + WOBBLE[s]})
            store.runs.set_status(run_id, "finished")
            store.metrics.add_metrics(run_id, [(STEP, float(STEP), "test_loss", float((base + shift).mean()))])
            store.eval_losses.add_eval_losses(run_id, [(STEP, "test", (base + shift + rng.normal(0, 0.01, 8)).tolist())])
    splits = []
    real = store.eval_losses

    def spy(ids, split="val"):
        splits.append(split)
        return real(ids, split=split)

    monkeypatch.setattr(store, "eval_losses", spy)
    t = run_table3(store)
    assert splits == ["val", "test"] and set(t["split"]) == {"test"} and _row(t, "basis")["verdict"] == WORSE
    assert _row(t, "basis")["val_batches"] == 8
    splits.clear()
    assert set(run_table3(store, split="val")["split"]) == {"val"} and splits == ["val"]
    splits.clear()
    tuned = run_table3(store, free=("lr",))
    assert set(tuned["tuned"]) == {"lr=0.01"} and splits == ["val", "test"]


def test_the_loss_columns_are_headed_by_the_split_their_rows_read():
    """A table that read the test split never heads its numbers "val": every row on test reads
    ``test loss``; mixed rows read ``loss`` beside the ``split`` column; validation alone ``val loss``."""
    from engine.analysis.table3_text import loss_headings

    assert loss_headings(["val", "val"]) == ("val loss", "Δ val vs exact")
    assert loss_headings(["test", "test"]) == ("test loss", "Δ test vs exact")
    assert loss_headings(["test", "val"]) == ("loss", "Δ loss vs exact")
    assert loss_headings(["", "val"]) == ("val loss", "Δ val vs exact")  # rows read nowhere yet
