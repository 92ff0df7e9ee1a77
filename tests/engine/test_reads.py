"""Verdicts that timing cannot fool: where Table 3 is read and why, divergence, the four words,
the validation set's own noise in Δ's interval, and Holm over a table's rows. Runs are
written through the project's own store; the statistics are checked against statsmodels and
by simulation with known truth."""

import dataclasses
import math

import numpy as np
import pandas as pd
import pytest
import statsmodels.formula.api as smf
from scipy import stats
from statsmodels.stats.anova import anova_lm

from engine.analysis import claims
from engine.analysis.report import to_markdown
from engine.analysis.summary import DIVERGED, holm_verdicts, table3
from engine.cli import main as cli
from engine.config import RunConfig
from engine.core.stats import (
    EQUIVALENT,
    INCONCLUSIVE,
    NOT_EQUIVALENT,
    WORSE,
    PairedDelta,
    holm,
    paired_delta,
    seeds_needed,
    tost_power,
)
from engine.reads import reports
from engine.reads.queries import read_runs, run_table3
from storage import RunStore
from tests.engine.test_summary import _row, _run

BASE = RunConfig(preset="paper", steps=600)
DIVERGED_ERROR = "training loss became nan at step 420; lower lr (now 0.01)"
SIM = np.random.default_rng(20261127)


@pytest.fixture
def store(tmp_path):
    return RunStore(f"sqlite:///{tmp_path / 's.db'}")


def _method(store, seeds, deltas, rank, steps=(0, 300, 600), status="finished", base=6.0):
    """Runs of basis R=``rank`` (exact for None) over ``seeds``, val loss base + seed/100 + Δ at
    every step past 0 (step 0: the same for every method of a seed), with ``status``."""
    ids = []
    for seed, delta in zip(seeds, deltas):
        config = dataclasses.replace(BASE, seed=seed, **({"estimator": "exact"} if rank is None else {"rank": rank}))
        values = {s: (9.0 + seed / 100 if s == 0 else base + seed / 100 + delta) for s in steps}
        run_id = _run(store, config, values)
        store.runs.set_status(run_id, status)
        ids.append(run_id)
    return ids


def _claim_c(t3):
    return {v.key: v for v in claims.judge(t3, None, None)}["c"]


# --------------------------------------------------------------------------- 1. never a verdict at step 0

def test_a_live_sweep_with_one_run_at_step_0_reads_not_trained_yet(store, capsys, monkeypatch):
    """Four seeds trained to 600, the fifth R=32 run only validated at step 0: today the whole
    table is read at step 0, where Δ is exactly 0 and every method read "equivalent"."""
    _method(store, range(5), [0.0] * 5, None)
    _method(store, range(4), [0.5, 0.52, 0.47, 0.51], 8)
    _method(store, range(4), [0.1, 0.09, 0.11, 0.1], 32)
    live = _method(store, [4], [0.1], 32, steps=(0,), status="running")[0]
    t = run_table3(store)
    assert set(t["step"]) == {0}
    for rank in (8, 32):
        row = _row(t, "basis", rank)
        assert row["verdict"] == "not trained yet" and math.isnan(row["delta_val_mean"]), row.to_dict()
    assert "Not trained yet" in t["read"].iloc[0] and f"#{live} (running, validated to step 0)" in t["read"].iloc[0]
    assert _claim_c(t).verdict == claims.NOT_MEASURED
    monkeypatch.setenv("BASIS_LAB_DB_URL", store.url)
    assert cli.main(["summary"]) == 0
    out = capsys.readouterr().out
    assert "equivalent" not in out.replace("not equivalent", "") and "Note: Not trained yet" in out


def test_a_run_that_failed_before_its_first_validation_does_not_hold_the_read_at_step_0(store):
    _method(store, range(3), [0.0] * 3, None)
    _method(store, range(3), [0.5, 0.52, 0.47], 8)
    lost = _method(store, [3], [0.0], 8, steps=(0,), status="failed")[0]
    store.runs.set_status(lost, "failed", error=DIVERGED_ERROR)
    _method(store, [3], [0.0], None)
    t = run_table3(store)
    row = _row(t, "basis", 8)
    assert row["step"] == 600 and row["verdict"] == WORSE and row["diverged"] == "1 of 4 seeds (s3)"
    assert f"left out: #{lost} diverged (seed 3)" in row["read"]


# --------------------------------------------------------------------------- 2. divergence counts

def test_a_diverged_seed_is_never_equivalent_and_claim_c_is_not_supported(store):
    """Four seeds within 0.002 of exact read "equivalent" today, although the fifth diverged."""
    _method(store, range(5), [0.0] * 5, None)
    _method(store, range(4), [0.001, -0.001, 0.002, 0.0], 32)
    lost = _method(store, [4], [0.0], 32, steps=(0, 300), status="failed")[0]
    store.runs.set_status(lost, "failed", error=DIVERGED_ERROR)
    t = run_table3(store, adjust=False)
    row = _row(t, "basis", 32)
    assert row["step"] == 600 and row["paired_seeds"] == 4
    assert row["verdict"] == DIVERGED and row["diverged"] == "1 of 5 seeds (s4)"
    c = _claim_c(t)
    assert c.verdict == claims.NOT_SUPPORTED and "diverged in 1 of 5 seeds (s4)" in c.evidence
    assert "| diverged |" in run_table3_markdown(store) or "diverged" in run_table3_markdown(store)


def test_a_seed_where_exact_diverged_too_is_not_counted_against_the_method(store):
    _method(store, range(4), [0.0] * 4, None)
    _method(store, range(4), [0.001, -0.001, 0.002, 0.0], 32)
    for rank in (None, 32):
        run_id = _method(store, [4], [0.0], rank, steps=(0, 300), status="failed")[0]
        store.runs.set_status(run_id, "failed", error=DIVERGED_ERROR)
    row = _row(run_table3(store, adjust=False), "basis", 32)
    assert row["diverged"] == "" and row["verdict"] == EQUIVALENT


def run_table3_markdown(store):
    from engine.reads.queries import table3_text

    return table3_text(run_table3(store), "markdown")


# --------------------------------------------------------------------------- 3. every read says what it read

def test_summary_and_report_say_where_they_read_and_why(store, capsys, monkeypatch):
    _method(store, range(3), [0.0] * 3, None, steps=(0, 180, 300))
    _method(store, range(2), [0.3, 0.31], 8, steps=(0, 180, 300))
    slow = _method(store, [2], [0.29], 8, steps=(0, 180), status="running")[0]
    monkeypatch.setenv("BASIS_LAB_DB_URL", store.url)
    assert cli.main(["summary"]) == 0
    said = f"Read at step 180, not 300; held back by #{slow} (running, validated to step 180)"
    out = capsys.readouterr().out
    assert said in out
    assert "validated there on the interim batches (32 of 256; a run's last step reads them all)" in out  # 180 < 600
    report = reports.build(store, reports.selection_of(runs=[r.id for r in store.runs.list_runs()]))
    assert said in to_markdown(report, "figures")


def test_a_read_at_the_runs_last_step_reads_every_validation_batch_and_says_nothing_of_interim(store):
    _method(store, range(2), [0.0] * 2, None, steps=(0, 300, 600))
    _method(store, range(2), [0.01] * 2, 8, steps=(0, 300, 600))
    reads = {int(r["step"]): r["read"] for _, r in table3(store.runs.list_runs(), store.metrics.metrics_after(
        {r.id: 0 for r in store.runs.list_runs()})).iterrows()}
    assert list(reads) == [600] and "interim" not in reads[600]
    early = table3(store.runs.list_runs(), store.metrics.metrics_after({r.id: 0 for r in store.runs.list_runs()}), at_step=300)
    assert "on the interim batches (32 of 256" in early["read"].iloc[-1]


# --------------------------------------------------------------------------- 4. four honest words

def test_a_90_percent_interval_beyond_the_margin_reads_not_equivalent_and_claim_c_agrees(store):
    """90 % [+0.029, +0.171] lies wholly above δ while the 95 % interval crosses 0: today
    Table 3 read "inconclusive (more seeds decide)" beside claim (c)'s "not supported"."""
    _method(store, range(3), [0.0] * 3, None)
    _method(store, range(3), [0.058, 0.1, 0.142], 32)
    row = _row(run_table3(store, adjust=False), "basis", 32)
    assert row["delta_val_ci90_low"] > 0.02 and row["delta_val_ci95_low"] < 0 < row["delta_val_ci95_high"]
    assert row["verdict"] == NOT_EQUIVALENT
    c = _claim_c(run_table3(store, adjust=False))
    assert c.verdict == claims.NOT_SUPPORTED and "Table 3 reads not equivalent" in c.evidence
    # Holm over the row's three tests: the non-equivalence test's p 0.040 is no longer below 5 %;
    # the table and the claim still say the same thing
    held = run_table3(store)
    assert _row(held, "basis", 32)["verdict"] == INCONCLUSIVE and _claim_c(held).verdict == claims.INCONCLUSIVE


def test_the_words_follow_the_intervals_of_scipy():
    for n in (3, 5, 8):
        for _ in range(200):
            d = SIM.normal(SIM.uniform(-0.06, 0.06), SIM.uniform(0.005, 0.05), n)
            r = paired_delta(d)
            se = stats.sem(d)
            lo95, hi95 = stats.t.interval(0.95, n - 1, loc=d.mean(), scale=se)
            lo90, hi90 = stats.t.interval(0.90, n - 1, loc=d.mean(), scale=se)
            word = EQUIVALENT if -0.02 < lo90 and hi90 < 0.02 else "better" if hi95 < 0 else WORSE if lo95 > 0 else \
                NOT_EQUIVALENT if lo90 > 0.02 or hi90 < -0.02 else INCONCLUSIVE
            assert r.verdict == word, (d, r)


# --------------------------------------------------------------------------- 5. the validation set's own noise

def test_the_two_components_are_the_crossed_anova_of_statsmodels():
    S, B = 5, 40
    D = 0.05 + SIM.normal(0, 0.01, (S, 1)) + SIM.normal(0, 0.03, (1, B)) + SIM.normal(0, 0.02, (S, B))
    r = paired_delta(D.mean(axis=1), batches=D)
    frame = pd.DataFrame({"d": D.ravel(), "seed": np.repeat(np.arange(S), B), "batch": np.tile(np.arange(B), S)})
    table = anova_lm(smf.ols("d ~ C(seed) + C(batch)", data=frame).fit())
    ms = table["sum_sq"] / table["df"]
    ms_seed, ms_batch, ms_res = ms["C(seed)"], ms["C(batch)"], ms["Residual"]
    assert r.se_seed**2 == pytest.approx(ms_seed / (S * B), rel=1e-9)
    assert r.se_batch**2 == pytest.approx((ms_batch - ms_res) / (S * B), rel=1e-9)
    var = r.se_seed**2 + r.se_batch**2
    terms = [(ms_seed / (S * B), S - 1), (ms_batch / (S * B), B - 1), (ms_res / (S * B), (S - 1) * (B - 1))]
    df = var**2 / sum(v**2 / f for v, f in terms)
    assert r.df == pytest.approx(df, rel=1e-9) and r.batches == B
    half = stats.t.ppf(0.975, df) * math.sqrt(var)
    assert (r.ci_low, r.ci_high) == pytest.approx((D.mean() - half, D.mean() + half), rel=1e-9)


def test_table3_puts_the_stored_per_batch_losses_into_the_interval(store):
    B = 32
    batch_effect = SIM.normal(0, 0.05, B)
    for seed in range(4):
        exact_losses = 6.0 + SIM.normal(0, 0.3, B)
        for rank, shift in ((None, 0.0), (32, 0.03 + 0.005 * seed)):
            config = dataclasses.replace(BASE, seed=seed, **({"estimator": "exact"} if rank is None else {"rank": rank}))
            losses = exact_losses + shift + (0 if rank is None else batch_effect + SIM.normal(0, 0.01, B))
            run_id = _run(store, config, {0: 9.0, 600: float(losses.mean())})
            store.runs.set_status(run_id, "finished")
            store.eval_losses.add_eval_losses(run_id, [(600, "val", losses.tolist())])
    row = _row(run_table3(store), "basis", 32)
    seeds_only = _row(table3(*read_runs(store)), "basis", 32)  # no per-batch losses given: the seeds alone
    assert seeds_only["val_batches"] == 0 and math.isnan(seeds_only["delta_val_se_batch"])
    assert row["val_batches"] == B and row["delta_val_se_batch"] > 0.005
    assert row["delta_val_se_seed"] == pytest.approx(seeds_only["delta_val_se_seed"], rel=1e-12)
    width, narrow = (r["delta_val_ci95_high"] - r["delta_val_ci95_low"] for r in (row, seeds_only))
    assert width > narrow
    assert "SE seeds / val" in run_table3_markdown(store)


def test_the_interval_with_both_sources_covers_where_the_seeds_alone_do_not():
    """Known truth μ, seeds and validation batches both noisy (the batch term about as large as
    measured at R = 8): the two-component 95 % interval covers μ in ≥ 93 % of 600 replicates;
    the seeds-only interval of version 4 covers far less."""
    S, B, mu, reps = 5, 64, 0.05, 600
    new = old = 0
    for _ in range(reps):
        D = mu + SIM.normal(0, 0.012, (S, 1)) + SIM.normal(0, 0.09, (1, B)) + SIM.normal(0, 0.03, (S, B))
        both, seeds = paired_delta(D.mean(axis=1), batches=D), paired_delta(D.mean(axis=1))
        new += both.ci_low <= mu <= both.ci_high
        old += seeds.ci_low <= mu <= seeds.ci_high
    print(f"coverage of 95 % intervals over {reps} replicates: seeds and batches {new / reps:.3f}, seeds only "
          f"{old / reps:.3f}")
    assert new / reps >= 0.93 and old / reps < 0.85, (new / reps, old / reps)


# --------------------------------------------------------------------------- 6. several ranks, one 5 % level

def _rows(deltas_by_rank):
    rows = []
    for rank, deltas in deltas_by_rank.items():
        d: PairedDelta = paired_delta(deltas)
        rows.append({"estimator": "basis", "rank": rank, "delta_val_mean": d.mean, "verdict": d.verdict,
                     "tost_p": d.tost_p, "diff_p": d.diff_p, "noneq_p": d.noneq_p, "diverged": "",
                     "holm_tests": 0, "tost_p_holm": np.nan, "diff_p_holm": np.nan, "noneq_p_holm": np.nan})
    return pd.DataFrame(rows)


def test_holm_keeps_the_family_wise_false_equivalent_rate_at_5_percent():
    """Three ranks each truly δ worse than exact (so "equivalent" is false for each), 8 seeds:
    over 2,000 replicates some row reads "equivalent" in about 14 % unadjusted, ≤ 5 % with Holm."""
    reps, n, sd = 2000, 8, 0.02
    any_raw = any_holm = 0
    for _ in range(reps):
        frame = _rows({r: SIM.normal(0.02, sd, n) for r in (8, 16, 32)})
        any_raw += (frame["verdict"] == EQUIVALENT).any()
        any_holm += (holm_verdicts(frame, True)["verdict"] == EQUIVALENT).any()
    print(f"family-wise false 'equivalent' over {reps} replicates, 3 ranks at Δ = δ: unadjusted {any_raw / reps:.3f}, "
          f"Holm {any_holm / reps:.3f}")
    assert any_holm / reps <= 0.05 < any_raw / reps


def test_the_table_adjusts_by_default_and_says_so(store, capsys, monkeypatch):
    _method(store, range(4), [0.0] * 4, None)
    for rank, deltas in ((8, [0.004, 0.012, 0.016, 0.0]), (16, [0.0, 0.014, 0.006, 0.01]),
                         (32, [0.002, 0.008, 0.012, -0.004])):
        _method(store, range(4), deltas, rank)
    raw, held = run_table3(store, adjust=False), run_table3(store)
    for rank in (8, 16, 32):
        assert _row(raw, "basis", rank)["verdict"] == EQUIVALENT
        assert _row(held, "basis", rank)["verdict"] == INCONCLUSIVE and _row(held, "basis", rank)["holm_tests"] == 9
    monkeypatch.setenv("BASIS_LAB_DB_URL", store.url)
    assert cli.main(["summary"]) == 0
    assert "Holm's adjustment over its 9 tests" in capsys.readouterr().out
    assert cli.main(["summary", "--no-adjust"]) == 0
    out = capsys.readouterr().out
    assert "Holm" not in out and out.count(EQUIVALENT) >= 3


# --------------------------------------------------------------------------- a real sweep, read while it runs

def test_a_real_tiny_sweep_read_while_running_has_no_verdict_before_every_run_trained(store):
    """Six real tiny-preset runs (exact and basis R=4 over seeds 0–2) trained side by side, their
    records written through the store as they come, Table 3 read at four moments."""
    from engine.training.loop import train

    base = RunConfig(preset="tiny", steps=20, eval_interval=10, probe_interval=0, val_batches=4)
    trainings = {}
    for seed in (0, 1, 2):
        for method in ({"estimator": "exact"}, {"rank": 4}):
            config = dataclasses.replace(base, seed=seed, **method)
            run_id = store.runs.create_run(name=config.label(), config=config.to_dict(), estimator=config.estimator,
                                      rank=None if config.is_exact else config.rank, lam=config.lam, seed=seed,
                                      preset=config.preset, steps=config.steps, status="running")
            trainings[run_id] = train(config)

    def write(run_id, record):
        store.metrics.add_metrics(run_id, [(record.step, record.wall_time, k, v) for k, v in record.values.items()],
                          eval_losses=[(record.step, k, v.tolist()) for k, v in record.batch_losses.items()])

    def basis_row():
        t = run_table3(store)
        return _row(t, "basis", 4), t["read"].iloc[0]

    for run_id, records in trainings.items():  # every run has validated its initial parameters only
        write(run_id, next(records))
    row, read = basis_row()
    assert row["step"] == 0 and row["verdict"] == "not trained yet" and "Not trained yet" in read
    slow = max(trainings)
    for run_id, records in trainings.items():  # all but one trained to the end
        if run_id != slow:
            for record in records:
                write(run_id, record)
            store.runs.set_status(run_id, "finished")
    row, read = basis_row()
    assert row["verdict"] == "not trained yet" and f"#{slow} (running, validated to step 0)" in read, read
    write(slow, next(trainings[slow]))  # the slow run reaches its first validation past 0
    row, read = basis_row()
    assert row["step"] == 10 and row["paired_seeds"] == 3 and row["val_batches"] == 4, row.to_dict()
    assert row["verdict"] != "not trained yet" and f"Read at step 10, not 20; held back by #{slow}" in read
    for record in trainings[slow]:
        write(slow, record)
    store.runs.set_status(slow, "finished")
    row, read = basis_row()
    assert row["step"] == 20 and read == "Read at step 20, the furthest any run validated at."
    assert row["delta_val_se_batch"] >= 0 and np.isfinite(row["delta_val_ci95_low"])


# --------------------------------------------------------------------------- 7. power where it helps

def test_tost_power_with_a_floor_is_the_simulated_rate_and_the_floor_costs_seeds():
    """With a variance floor that seeds share (the validation batches) and each test at α/m,
    the power integral equals the simulated rate of |d̄| + q·se < δ, se² = s²/n + floor."""
    n, sd, floor, alpha, margin, reps = 6, 0.012, 0.004**2, 0.05 / 3, 0.02, 20_000
    q = stats.t.ppf(1 - alpha, n - 1)
    d = SIM.normal(0.0, sd, (reps, n)) + SIM.normal(0.0, math.sqrt(floor), (reps, 1))
    se = np.sqrt(d.var(axis=1, ddof=1) / n + floor)
    rate = np.mean(np.abs(d.mean(axis=1)) + q * se < margin)
    assert tost_power(n, sd, margin, alpha=alpha, floor=floor) == pytest.approx(rate, abs=4 * math.sqrt(0.25 / reps))
    plain, held = seeds_needed(sd, margin), seeds_needed(sd, margin, alpha=alpha, floor=floor)
    assert held > plain and tost_power(held, sd, margin, alpha=alpha, floor=floor) >= 0.8
    assert seeds_needed(sd, margin, floor=(margin / 1.5) ** 2) is None  # the floor alone fills the margin


def test_an_undecided_row_plans_with_its_batch_floor_and_the_tables_level(store):
    B = 16
    for seed in range(3):
        exact_losses = 6.0 + SIM.normal(0, 0.3, B)
        for rank, shift in ((None, 0.0), (32, 0.008 * seed)):
            config = dataclasses.replace(BASE, seed=seed, **({"estimator": "exact"} if rank is None else {"rank": rank}))
            losses = exact_losses + shift + (0 if rank is None else SIM.normal(0, 0.02, B))
            run_id = _run(store, config, {0: 9.0, 600: float(losses.mean())})
            store.runs.set_status(run_id, "finished")
            store.eval_losses.add_eval_losses(run_id, [(600, "val", losses.tolist())])
    t = run_table3(store)
    row = _row(t, "basis", 32)
    assert row["verdict"] == INCONCLUSIVE and row["val_batches"] == B
    plan = {v.key: v for v in claims.judge(t, None, None)}["c"].power
    assert "inconclusive" in plan and f"the validation batches' SE {row['delta_val_se_batch']:.3g}" in plan, plan


def test_holm_is_statsmodels_holm_without_its_garbage_collection():
    from statsmodels.stats.multitest import multipletests

    for m in (1, 2, 3, 9, 40):
        p = SIM.uniform(0, 0.2, m) ** 2
        assert np.allclose(holm(p), multipletests(p, method="holm")[1], rtol=0, atol=1e-15)
    with_nan = np.array([0.01, np.nan, 0.04, 0.03])
    out = holm(with_nan)
    assert np.isnan(out[1]) and np.allclose(out[[0, 2, 3]], multipletests(with_nan[[0, 2, 3]], method="holm")[1])
    assert (holm(np.ones(5)) == 1).all() and holm(np.array([])).size == 0


def test_an_unknown_estimate_names_four_models_then_counts_the_rest():
    from engine.reads.estimates import MISSING_NAMED, GridEstimate

    labels = tuple(f"basis R={r}" for r in (1, 2, 4, 8, 16, 32))
    text = GridEstimate(None, {}, missing=labels).missing_text()
    assert text.startswith("no finished run of basis R=1, basis R=2, basis R=4, basis R=8, 2 more, nor of their models")
    assert MISSING_NAMED == 4 and "R=16" not in text
    assert GridEstimate(None, {}, missing=("exact",)).missing_text().startswith("no finished run of exact, nor of its model")
