"""The dashboard's logic without Streamlit: form parsing, grouping, smoothing, pooling,
the incremental metrics cache, memory and summary frames, and the time estimate."""

import dataclasses
import math
from datetime import datetime, timedelta, timezone

import numpy as np
import pandas as pd
import pytest

from app import form, tables
from engine.analysis import charts, frames
from engine.analysis.summary import MIB, display_frame, paper_note
from engine.config import ConfigError, RunConfig, parse_ranks, parse_seeds
from engine.core.estimators import REGISTRY
from engine.core.text import plain
from engine.core.units import format_seconds
from engine.reads import estimates
from engine.reads.queries import run_summary, run_table3
from engine.training import timing
from storage import MetricsFeed, RunStore
from tests.support.runs import TINY, fake_run


@pytest.fixture
def store(tmp_path):
    s = RunStore(f"sqlite:///{tmp_path / 'logic.db'}")
    yield s
    s.close()


# ----------------------------------------------------------------------------- launch form


def test_parse_seeds_accepts_lists_and_ranges():
    assert parse_seeds("0") == [0]
    assert parse_seeds("0, 1,2") == [0, 1, 2]
    assert parse_seeds("3 1 3") == [3, 1]
    assert parse_seeds("0-3,7") == [0, 1, 2, 3, 7]


@pytest.mark.parametrize("text, message", [
    ("", "seeds: give at least one seed"),
    ("a", "seeds: 'a' is not a seed"),
    ("4-2", "seeds: range '4-2' is empty"),
    ("99999999999999999999", r"seed must be an integer in \[0, 4294967296\)"),
])
def test_parse_seeds_names_the_field(text, message):
    with pytest.raises(ConfigError, match=message):
        parse_seeds(text)


def test_parse_ranks_takes_exactly_what_is_typed():
    assert parse_ranks("8") == (False, [8])  # not 8 and 128
    assert parse_ranks("3") == (False, [3])  # not 32
    assert parse_ranks("32, 8 ,1, 8") == (False, [32, 8, 1])
    assert parse_ranks("exact, 1") == (True, [1])
    with pytest.raises(ConfigError, match=r"ranks: 'x' is neither 'exact' nor an integer >= 1"):
        parse_ranks("x")
    with pytest.raises(ConfigError, match=r"ranks: 0 is not an integer >= 1"):
        parse_ranks("0")


def _form(**changes):
    values = form.values_of(form.DEFAULT_SWEEP)
    values.update(changes)
    return form.to_sweep(values)


def test_form_sweep_one_run_per_estimator_rank_seed_and_exact_once_per_seed():
    configs = _form(estimators=["exact", "basis", "countsketch"], ranks="8, 2", seeds="0,1", steps=10).expand()
    assert len(configs) == 2 * (1 + 2 * 2)
    assert sorted((c.estimator, c.rank if not c.is_exact else None, c.seed) for c in configs) == sorted(
        [("exact", None, s) for s in (0, 1)] + [(e, r, s) for e in ("basis", "countsketch") for r in (2, 8) for s in (0, 1)])
    assert all(c.steps == 10 and c.preset == "tiny" for c in configs)


def test_form_ranks_above_bt_clip_and_collapse():
    grid = _form(estimators=["basis"], ranks="64, 128", seeds="0")  # tiny: B·T = 64
    assert [str(c) for c in grid.clipped()] == ["R=128 clips to R=64 (B·T = 64 rows)"]
    assert [c.rank for c in grid.expand()] == [64]


@pytest.mark.parametrize("change, message", [
    ({"lams": "1.5"}, r"lam must be in \[0, 1\) \(got 1.5\)"),
    ({"steps": 0}, r"steps must be an integer >= 1 \(got 0\)"),
    ({"lr": -0.1}, r"lr must be in \(0, inf\)"),
    ({"estimators": []}, "estimators: choose at least one"),
    ({"estimators": ["basis"], "ranks": ""}, "ranks: give at least one rank"),
    ({"batch_size": 0}, r"batch_size must be an integer >= 1"),
])
def test_form_rejects_bad_values_with_the_config_message(change, message):
    with pytest.raises(ConfigError, match=message):
        _form(**change)


def test_paper_settings_are_the_papers_run():
    configs = form.PAPER_SWEEP.expand()
    sketched = [c for c in configs if not c.is_exact]
    assert {c.rank for c in sketched} == {1, 8, 16, 32, 64}
    assert all(c.lam == 0.01 and c.preset == "paper" and c.optimizer == "sgd" and c.lr == 0.01
               and c.momentum == 0.9 and c.steps == 50_000 and c.eval_interval == 1000 for c in sketched)
    assert [(c.lam, c.seed) for c in configs if c.is_exact] == [(0.0, 0), (0.0, 1), (0.0, 2)]
    assert form.to_sweep(form.values_of(form.PAPER_SWEEP)) == form.PAPER_SWEEP


def test_a_multiselect_has_a_row_of_its_own_and_the_other_fields_three_to_a_row():
    method = form.grouped(form.widgets())["method"]
    assert [[w.name for w in row] for row in form.rows(method)] == [
        ["estimators"], ["ranks", "lams", "seeds"], ["sketched_layers"]]
    kinds = [form.Widget(str(i), "g", kind, str(i), "") for i, kind in enumerate(["text", "multiselect"] + ["text"] * 4)]
    assert [[w.name for w in row] for row in form.rows(kinds)] == [["0"], ["1"], ["2", "3", "4"], ["5"]]


def test_the_estimators_help_is_one_line_per_registry_entry_with_its_bias():
    listed = form.estimators_help().splitlines()
    assert len(listed) == len(REGISTRY) and all(line.startswith("- ") for line in listed)
    for line, entry in zip(listed, REGISTRY.values()):
        assert line.startswith(f"- **{plain(entry.name)}** — {plain(entry.label)}")
        assert line.endswith(plain(entry.label) if entry.exact else f"{plain(entry.label)} ({entry.bias})")
    assert f"- **basis** — {plain('BASIS: balanced hash sketch of X and dY with invariant scalars')} (biased)" in listed
    assert f"- **countsketch** — {plain('CountSketch: uniform hash sketch of X and dY')} (unbiased)" in listed


# ----------------------------------------------------------------------------- runs table


def test_runs_view_progress_duration_and_filters(store):
    a = fake_run(store, TINY)
    b = fake_run(store, dataclasses.replace(TINY, estimator="exact"), status="running", steps_done=10)
    store.runs.set_notes(b, "baseline for the memory check")
    now = datetime.now(timezone.utc) + timedelta(seconds=30)
    view = tables.runs_view(store.frames.runs_frame(), now=now)
    assert list(view.columns) == tables.RUNS_COLUMNS
    assert view["id"].tolist() == [b, a]  # newest first
    assert view["progress"].tolist() == [0.25, 1.0]
    assert view["status"].tolist() == ["running", "finished"]
    assert view.loc[0, "duration_s"] >= 30  # running: up to now
    assert view.loc[1, "val_loss"] == pytest.approx(store.metrics([a], names=["val_loss"])["value"].iloc[-1])
    assert tables.filter_runs(view, "BASELINE")["id"].tolist() == [b]
    assert tables.filter_runs(view, statuses=["finished"])["id"].tolist() == [a]
    assert tables.filter_runs(view, estimators=["exact"])["id"].tolist() == [b]
    assert tables.runs_view(store.frames.runs_frame().iloc[:0]).empty


def test_merge_selection_keeps_runs_hidden_by_a_filter():
    assert tables.merge_selection([1, 5, 3], visible=[3, 4], chosen=[4]) == [1, 5, 4]
    assert tables.merge_selection([], visible=[1, 2], chosen=[2, 1]) == [2, 1]


# ----------------------------------------------------------------------------- groups and labels


def _records(store, configs):
    ids = [fake_run(store, c) for c in configs]
    return [store.runs.get_run(i) for i in ids]


def test_describe_runs_groups_seeds_and_names_setups(store):
    configs = [dataclasses.replace(TINY, estimator="exact", seed=s) for s in (0, 1)]
    configs += [dataclasses.replace(TINY, rank=8, seed=s) for s in (0, 1)]
    configs += [dataclasses.replace(TINY, rank=8, lr=0.02)]
    info = frames.describe_runs(_records(store, configs))
    assert info["group_size"].tolist() == [2, 2, 2, 2, 1]
    assert info["group_id"].tolist() == [1, 1, 3, 3, 5]
    assert info["color"].tolist() == [charts.EXACT_COLOR] * 2 + [charts.METHOD_PALETTE[0]] * 3  # the one sketched method
    assert info["setup"].tolist() == ["lr=0.01"] * 4 + ["lr=0.02"]
    pooled = frames.trace_labels(info, pool_seeds=True)
    assert pooled.tolist() == ["exact · mean of 2 seeds [lr=0.01]"] * 2 + ["basis R=8 · mean of 2 seeds [lr=0.01]"] * 2 + ["basis R=8 s0 [lr=0.02]"]
    single = frames.trace_labels(info, pool_seeds=False)
    assert single[1] == "exact s0 [lr=0.01]" and single[4] == "basis R=8 s1 [lr=0.01]"


def test_trace_labels_disambiguate_equal_names(store):
    info = frames.describe_runs(_records(store, [TINY, TINY]))
    assert frames.trace_labels(info, pool_seeds=False).tolist() == ["basis R=32 s0 #1", "basis R=32 s0 #2"]
    assert frames.trace_labels(info, pool_seeds=True).tolist() == ["basis R=32 · mean of 2 runs"] * 2


# ----------------------------------------------------------------------------- smoothing and pooling


def test_ema_is_debiased_and_identity_at_zero():
    x = np.array([1.0, 2.0, 3.0, np.nan, 5.0])
    np.testing.assert_array_equal(frames.ema(x, 0.0), x)
    np.testing.assert_allclose(frames.ema(np.full(6, 4.0), 0.9), 4.0)  # a constant stays constant
    got = frames.ema([1.0, 3.0], 0.5)
    assert got[0] == 1.0 and got[1] == pytest.approx((0.25 * 1 + 0.5 * 3) / 0.75)
    assert np.isnan(frames.ema(x, 0.5)[3])
    with pytest.raises(ValueError):
        frames.ema(x, 1.0)


def test_thin_keeps_first_and_last():
    frame = pd.DataFrame({"x": range(1000)})
    out = frames.thin(frame, 10)
    assert len(out) == 10 and out["x"].iloc[0] == 0 and out["x"].iloc[-1] == 999
    assert frames.thin(frame, 2000) is frame


def test_pooling_with_a_queued_seed_and_one_cut_short_claims_only_seeds_with_data(store):
    """basis R=16 has three seeds: seed 0 finished, seed 1 stopped at step 20 of 40,
    seed 2 is still queued (no data). The legend says 2 of 3 seeds; the band is drawn
    only at steps two seeds reached; a group whose only data is one seed has no band."""
    r16 = dataclasses.replace(TINY, rank=16)
    ids = [fake_run(store, dataclasses.replace(r16, seed=0)),
           fake_run(store, dataclasses.replace(r16, seed=1), status="cancelled", steps_done=20),
           fake_run(store, dataclasses.replace(r16, seed=2), status="queued", steps_done=0)]
    metrics = store.metrics(ids)
    metrics = metrics[metrics["run_id"] != ids[2]]  # the queued seed has written nothing
    info = frames.describe_runs([store.runs.get_run(i) for i in ids])
    s = frames.series(metrics, info, "val_loss")
    assert set(s["trace"]) == {"basis R=16 · mean of 2/3 seeds (1 queued)"}
    assert s.loc[s["x"] <= 20, "n"].eq(2).all() and s.loc[s["x"] > 20, "n"].eq(1).all()
    assert s.loc[s["x"] <= 20, "lo"].notna().all() and s.loc[s["x"] > 20, ["lo", "hi"]].isna().all().all()
    fig = charts.line_figure(s, y_title="loss")
    upper, lower, line = fig.data
    assert max(upper.x) == 20 and max(lower.x) == 20 and max(line.x) == TINY.steps  # band only where k >= 2

    alone = metrics[metrics["run_id"] == ids[0]]
    s1 = frames.series(alone, info, "val_loss")
    assert set(s1["trace"]) == {"basis R=16 · mean of 1/3 seeds (1 queued)"} and s1["lo"].isna().all()
    assert [t.name for t in charts.line_figure(s1, y_title="loss").data] == ["basis R=16 · mean of 1/3 seeds (1 queued)"]  # no band


def test_a_band_never_bridges_a_step_with_one_seed():
    rows = pd.DataFrame({"x": range(6), "lo": [1, 1, np.nan, 1, 1, np.nan], "hi": [2, 2, np.nan, 2, 2, np.nan]})
    assert [part["x"].tolist() for part in charts.band_segments(rows)] == [[0, 1], [3, 4]]
    assert charts.band_segments(rows.assign(lo=np.nan)) == []


def test_series_pools_seeds_into_mean_and_std(store):
    configs = [dataclasses.replace(TINY, seed=s) for s in (0, 1, 2)] + [dataclasses.replace(TINY, estimator="exact")]
    info = frames.describe_runs(_records(store, configs))
    metrics = store.metrics(info["run_id"].tolist())
    s = frames.series(metrics, info, "val_loss")
    assert list(s.columns) == frames.SERIES_COLUMNS
    pooled = s[s["trace"] == "basis R=32 · mean of 3 seeds"]
    raw = metrics[(metrics["name"] == "val_loss") & metrics["run_id"].isin([1, 2, 3])].pivot(index="step", columns="run_id", values="value")
    assert pooled["x"].tolist() == raw.index.tolist()
    np.testing.assert_allclose(pooled["y"], raw.mean(axis=1))
    np.testing.assert_allclose(pooled["hi"] - pooled["y"], raw.std(axis=1, ddof=1), atol=1e-12)
    r32 = info.loc[info["rank"] == 32, "color"].iloc[0]
    assert r32 == charts.method_colors(zip(info["estimator"], info["rank"], info["lam"]))[charts.method_key("basis", 32, 0.0)]
    assert (pooled["n"] == 3).all() and (pooled["color"] == r32).all()
    exact = s[s["trace"] == "exact s0"]
    assert exact["lo"].isna().all() and (exact["n"] == 1).all() and (exact["color"] == charts.EXACT_COLOR).all()
    unpooled = frames.series(metrics, info, "val_loss", pool_seeds=False)
    assert unpooled.groupby("trace")["color"].first().to_dict() == {  # shades of the method's colour, one per seed
        "basis R=32 s0": r32, "basis R=32 s1": charts.seed_shade(r32, 1),
        "basis R=32 s2": charts.seed_shade(r32, 2), "exact s0": charts.EXACT_COLOR}
    assert unpooled["lo"].isna().all()
    by_wall = frames.series(metrics, info, "val_loss", x="wall_time", pool_seeds=False)
    assert by_wall["x"].max() == pytest.approx(0.5 + 0.01 * TINY.steps)
    smooth = frames.series(metrics, info, "val_loss", smoothing=0.6, pool_seeds=False)
    assert smooth["y"].iloc[-1] > unpooled["y"].iloc[-1]  # smoothing lags a falling curve
    assert frames.series(metrics, info, "no_such_metric").empty


# ----------------------------------------------------------------------------- incremental metrics


class CountingStore:
    """A RunStore proxy that records the per-run marks of every incremental read."""

    def __init__(self, store):
        self.store, self.reads = store, []

    @property
    def metrics(self):
        return self  # MetricsFeed reads store.metrics.history_versions and .metrics_after

    def history_versions(self, run_ids):
        return self.store.metrics.history_versions(run_ids)

    def metrics_after(self, marks, *, names=None):
        rows = self.store.metrics.metrics_after(marks, names=names)
        self.reads.append((dict(marks), len(rows)))
        return rows


def test_the_session_feed_reads_only_new_rows_and_follows_the_selection(store):
    a, b = fake_run(store, TINY), fake_run(store, dataclasses.replace(TINY, rank=8))
    spy = CountingStore(store)
    feed = MetricsFeed()
    feed.poll(spy, [a])
    first = feed.frame
    pd.testing.assert_frame_equal(first.reset_index(drop=True), store.metrics([a]))
    last = int(first["id"].max())
    store.metrics.add_metrics(a, [(41, 9.0, "val_loss", 5.0)])
    feed.poll(spy, [a])
    again = feed.frame
    assert spy.reads[-1] == ({a: last}, 1)
    assert again["id"].is_unique and len(again) == len(first) + 1
    feed.poll(spy, [a, b])  # b is read from its start, a from the last id
    pd.testing.assert_frame_equal(feed.frame.reset_index(drop=True), store.metrics([a, b]))
    store.metrics.add_metrics(b, [(41, 9.0, "val_loss", 4.0)])
    feed.poll(spy, [a, b])
    assert len(feed.frame) == len(store.metrics([a, b]))
    feed.poll(spy, [b])
    only_b = feed.frame
    assert set(only_b["run_id"]) == {b} and len(only_b) == len(store.metrics([b]))
    assert only_b["id"].is_monotonic_increasing


# ----------------------------------------------------------------------------- memory and summary


def test_memory_frame_ratios_against_the_exact_baseline(store):
    exact = fake_run(store, dataclasses.replace(TINY, estimator="exact"))
    sk = fake_run(store, dataclasses.replace(TINY, rank=8), saved=6.5e6)
    store.metrics.add_metrics(exact, [(40, 1.0, "mem_peak_bytes", 40e6)])
    store.metrics.add_metrics(sk, [(40, 1.0, "mem_peak_bytes", 30e6)])
    info = frames.describe_runs([store.runs.get_run(exact), store.runs.get_run(sk)])
    mem = frames.memory_frame(run_summary(store, [exact, sk]), info)
    saved = mem[mem["quantity"] == "Saved for backward"].set_index("trace")
    assert saved.loc["basis R=8 s0", "mib"] == pytest.approx(6.5e6 / MIB)
    assert saved.loc["basis R=8 s0", "ratio"] == pytest.approx(0.5)
    assert saved.loc["exact s0", "ratio"] == pytest.approx(1.0)
    peak = mem[mem["quantity"] == "Peak device memory"].set_index("trace")
    assert peak.loc["basis R=8 s0", "baseline_mib"] == pytest.approx(40e6 / MIB)
    assert peak.loc["basis R=8 s0", "ratio"] == pytest.approx(0.75)
    assert set(mem["quantity"]) == {"Saved for backward", "Peak device memory", "XLA temp of the step"}


def test_breakdown_frame_is_empty_without_categories_and_stacks_with_them(store):
    plain = fake_run(store, TINY)
    info = frames.describe_runs([store.runs.get_run(plain)])
    assert frames.breakdown_frame(store.metrics([plain]), info).empty
    run = fake_run(store, dataclasses.replace(TINY, rank=8), breakdown=True, saved=10e6)
    info = frames.describe_runs([store.runs.get_run(run)])
    frame = frames.breakdown_frame(store.metrics([run]), info)
    assert frame["bar"].unique().tolist() == ["basis R=8 s0", "basis R=8 s0 · exact"]
    assert frame.groupby("bar")["mib"].sum().tolist() == pytest.approx([10e6 / MIB, 13e6 / MIB])
    assert set(frame["category"]) == {"sketched_inputs", "nonlinearity", "loss_logits"}


def test_summary_table_pairs_seeds_and_shows_the_papers_numbers(store):
    paper = RunConfig(preset="paper", steps=40, eval_interval=10, probe_interval=10, lam=0.01)
    ids = [fake_run(store, dataclasses.replace(paper, estimator="exact", lam=0.0, seed=s), final=6.6) for s in (0, 1)]
    ids += [fake_run(store, dataclasses.replace(paper, rank=8, seed=s), final=6.8) for s in (0, 1)]
    table = display_frame(run_table3(store, ids))
    assert table["method"].tolist() == ["exact", "basis"]
    assert table["seeds"].tolist() == [2, 2]
    assert "paper val" not in table  # the paper's figures are a labelled note, not a comparable column
    assert "50,000 steps on FineWeb-edu, one run per method" in paper_note(run_table3(store, ids))
    delta = f"{0.2 * (1 - math.exp(-4)):+.4f}"
    assert "±" in table.loc[1, "val loss"] and table.loc[1, "Δ val vs exact"] == delta
    # equal pairs (a synthetic run per seed): zero spread is no evidence, so no interval and no verdict
    assert table.loc[1, "95% CI"] == "—" and table.loc[1, "verdict"] == "no spread"
    assert table.loc[0, "verdict"] == "reference" and table.loc[0, "Δ val vs exact"] == "—"
    assert table.loc[1, "saved ÷ exact"] == f"{12e6 / 13e6:.4f}"  # run ÷ exact, as on the memory chart
    assert "setup" not in table


def test_summary_table_without_seeds_or_paper(store):
    ids = [fake_run(store, TINY), fake_run(store, dataclasses.replace(TINY, lr=0.02))]
    table = display_frame(run_table3(store, ids))
    assert "paper val" not in table and table["setup"].tolist() == ["lr=0.01", "lr=0.02"]
    assert table["Δ val vs exact"].tolist() == ["—", "—"] and table["95% CI"].tolist() == ["—", "—"]
    assert "±" not in table.loc[0, "val loss"]


# ----------------------------------------------------------------------------- time estimate


def test_run_seconds_counts_steps_evals_probes_and_startup():
    t = timing.StepTiming(step_s=0.1, startup_s=5.0, source="measured")
    config = RunConfig(preset="tiny", steps=100, eval_interval=10, val_batches=3, probe_interval=20)
    evals, probes = 100 // 10 + 1, 100 // 20
    batches = evals * 3 + 3  # every eval reads the 3 validation batches; the last step also the 3 test batches
    assert timing.run_seconds(config, t) == pytest.approx(5.0 + 0.1 * (100 + batches * timing.EVAL_COST + probes * timing.PROBE_COST))
    exact = dataclasses.replace(config, estimator="exact", sketched_layers="none")  # nothing to probe
    assert timing.run_seconds(exact, t) == pytest.approx(5.0 + 0.1 * (100 + batches * timing.EVAL_COST))
    # an exact run of sketched layers probes them (its reference cosine 1.0), as its training does
    reference = dataclasses.replace(config, estimator="exact")
    assert timing.run_seconds(reference, t) == pytest.approx(timing.run_seconds(config, t))
    assert timing.grid_seconds([config, exact], [t, t]) == pytest.approx(timing.run_seconds(config, t) + timing.run_seconds(exact, t))
    assert timing.grid_seconds([config, exact], [t, t], concurrent=2) == pytest.approx(timing.run_seconds(config, t))


def test_format_seconds():
    assert [format_seconds(s) for s in (4.4, 65, 7260, float("nan"))] == ["4 s", "1 min 05 s", "2 h 01 min", "?"]
    assert [format_seconds(s) for s in (None, float("inf"), 59.5, 3599.6)] == ["?", "?", "1 min 00 s", "1 h 00 min"]


def test_timing_key_ignores_what_does_not_change_step_time():
    a = RunConfig(preset="tiny", estimator="exact", rank=8, lam=0.0, lr=0.1, steps=5)
    assert timing.timing_key(a) == timing.timing_key(dataclasses.replace(a, rank=32, lr=0.5, steps=50, seed=3))
    b = dataclasses.replace(a, estimator="basis")
    assert timing.timing_key(b) == timing.timing_key(dataclasses.replace(b, lam=0.01))
    assert timing.timing_key(b) != timing.timing_key(dataclasses.replace(b, rank=32))


def test_timing_from_history_uses_finished_runs_of_the_same_model(store):
    config = dataclasses.replace(TINY, rank=8)
    assert estimates.timing_from_history(store, config) is None
    fake_run(store, config)  # 1000 tokens/s; tiny: B·T = 2·32 tokens per step
    fake_run(store, dataclasses.replace(config, rank=2))
    got = estimates.timing_from_history(store, dataclasses.replace(config, seed=4, steps=999))
    assert got.step_s == pytest.approx(64 / 1000) and got.startup_s == pytest.approx(0.5)
    assert got.source == "history (1 run)"


def test_measure_step_times_the_real_step_once_per_key():
    config = RunConfig(preset="tiny", rank=4, steps=5)
    assert timing.measured(config) is None
    got = timing.measure_step(config, steps=2)
    assert got.source == "measured" and 0 < got.step_s < got.startup_s
    assert timing.measure_step(dataclasses.replace(config, lr=0.5), steps=2) is got  # cached by timing key
    assert timing.measured(config, steps=2) is got
