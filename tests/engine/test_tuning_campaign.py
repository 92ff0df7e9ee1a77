"""A tuning campaign end to end, as users run it: queued by ``engine tune``, killed mid-tuning,
resumed by ``engine resume --all --queue-only`` and finished by two workers on one PostgreSQL
database; its comparison is queued exactly once, every method spends the same budget, and a
method whose untuned learning rate is a decade off its best is rescued by tuning.

The rescued method is basis R=32 with λ = 0.684: its dW is scaled by (1 − λ)² ≈ 0.1, so at
exact backprop's learning rate it trains as if at a tenth of it. Tuned over a decade either side
of that rate, it takes a larger one. The claim is paired over the evaluation seeds: for each
seed s, d_s = Δ_untuned(s) − Δ_tuned(s) with Δ = test loss(basis) − test loss(exact) at that
seed, and the one-sided 95 % t-interval of mean d (4 seeds) lies above 0."""

import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.stats

from engine.analysis import tuning
from engine.api import Lab
from engine.cli.main import main
from engine.reads import campaigns
from storage import RunStore
from tests.support.runs import wait_for
from tests.support.xla import twin_env

ROOT = Path(__file__).resolve().parents[2]
STEPS, TRIALS, EVAL_SEEDS = 60, 4, (0, 1, 2, 3)
TUNE = ["--preset", "tiny", "--ranks", "exact,32", "--lams", "0.684", "--lr", "0.1", "--tune", "lr",
        "--trials", str(TRIALS), "--tune-seeds", "1000", "--seeds", ",".join(map(str, EVAL_SEEDS)),
        "--steps", str(STEPS), "--val-batches", "4", "--eval-interval", "20", "--probe-interval", "0",
        "--checkpoint-interval", "20"]


def _worker(url: str, ckpt: Path, *extra: str) -> subprocess.Popen:
    env = {**twin_env(), "BASIS_LAB_CHECKPOINTS": str(ckpt)}
    return subprocess.Popen([sys.executable, "-m", "engine", "worker", "--db", url, *extra], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _kill_mid_tuning(store: RunStore, url: str, ckpt: Path, trial_ids: list[int]) -> None:
    """One worker trains trials until one has finished and the next has checkpointed; then SIGTERM."""
    first = _worker(url, ckpt)
    try:
        def midway() -> bool:
            runs = [store.runs.get_run(i) for i in trial_ids]
            return any(r.status == "finished" for r in runs) and any(
                r.status == "running" and (r.checkpoint_step or 0) >= 20 for r in runs)

        wait_for(midway, timeout=600, what="a finished trial and a checkpointed one")
        first.send_signal(signal.SIGTERM)
        out, _ = first.communicate(timeout=300)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 128 + signal.SIGTERM, out


def _deltas(store: RunStore, records) -> dict[int, float]:
    """Seed → test loss(basis) − test loss(exact) at the last step, of one side of the comparison."""
    metrics = store.metrics([r.id for r in records], names=["test_loss"])
    loss = {(r.estimator, r.seed): float(metrics.loc[(metrics["run_id"] == r.id) & (metrics["step"] == STEPS),
                                                     "value"].iloc[0]) for r in records}
    return {s: loss[("basis", s)] - loss[("exact", s)] for s in EVAL_SEEDS}


@pytest.mark.postgres
def test_a_killed_campaign_resumes_on_two_workers_compares_once_spends_equal_budgets_and_rescues(pg_url, tmp_path):
    ckpt = tmp_path / "ckpt"
    store = RunStore(pg_url)
    assert main(["tune", "--db", pg_url, *TUNE, "--queue-only", "--no-measure"]) == 0
    (campaign,) = store.campaigns.list()
    trial_ids = store.campaigns.runs_of(campaign.id)[0]
    assert len(trial_ids) == 2 * TRIALS

    _kill_mid_tuning(store, pg_url, ckpt, trial_ids)
    assert store.campaigns.get(campaign.id).stage == "tuning"
    interrupted = [i for i in trial_ids if store.runs.get_run(i).status == "interrupted"]
    assert interrupted, "the SIGTERM found no trial training"
    assert main(["resume", "--db", pg_url, "--all", "--queue-only"]) == 0
    workers = [_worker(pg_url, ckpt, "--idle-exit", "15") for _ in range(2)]
    for w in workers:
        out, _ = w.communicate(timeout=1500)
        assert w.returncode == 0, out

    campaign = store.campaigns.get(campaign.id)
    assert campaign.stage == "evaluating"
    spec = campaigns.spec_of(campaign)
    expected = spec.eval_configs(campaign.chosen["values"])
    comparison = [r for r in store.runs.list_runs() if r.sweep_id == campaign.eval_sweep_id]
    assert len(comparison) == len(expected) == len(store.runs.list_runs()) - len(trial_ids)  # queued once, nothing else
    assert sorted(r.name for r in comparison) == sorted(c.label() for c in expected)
    assert {r.status for r in [*comparison, *map(store.runs.get_run, trial_ids)]} == {"finished"}
    assert all("resumed" in store.runs.get_run(i).notes for i in interrupted)

    trials = campaigns.trials(store, campaign)
    spent = trials.groupby("method")["steps_done"].sum()
    assert list(spent) == [TRIALS * STEPS] * 2 == [spec.budget_steps()] * 2  # the same budget, every step run

    choices = tuning.choose(spec, trials).set_index("method")
    assert choices.loc["basis R=32 λ=0.684", "chosen"]["lr"] > choices.loc["exact", "chosen"]["lr"]
    tuned, untuned = campaigns.comparison(store, campaign)
    rescue = np.array([u - t for u, t in zip(_deltas(store, untuned).values(), _deltas(store, tuned).values())])
    test = scipy.stats.ttest_1samp(rescue, 0.0, alternative="greater")
    assert test.confidence_interval(0.95).low > 0, (rescue, test)

    with Lab(pg_url) as lab:  # what a user reads: both tables on the test split, each with its interval
        for table in (lab.tuned_summary(campaign.id), lab.tuned_summary(campaign.id, untuned=True)):
            row = table[table["estimator"] == "basis"].iloc[0]
            assert row["split"] == "test" and row["paired_seeds"] == len(EVAL_SEEDS)
            assert row["delta_val_ci95_low"] < row["delta_val_mean"] < row["delta_val_ci95_high"]
        assert lab.tuned_summary(campaign.id)["tuned"].str.startswith("lr=").all()
