"""Run summaries, the paired statistics and the Table 3 form, on a database written by hand."""

import dataclasses
import math
import types

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from engine.analysis.reads import read_group, read_text
from engine.analysis.summary import (
    MISSING,
    PAPER_TABLE3,
    REFERENCE,
    TABLE3_COLUMNS,
    paper_note,
    render,
    summarize,
    table3,
)
from engine.cli import main as cli
from engine.config import RunConfig
from engine.core.stats import (
    BETTER,
    EQUIVALENT,
    INCONCLUSIVE,
    NO_SPREAD,
    NOT_EQUIVALENT,
    ONE_SEED,
    POWER,
    PRIOR_DELTA_SD,
    WORSE,
    paired_delta,
    seeds_needed,
    tost_power,
)
from engine.reads.queries import run_summary, run_table3, table3_text
from storage import RunStore

BASE = RunConfig(preset="paper", steps=20)
CSV_LEADING = ["estimator", "rank", "lam", "seeds", "step", "val_loss_mean", "val_loss_std", "delta_val_mean",
               "delta_val_ci95_low", "delta_val_ci95_high", "verdict"]


def _run(store, config, val_losses, saved=900.0, exact_saved=1000.0, cos=None):
    run_id = store.runs.create_run(
        name=config.label(), config=config.to_dict(), estimator=config.estimator,
        rank=None if config.estimator == "exact" else config.rank, lam=config.lam,
        seed=config.seed, preset=config.preset, steps=config.steps,
    )
    rows = [(0, 0.0, "mem_saved_bytes", saved), (0, 0.0, "mem_saved_bytes_exact", exact_saved)]
    rows += [(step, float(step), "val_loss", v) for step, v in val_losses.items()]
    rows += [(step, float(step), "train_loss", v + 0.5) for step, v in val_losses.items() if step > 0]
    rows += [(step, float(step), "cos_mean", c) for step, c in (cos or {}).items()]
    store.metrics.add_metrics(run_id, rows)
    return run_id


@pytest.fixture
def store(tmp_path):
    return RunStore(f"sqlite:///{tmp_path / 's.db'}")


# ----------------------------------------------------------------------------- paired statistics


@pytest.mark.parametrize("n", [2, 3, 5, 12])
def test_paired_delta_matches_scipy_on_random_pairs(n):
    rng = np.random.default_rng(n)
    exact = rng.normal(6.6, 0.05, n)
    method = exact + rng.normal(0.02, 0.03, n)
    d = paired_delta(method - exact)
    ref = stats.ttest_rel(method, exact).confidence_interval(0.95)
    low, high = stats.t.interval(0.95, n - 1, loc=np.mean(method - exact), scale=stats.sem(method - exact))
    assert d.n == n and d.mean == pytest.approx(np.mean(method - exact), rel=1e-12)
    assert d.std == pytest.approx(np.std(method - exact, ddof=1), rel=1e-12)
    assert (d.ci_low, d.ci_high) == pytest.approx((ref.low, ref.high), rel=1e-10)
    assert (d.ci_low, d.ci_high) == pytest.approx((low, high), rel=1e-10)
    eq = stats.ttest_rel(method, exact).confidence_interval(0.90)
    assert (d.ci90_low, d.ci90_high) == pytest.approx((eq.low, eq.high), rel=1e-10)
    inside = -d.margin < eq.low and eq.high < d.margin
    outside = eq.low > d.margin or eq.high < -d.margin
    expected = EQUIVALENT if inside else BETTER if ref.high < 0 else WORSE if ref.low > 0 else \
        NOT_EQUIVALENT if outside else INCONCLUSIVE
    assert d.verdict == expected
    assert d.diff_p == pytest.approx(stats.ttest_rel(method, exact).pvalue, rel=1e-9)


def test_paired_delta_verdicts_and_edge_cases():
    one = paired_delta([0.3])
    assert one.n == 1 and one.mean == 0.3 and one.verdict == ONE_SEED
    assert math.isnan(one.std) and math.isnan(one.ci_low) and math.isnan(one.ci_high)  # never a zero std
    two = paired_delta([0.1, 0.3])  # t_{0.975,1} = 12.706: a wide interval
    half = stats.t.ppf(0.975, 1) * np.std([0.1, 0.3], ddof=1) / math.sqrt(2)
    assert (two.ci_low, two.ci_high) == pytest.approx((0.2 - half, 0.2 + half)) and two.verdict == INCONCLUSIVE
    # all-equal differences (identical parameters, as at step 0): zero spread is no evidence
    same = paired_delta([-0.05, -0.05, -0.05])
    assert same.std == 0 and math.isnan(same.ci_low) and same.verdict == NO_SPREAD
    assert paired_delta([0.0, 0.0]).verdict == paired_delta([0.01] * 3).verdict == NO_SPREAD
    assert paired_delta([-1.0, -1.1, -0.9]).verdict == BETTER and paired_delta([1.0, 1.1, 0.9]).verdict == WORSE
    assert paired_delta([np.nan, 0.2]).n == 1
    none = paired_delta([])
    assert none.n == 0 and math.isnan(none.mean)


def _rec(i, status="running", seed=0, error=None):
    return types.SimpleNamespace(id=i, status=status, seed=seed, error=error)


def test_the_read_step_is_the_latest_step_every_live_run_shares():
    read = read_group([_rec(1), _rec(2)], {1: {0, 50, 100, 150}, 2: {0, 50, 100, 101}})
    assert read.step == 100 and read.furthest == 150 and read.held == ((2, 101, "running"),) and read.trained
    # a run without any validation does not hold the others back; its seed waits
    read = read_group([_rec(1), _rec(2, "queued")], {1: {0, 50}})
    assert read.step == 50 and read.waiting == (2,)
    assert read_group([_rec(1)], {}).step is None and read_group([_rec(1), _rec(2)], {1: {0, 10}, 2: {5}}).step is None
    # a failed run leaves the choice of the step; a diverged one is named so
    lost = _rec(3, "failed", seed=4, error="training loss became nan at step 7; lower lr (now 0.01)")
    read = read_group([_rec(1, "finished"), lost, _rec(4, "cancelled", seed=5)], {1: {0, 100}, 3: {0}, 4: {0}})
    assert read.step == 100 and read.left == ((3, 4, "diverged"), (4, 5, "cancelled"))
    text = read_text(read)
    assert "Read at step 100, the furthest any run validated at" in text and "#3 diverged (seed 4)" in text
    # step 0 is not a read of training
    zero = read_group([_rec(1, "finished"), _rec(2)], {1: {0, 100}, 2: {0}})
    assert zero.step == 0 and not zero.trained and "Not trained yet" in read_text(zero)
    assert "#2 (running, validated to step 0)" in read_text(zero)


# ----------------------------------------------------------------------------- per-run summary


def test_summary_takes_values_at_a_step_and_deltas_to_the_same_seed(store):
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
    records = [r for r in store.runs.list_runs() if r.id in (r8, exact1)]
    noisy = store.metrics([exact0, exact1, r8, other])
    assert summarize(records, noisy).equals(run_summary(store, [r8, exact1]))


def test_summary_at_a_step_not_reached_is_missing_not_the_last_value(store):
    exact = _run(store, dataclasses.replace(BASE, estimator="exact", steps=200), {0: 9.0, 50: 8.0, 100: 7.0, 150: 6.0})
    short = _run(store, dataclasses.replace(BASE, rank=8, steps=200), {0: 9.0, 50: 8.2, 100: 7.2, 101: 7.1})
    at150 = run_summary(store, [exact, short], at_step=150).set_index("run_id")
    assert not at150.at[short, "reached"] and pd.isna(at150.at[short, "step"]) and np.isnan(at150.at[short, "val_loss"])
    assert at150.at[exact, "reached"] and at150.at[exact, "val_loss"] == 6.0
    # at their own last steps (150 and 101) there is no exact value at 101: no Δ across steps
    last = run_summary(store, [exact, short]).set_index("run_id")
    assert last.at[short, "step"] == 101 and np.isnan(last.at[short, "delta_val_vs_exact"])
    # memory figures are properties of the step: kept whatever the step
    assert at150.at[short, "mem_saved_bytes"] == 900.0


# ----------------------------------------------------------------------------- Table 3


def _row(t, estimator, rank=None, **match):
    rows = t[(t["estimator"] == estimator) & (t["rank"].isna() if rank is None else t["rank"] == rank)]
    for k, v in match.items():
        rows = rows[rows[k] == v]
    assert len(rows) == 1
    return rows.iloc[0]


def test_a_seed_cut_short_is_a_missing_seed_of_its_setup_not_a_setup_of_its_own(store):
    """Steps, eval and probe intervals and checkpoint fields are bookkeeping: runs that
    differ only in them are one setup (one row per method), and the seed that stopped
    at step 40 of 60 is missing at the setup's step 60, counted at its common step 40."""
    ids = [
        _run(store, dataclasses.replace(BASE, rank=8, seed=0, steps=60, eval_interval=20), {20: 7.0, 40: 6.5, 60: 6.0}),
        _run(store, dataclasses.replace(BASE, rank=8, seed=1, steps=60, eval_interval=40), {40: 6.7}),
        _run(store, dataclasses.replace(BASE, rank=8, seed=2, steps=40, eval_interval=20, probe_interval=0,
                                        checkpoint_keep=1), {20: 7.1, 40: 6.6}),
    ]
    at_40 = run_table3(store, ids)
    assert len(at_40) == 1 and at_40.iloc[0]["setup"] == ""
    row = at_40.iloc[0]
    assert (row["step"], row["seeds"], row["missing_seeds"]) == (40, 3, "")
    assert row["val_loss_mean"] == pytest.approx(np.mean([6.5, 6.7, 6.6]))
    at_60 = run_table3(store, ids, at_step=60).iloc[0]
    assert (at_60["seeds"], at_60["missing_seeds"], at_60["val_loss_mean"]) == (1, "1, 2", pytest.approx(6.0))


def test_table3_pools_seeds_within_a_config_only(store):
    ids = [
        _run(store, dataclasses.replace(BASE, estimator="exact", seed=0), {20: 6.0}, saved=1000.0),
        _run(store, dataclasses.replace(BASE, estimator="exact", seed=1), {20: 6.2}, saved=1000.0),
        _run(store, dataclasses.replace(BASE, rank=32, seed=0), {20: 6.1}, saved=500.0),
        _run(store, dataclasses.replace(BASE, rank=32, seed=1), {20: 6.5}, saved=500.0),
        _run(store, dataclasses.replace(BASE, rank=32, seed=0, lr=0.02), {20: 9.0}),
    ]
    t = run_table3(store, ids)
    assert list(t.columns) == TABLE3_COLUMNS and list(t.columns[:11]) == CSV_LEADING
    assert len(t) == 3  # the run with another learning rate is a config of its own
    r32 = _row(t, "basis", 32, seeds=2)
    assert r32["val_loss_mean"] == pytest.approx(6.3) and r32["val_loss_std"] == pytest.approx(np.std([6.1, 6.5], ddof=1))
    assert r32["delta_val_mean"] == pytest.approx(np.mean([0.1, 0.3]))
    assert r32["delta_val_std"] == pytest.approx(np.std([0.1, 0.3], ddof=1)) and r32["paired_seeds"] == 2
    ci = stats.ttest_rel([6.1, 6.5], [6.0, 6.2]).confidence_interval(0.95)
    assert (r32["delta_val_ci95_low"], r32["delta_val_ci95_high"]) == pytest.approx((ci.low, ci.high))
    assert r32["verdict"] == INCONCLUSIVE  # holds 0, reaches past ±0.02
    assert r32["delta_val_by_seed"] == "s0 +0.1000, s1 +0.3000" and r32["margin"] == 0.02
    assert r32["mem_saved_ratio"] == pytest.approx(0.5)  # run ÷ exact
    note = paper_note(t)  # the paper's figures beside the table, labelled, not in its rows
    assert "paper_val_loss" not in t and f"basis R=32 {PAPER_TABLE3[32]:.3f}" in note and "one run per method" in note
    assert r32["train_loss_mean"] == pytest.approx(6.8) and r32["missing_seeds"] == ""
    exact = _row(t, "exact")
    assert exact["verdict"] == REFERENCE and exact["delta_val_by_seed"] == ""
    assert np.isnan(exact["delta_val_mean"]) and exact["mem_saved_ratio"] == pytest.approx(1.0)
    alone = _row(t, "basis", 32, seeds=1)
    assert alone["verdict"] == "no exact pair" and np.isnan(alone["delta_val_mean"]) and np.isnan(alone["val_loss_std"])
    assert set(t["setup"]) == {"lr=0.01", "lr=0.02"}


def test_table3_does_not_pool_seeds_at_different_steps(store):
    """The reported bug: seed 0 at step 150 and seed 1 at step 101 were pooled as "step 100"."""
    cfg = dataclasses.replace(BASE, steps=200, eval_interval=50)
    for s in (0, 1):
        _run(store, dataclasses.replace(cfg, estimator="exact", seed=s), {0: 9.0, 50: 8.0, 100: 7.0 + s / 10, 150: 6.0 + s / 10})
    b0 = _run(store, dataclasses.replace(cfg, rank=8, seed=0), {0: 9.0, 50: 8.1, 100: 7.3, 150: 6.2})
    b1 = _run(store, dataclasses.replace(cfg, rank=8, seed=1), {0: 9.0, 50: 8.2, 100: 7.5, 101: 7.4})
    t = run_table3(store)
    r8 = _row(t, "basis", 8)
    # default: the latest step every run has a validation loss at is 100, for every row
    assert (t["step"] == 100).all() and r8["seeds"] == 2
    assert r8["val_loss_mean"] == pytest.approx(np.mean([7.3, 7.5]))  # not 6.2 (step 150) nor 7.4 (step 101)
    assert r8["delta_val_mean"] == pytest.approx(np.mean([0.3, 0.4]))  # against exact at step 100
    # at step 150 seed 1 has not arrived: only seed 0 counts, seed 1 is named missing
    at150 = run_table3(store, at_step=150)
    r8 = _row(at150, "basis", 8)
    assert r8["seeds"] == 1 and r8["missing_seeds"] == "1" and r8["run_ids"] == str(b0)
    assert r8["val_loss_mean"] == 6.2 and np.isnan(r8["val_loss_std"])
    assert r8["delta_val_mean"] == pytest.approx(0.2) and r8["verdict"] == ONE_SEED and np.isnan(r8["delta_val_ci95_low"])
    assert _row(at150, "exact")["seeds"] == 2
    # a step nobody reached: rows say so instead of showing old values
    none = run_table3(store, at_step=175)
    assert (none["seeds"] == 0).all() and (none["verdict"] == MISSING).all() and none["val_loss_mean"].isna().all()
    assert _row(none, "basis", 8)["missing_seeds"] == "0, 1"
    assert b1 not in {int(i) for i in _row(at150, "basis", 8)["run_ids"].split(", ")}


def test_table3_reads_cosine_at_the_last_probe_and_dedupes_reruns(store):
    cfg = dataclasses.replace(BASE, steps=40)
    _run(store, dataclasses.replace(cfg, estimator="exact"), {20: 6.0, 40: 5.0})
    _run(store, dataclasses.replace(cfg, rank=8), {20: 6.3, 40: 5.9}, cos={10: 0.1, 20: 0.2, 30: 0.3, 40: 0.4})
    rerun = _run(store, dataclasses.replace(cfg, rank=8), {20: 6.1, 40: 5.5}, cos={10: 0.5, 20: 0.6, 30: 0.7, 40: 0.8})
    t = run_table3(store, at_step=20)
    r8 = _row(t, "basis", 8)
    assert r8["seeds"] == 1 and r8["run_ids"] == str(rerun)  # the later run of a seed counts once
    assert r8["cos_mean"] == pytest.approx(0.6) and r8["delta_val_mean"] == pytest.approx(0.1)


def test_table3_of_nothing_and_the_pure_form(store):
    assert table3([], store.metrics([])).empty and list(table3([], store.metrics([])).columns) == TABLE3_COLUMNS
    store.runs.create_run(name="q", config=BASE.to_dict(), estimator="basis", rank=8, lam=0.0, seed=0,
                              preset="paper", steps=20)
    t = run_table3(store)
    assert t["verdict"].tolist() == [MISSING] and pd.isna(t["step"].iloc[0]) and t["missing_seeds"].tolist() == ["0"]


# ----------------------------------------------------------------------------- rendering and CLI


def _paired_store(store):
    for s, (e, b) in enumerate([(6.0, 6.1), (6.2, 6.25), (6.1, 6.3)]):
        _run(store, dataclasses.replace(BASE, estimator="exact", seed=s), {10: 7.0, 20: e}, saved=1000.0)
        _run(store, dataclasses.replace(BASE, rank=8, seed=s, name="=HYPERLINK(\"http://x\")"), {10: 7.1, 20: b}, saved=250.0)


def test_render_formats(store):
    _paired_store(store)
    t = run_table3(store)
    text = render(t, "table")
    assert "exact" in text and "reference" in text and "—" in text and "±" in text
    md = render(t, "markdown")
    assert md.startswith("| method") and md.splitlines()[1].startswith("|:")  # a pipe table
    latex = render(t, "latex")
    assert "\\begin{tabular}" in latex and "\\toprule" in latex and "Δ" in latex
    assert all(table3_text(t, f) == render(t, f) for f in ("table", "markdown", "latex"))
    csv = table3_text(t, "csv")
    assert csv.splitlines()[0].split(",")[:11] == CSV_LEADING
    formula = "=HYPERLINK(\"http://x\")"
    back = pd.read_csv(pd.io.common.StringIO(table3_text(t.assign(setup=formula), "csv")), dtype=str,
                       keep_default_na=False)
    assert set(back["estimator"]) == {"exact", "basis"} and (back["setup"] == "'" + formula).all()
    with pytest.raises(ValueError, match="table, csv, markdown, latex"):
        table3_text(t, "html")
    with pytest.raises(ValueError, match="table, markdown, latex"):
        render(t, "csv")  # CSV is an export: formula-neutralised, in engine.reads.queries


def test_cli_summary_prints_csv_and_writes_safely(store, tmp_path, capsys, monkeypatch):
    _paired_store(store)
    monkeypatch.setenv("BASIS_LAB_DB_URL", store.url)
    assert cli.main(["summary", "--format", "csv"]) == 0
    out = capsys.readouterr().out
    back = pd.read_csv(pd.io.common.StringIO(out))
    assert list(back.columns[:11]) == CSV_LEADING
    r8 = back[back["estimator"] == "basis"].iloc[0]
    d = np.array([0.1, 0.05, 0.2])
    ci = stats.ttest_rel(d, np.zeros(3)).confidence_interval(0.95)
    assert r8["seeds"] == 3 and r8["step"] == 20 and r8["delta_val_mean"] == pytest.approx(d.mean(), rel=1e-12)
    assert (r8["delta_val_ci95_low"], r8["delta_val_ci95_high"]) == pytest.approx((ci.low, ci.high), rel=1e-9)
    assert r8["verdict"] == ("worse" if ci.low > 0 else "inconclusive")
    assert r8["mem_saved_ratio"] == pytest.approx(0.25)
    exact_ids = [r.id for r in store.runs.list_runs() if r.estimator == "exact"]
    assert cli.main(["summary", "--runs", *map(str, exact_ids), "--at-step", "10", "--format", "markdown"]) == 0
    md = capsys.readouterr().out
    assert "| basis" not in md and "| exact" in md
    out_file = tmp_path / "t3.tex"
    assert cli.main(["summary", "--format", "latex", "--out", str(out_file)]) == 0
    assert "\\begin{tabular}" in out_file.read_text()
    assert cli.main(["summary", "--out", str(out_file)]) == 2  # exists: needs --force
    assert "--force" in capsys.readouterr().err and "tabular" in out_file.read_text()
    assert cli.main(["summary", "--out", str(out_file), "--force"]) == 0 and "verdict" in out_file.read_text()
    db_file = store.engine.url.database
    assert cli.main(["summary", "--out", db_file, "--force"]) == 2
    assert "database" in capsys.readouterr().err and len(RunStore(store.url).runs.list_runs()) == 6
    assert cli.main(["summary", "--at-step", "-3"]) == 2


def test_table3_pairs_with_exact_whatever_its_lambda_and_keeps_lambdas_apart(store):
    _run(store, dataclasses.replace(BASE, estimator="exact", lam=0.5), {20: 6.0})
    _run(store, dataclasses.replace(BASE, rank=8, lam=0.01), {20: 6.25})
    _run(store, dataclasses.replace(BASE, rank=8, lam=0.0), {20: 6.5})
    t = run_table3(store)
    assert len(t) == 3 and _row(t, "exact")["lam"] == 0.5 and _row(t, "exact")["verdict"] == REFERENCE
    assert _row(t, "basis", 8, lam=0.01)["delta_val_mean"] == pytest.approx(0.25)
    assert _row(t, "basis", 8, lam=0.0)["delta_val_mean"] == pytest.approx(0.5)


# ----------------------------------------------------------------------------- equivalence, coverage and power

SIM = np.random.default_rng(20261125)
REPLICATES = 1000  # binomial SE of a rate near 0.8: 0.013; the tolerances below are 3 SE


def test_tost_matches_statsmodels_ttost_paired():
    weightstats = pytest.importorskip("statsmodels.stats.weightstats",
                                      reason="statsmodels is not installed (the test lock adds it)")
    rng = np.random.default_rng(3)
    for n, shift in ((3, 0.0), (5, 0.01), (8, 0.03), (12, -0.015)):
        exact = rng.normal(6.6, 0.05, n)
        method = exact + rng.normal(shift, 0.02, n)
        ours = paired_delta(method - exact, margin=0.02)
        p, _, _ = weightstats.ttost_paired(method, exact, -0.02, 0.02)
        assert ours.tost_p == pytest.approx(p, rel=1e-9)
        assert (ours.verdict == EQUIVALENT) == (p < 0.05)


def test_tost_p_is_the_larger_one_sided_p_and_equivalence_is_the_90_percent_interval():
    d = np.array([0.004, -0.002, 0.009, 0.001, 0.003])
    r = paired_delta(d, margin=0.01)
    lower = stats.ttest_1samp(d, -0.01, alternative="greater").pvalue
    upper = stats.ttest_1samp(d, 0.01, alternative="less").pvalue
    assert r.tost_p == pytest.approx(max(lower, upper), rel=1e-12)
    eq = stats.ttest_1samp(d, 0.0).confidence_interval(0.90)
    assert (r.ci90_low, r.ci90_high) == pytest.approx((eq.low, eq.high), rel=1e-12)
    assert (r.verdict == EQUIVALENT) == (-0.01 < eq.low and eq.high < 0.01) == (r.tost_p < 0.05)


def test_a_negligible_significant_difference_reads_equivalent():
    """R = B·T at λ 0.01: dW is exact × 0.9801 and Table 3 read 'worse, +0.0019 [+0.0008, +0.0031]'."""
    d = paired_delta([0.0016, 0.0019, 0.0022])
    assert d.ci_low > 0 and d.verdict == EQUIVALENT
    assert paired_delta([0.0016, 0.0019, 0.0022], margin=0.001).verdict == "worse"


def test_tost_power_is_the_simulated_rate_and_the_power_rule_decides_both_ways():
    """At the seeds ``seeds_needed`` asks for, TOST reads equivalent for a true Δ of 0 in at least
    80 % − 0.04 of the replicates (and within 0.04 of ``tost_power``), and for a true Δ of 2δ in
    at most 5 % (its level bounds it even at Δ = δ)."""
    margin = 0.02
    for sd in (0.01, PRIOR_DELTA_SD):
        n = seeds_needed(sd, margin)
        assert tost_power(n, sd, margin) >= POWER > tost_power(n - 1, sd, margin)
        reps = REPLICATES if n < 10 else 400
        zero = np.mean([paired_delta(SIM.normal(0.0, sd, n), margin).verdict == EQUIVALENT for _ in range(reps)])
        far = np.mean([paired_delta(SIM.normal(2 * margin, sd, n), margin).verdict == EQUIVALENT for _ in range(reps)])
        edge = np.mean([paired_delta(SIM.normal(margin, sd, n), margin).verdict == EQUIVALENT for _ in range(reps)])
        tol = 3 * math.sqrt(0.8 * 0.2 / reps)
        assert zero >= POWER - tol and abs(zero - tost_power(n, sd, margin)) <= tol, (sd, n, zero)
        assert far <= 0.05 and edge <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / reps), (sd, n, far, edge)
        assert tost_power(n, sd, margin, true_delta=2 * margin) < 0.01


def test_each_interval_of_table3_covers_the_true_delta():
    """The 95 % interval covers the true Δ in ≥ 93 % of 1000 replicates (expected 95 %), and the
    90 % equivalence interval in 90 % ± 3 SE, at 3 and 8 seeds."""
    for n in (3, 8):
        truth, sd = 0.013, 0.02
        rows = [paired_delta(SIM.normal(truth, sd, n)) for _ in range(REPLICATES)]
        cover95 = np.mean([r.ci_low <= truth <= r.ci_high for r in rows])
        cover90 = np.mean([r.ci90_low <= truth <= r.ci90_high for r in rows])
        assert cover95 >= 0.93, (n, cover95)
        assert abs(cover90 - 0.90) <= 3 * math.sqrt(0.9 * 0.1 / REPLICATES), (n, cover90)


def test_seed_plan_warns_before_a_launch_that_cannot_decide(store):
    from engine.config import reproduction_sweep
    from engine.reads.queries import expected_delta_sd, seed_plan

    few = reproduction_sweep(20, (0, 1, 2)).expand()
    plan = seed_plan(store, few)
    need = seeds_needed(PRIOR_DELTA_SD, 0.02)
    assert plan.startswith("3 seeds cannot decide") and f"{need} seeds reach 80%" in plan and "prior" in plan
    assert seed_plan(store, reproduction_sweep(20, range(need)).expand()) is None
    assert "1 seed cannot" in seed_plan(store, reproduction_sweep(20, (0,)).expand())
    assert seed_plan(store, [c for c in few if c.is_exact]) is None  # nothing to compare
    # finished runs of the same setup: their observed spread replaces the prior, for their method only
    config = dataclasses.replace(few[0], steps=20)
    for seed, d in enumerate((0.001, -0.001, 0.0)):
        _run(store, dataclasses.replace(config, estimator="exact", seed=seed), {20: 6.0})
        _run(store, dataclasses.replace(config, estimator="basis", rank=32, lam=0.01, seed=seed), {20: 6.0 + d})
    for r in store.runs.list_runs():
        store.runs.set_status(r.id, "running")
        store.runs.set_status(r.id, "finished")
    spreads = {m.rank: spread for m, spread in expected_delta_sd(store, few).items()}
    assert spreads[32][0] == pytest.approx(0.001) and "observed over 3 paired seeds" in spreads[32][1]
    assert spreads[8] == spreads[64] == (PRIOR_DELTA_SD, "prior: the largest seen in this lab's CPU reproductions")
    plan = seed_plan(store, few)  # 3 seeds decide R=32 at SD 0.001, not the ranks with no runs
    assert "basis R=1 λ=0.01, basis R=8 λ=0.01, basis R=16 λ=0.01, basis R=64 λ=0.01 at a Δ val SD of 0.026" in plan
    assert "R=32" not in plan


def test_an_observed_spread_of_zero_plans_with_the_prior(store):
    """Runs whose Δ has no seed noise (SD 0) cannot stand for the spread a sweep will meet:
    the plan falls back to the prior instead of claiming 2 seeds decide."""
    from engine.config import reproduction_sweep
    from engine.reads.queries import expected_delta_sd

    few = reproduction_sweep(20, (0, 1, 2)).expand()
    config = dataclasses.replace(few[0], steps=20)
    for seed in range(3):
        _run(store, dataclasses.replace(config, estimator="exact", seed=seed), {20: 6.0})
        _run(store, dataclasses.replace(config, estimator="basis", rank=32, lam=0.01, seed=seed), {20: 6.1})
    for r in store.runs.list_runs():
        store.runs.set_status(r.id, "running")
        store.runs.set_status(r.id, "finished")
    spreads = {m.rank: spread for m, spread in expected_delta_sd(store, few).items()}
    assert spreads[32] == (PRIOR_DELTA_SD, "prior: the largest seen in this lab's CPU reproductions")


def test_seed_plan_plans_each_method_at_its_own_spread(store):
    """Two methods of one setup with very different stored spreads, R = 8 (Δ SD 0.1) and R = 32
    (Δ SD 0.01): each is planned at its own, so R = 8 needs hundreds of seeds and R = 32 four (a
    pooled SD, 0.071, would have asked both for the same); methods of another setup or without
    runs fall back to the prior, and say so."""
    from engine.config import reproduction_sweep
    from engine.reads.queries import expected_delta_sd, method_of, seed_plan

    grid = [c for c in reproduction_sweep(20, (0, 1, 2)).expand() if c.is_exact or c.rank in (8, 32)]
    for c in grid:
        d = {8: (0.1, -0.1, 0.0), 32: (0.01, -0.01, 0.0)}[c.rank][c.seed] if not c.is_exact else 0.0
        _run(store, c, {20: 6.0 + d})
    for r in store.runs.list_runs():
        store.runs.set_status(r.id, "running")
        store.runs.set_status(r.id, "finished")
    r8, r32 = (next(c for c in grid if c.rank == r and not c.is_exact) for r in (8, 32))
    spreads = expected_delta_sd(store, grid)
    assert spreads[method_of(r8)][0] == pytest.approx(0.1) and spreads[method_of(r32)][0] == pytest.approx(0.01)
    plan = seed_plan(store, grid)
    wide, narrow = seeds_needed(0.1, 0.02), seeds_needed(0.01, 0.02)
    assert wide > 100 and narrow == 4
    assert plan.startswith("3 seeds cannot decide whether a method matches exact backprop within ±0.02 nats: ")
    assert (f"basis R=8 λ=0.01 at a Δ val SD of 0.1 (observed over 3 paired seeds of its finished runs): a method "
            f"that truly matches reads \"equivalent\" with probability {tost_power(3, 0.1, 0.02):.0%}, and {wide} "
            "seeds reach 80%") in plan
    assert "basis R=32 λ=0.01 at a Δ val SD of 0.01 (observed" in plan and f"and {narrow} seeds reach 80%" in plan
    assert seed_plan(store, [c for c in grid if c.is_exact or c.rank == 32] + [
        dataclasses.replace(c, seed=3) for c in grid if c.is_exact or c.rank == 32]) is None  # 4 seeds decide R=32
    other = [dataclasses.replace(c, lr=0.02) for c in grid]  # another setup: nothing observed there
    assert "basis R=8 λ=0.01, basis R=32 λ=0.01 at a Δ val SD of 0.026 (prior" in seed_plan(store, other)


def test_cli_summary_margin_judges_table3(store, capsys, monkeypatch):
    monkeypatch.setenv("BASIS_LAB_DB_URL", store.url)
    for seed, d in enumerate((0.030, 0.031, 0.029)):
        _run(store, dataclasses.replace(BASE, estimator="exact", seed=seed), {20: 6.0})
        _run(store, dataclasses.replace(BASE, rank=32, seed=seed), {20: 6.0 + d})
    assert cli.main(["summary", "--format", "csv"]) == 0
    assert pd.read_csv(pd.io.common.StringIO(capsys.readouterr().out))["verdict"].tolist() == ["reference", "worse"]
    assert cli.main(["summary", "--format", "csv", "--margin", "0.05"]) == 0
    back = pd.read_csv(pd.io.common.StringIO(capsys.readouterr().out))
    assert back["verdict"].tolist() == ["reference", "equivalent"] and (back["margin"] == 0.05).all()
    assert cli.main(["summary", "--margin", "0"]) == 2
    assert "--margin: the equivalence margin must be a number of nats > 0" in capsys.readouterr().err


def test_a_real_tiny_run_at_full_rank_and_no_shrinkage_reads_no_spread(store):
    """Exact and BASIS at R = B·T (balanced hashing is then a signed permutation and the scalars
    are 1) with λ = 0 compute the same dW up to rounding: over 3 seeds Δ is the same tiny number
    at every seed, which is no evidence of equivalence (no interval), so Table 3 reads "no spread"
    rather than a verdict; with the rounding giving a spread it reads "equivalent"."""
    from engine.training.loop import train

    base = RunConfig(preset="tiny", steps=3, eval_interval=3, probe_interval=0, val_batches=1, lam=0.0)
    rows = base.effective_batch_size * base.effective_seq_len
    for seed in (0, 1, 2):
        for config in (dataclasses.replace(base, estimator="exact", seed=seed),
                       dataclasses.replace(base, estimator="basis", rank=rows, seed=seed)):
            run_id = store.runs.create_run(name=config.label(), config=config.to_dict(), estimator=config.estimator,
                                      rank=None if config.is_exact else config.rank, lam=config.lam, seed=seed,
                                      preset=config.preset, steps=config.steps)
            store.metrics.add_metrics(run_id, [(r.step, r.wall_time, k, v) for r in train(config) for k, v in r.values.items()])
    t = run_table3(store)
    row = _row(t, "basis", rows)
    assert row["paired_seeds"] == 3 and row["step"] == 3
    assert abs(row["delta_val_mean"]) < 1e-3, row.to_dict()
    assert row["verdict"] == (NO_SPREAD if row["delta_val_std"] == 0 else EQUIVALENT), row.to_dict()


def test_tost_power_at_many_seeds_and_at_the_margin():
    """Large n: the χ² mass is a narrow peak the integral must find (1,000 seeds once read 0 %).
    At a true Δ of exactly δ the test's size is α = 5 % once the SD is well estimated."""
    assert tost_power(1000, PRIOR_DELTA_SD, 0.02) > 0.999
    assert tost_power(10_000, 0.3, 0.02) > tost_power(2_000, 0.3, 0.02) > tost_power(500, 0.3, 0.02)
    assert tost_power(200, PRIOR_DELTA_SD, 0.02, true_delta=0.02) == pytest.approx(0.05, abs=0.002)
    assert tost_power(1, 0.01, 0.02) == 0.0 and tost_power(3, 0.0, 0.02) == 1.0
    with pytest.raises(ValueError, match="margin must be a number of nats > 0"):
        tost_power(3, 0.01, 0.0)
