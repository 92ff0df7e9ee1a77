"""Tuning campaigns: the protocol (Optuna's QMC points, the same for every method), its refusals,
the choice read from the trials, equal budgets, and a comparison queued exactly once."""

import math
import threading

import numpy as np
import pandas as pd
import pytest

from engine.analysis import tuning
from engine.cli.main import main
from engine.config import ConfigError, RunConfig, Sweep
from engine.config.tuning import Range, TuneSpec, parse_ranges, qmc_points
from engine.reads import campaigns as campaign_reads
from engine.runner import campaigns
from storage import RunStore

BASE = RunConfig(preset="tiny", steps=20, eval_interval=20, probe_interval=0, val_batches=2, lr=0.05)
GRID = Sweep(BASE, estimators=("basis",), ranks=(8,), lams=(0.0,), seeds=(0,), with_exact=True)


def _spec(**changes) -> TuneSpec:
    values = dict(grid=GRID, ranges=(Range.around("lr", 0.05),), trials=4, tune_seeds=(100,), eval_seeds=(0, 1))
    return TuneSpec(**{**values, **changes})


def test_points_are_optuna_qmc_draws_inside_the_log_range_the_same_for_every_method():
    spec = _spec()
    lrs = [p["lr"] for p in spec.points]
    assert all(0.005 <= x <= 0.5 for x in lrs) and len(set(lrs)) == 4
    assert qmc_points(spec.ranges, 4, 0) == [dict(p) for p in spec.points]  # seeded: drawn again the same
    assert qmc_points(spec.ranges, 4, 1) != [dict(p) for p in spec.points]
    by_method: dict = {}
    for method, i, config in spec.trial_configs():
        by_method.setdefault(method, []).append((i, config.lr, config.seed))
    assert set(by_method) == {"exact", "basis R=8"}
    assert by_method["exact"] == by_method["basis R=8"] == [(i, x, 100) for i, x in enumerate(lrs)]
    # a log-uniform draw: the logs of many points spread evenly over the range (Sobol: low discrepancy)
    logs = np.log10([p["lr"] for p in qmc_points((Range("lr", 1e-3, 1e-1),), 64, 0)])
    assert np.histogram(logs, bins=4, range=(-3, -1))[0].min() >= 12


def test_a_stored_protocol_reads_back_equal():
    spec = _spec(trials=3)
    again = TuneSpec.from_dict(spec.to_dict())
    assert again == spec and again.points == spec.points and again.budget_steps() == 3 * 1 * 20


@pytest.mark.parametrize("changes, said", [
    ({"eval_seeds": (100, 1)}, "tuning and evaluation seeds overlap (100)"),
    ({"trials": 0}, "--trials must be an integer in [1, 1000]"),
    ({"sampler_seed": -1}, "--sampler-seed must be an integer in [0, 2**32)"),
])
def test_bad_protocols_are_refused_with_one_line(changes, said):
    with pytest.raises(ConfigError) as e:
        _spec(**changes)
    assert said in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("text, said", [
    ("lr=0.1:0.01", "0 < LOW < HIGH"),
    ("lr=-1:0.1", "0 < LOW < HIGH"),
    ("momentum=0.5:2", "momentum is at most 1"),
    ("steps", "only float fields of a run can be tuned"),
    ("lam", "no decade around it"),
    ("lr=0.1", "a range is FIELD=LOW:HIGH"),
    ("lr,lr", "each field once"),
])
def test_bad_ranges_are_refused_with_one_line(text, said):
    with pytest.raises(ConfigError) as e:
        parse_ranges(text, BASE)
    assert said in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("argv, said", [
    (["--tune-seeds", "0", "--seeds", "0,1"], "tuning and evaluation seeds overlap (0)"),
    (["--tune", "lr=1:0.5"], "0 < LOW < HIGH"),
    (["--ranks", "exact,8", "--tune", "lam=0.01:0.1"], "exact backprop has no λ"),
    (["--ranks", ""], "ranks: give at least one rank or 'exact'"),
    (["--trials", "0"], "--trials must be >= 1"),
    (["--sampler-seed", "-1"], "--sampler-seed must be an integer in [0, 2**32)"),
    (["--tune", "lr=nan:1"], "0 < LOW < HIGH"),
])
def test_the_command_refuses_bad_input_in_one_line_and_writes_nothing(tmp_path, capsys, argv, said):
    db = tmp_path / "lab.db"
    assert main(["tune", "--db", f"sqlite:///{db}", "--preset", "tiny", "--queue-only", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert said in err and len(err.splitlines()) == 1, err
    assert not db.exists()  # every flag is checked before the database is opened


def test_tune_help_lists_every_schema_flag_and_the_protocols(capsys):
    with pytest.raises(SystemExit):
        main(["tune", "--help"])
    out = capsys.readouterr().out
    flags = [f"--{name.replace('_', '-')}" for name in RunConfig.__dataclass_fields__
             if name not in ("dataset_options", "estimator", "rank", "lam", "seed")]
    missing = [f for f in [*flags, "--estimators", "--ranks", "--lams", "--seeds", "--tune", "--trials", "--tune-seeds",
                           "--sampler-seed", "--no-untuned", "--queue-only", "--yes", "--margin"] if f not in out]
    assert not missing


def _trials(rows) -> pd.DataFrame:
    frame = pd.DataFrame(rows, columns=["run_id", "method", "trial", "seed", "status", "steps_done", "val_loss",
                                        "diverged", "lr"])
    return frame


def test_the_choice_is_the_lowest_mean_over_tuning_seeds_a_diverged_trial_never_and_edges_flagged():
    spec = _spec(tune_seeds=(100, 101))
    lr = [p["lr"] for p in spec.points]
    order = np.argsort(lr)
    rows, rid = [], 0
    losses = {  # trial index → (seed 100, seed 101)
        int(order[0]): (5.0, 5.2), int(order[1]): (4.0, 4.4), int(order[2]): (3.9, math.inf), int(order[3]): (4.1, 4.2)}
    for method in ("exact", "basis R=8"):
        for i, (a, b) in losses.items():
            for seed, loss in ((100, a), (101, b)):
                rid += 1
                lost = math.isinf(loss)
                rows.append([rid, method, i, seed, "failed" if lost else "finished", 20 if not lost else 7, loss, lost,
                             lr[i]])
    frame = _trials(rows)
    choices = tuning.choose(spec, frame)
    assert list(choices["method"]) == ["exact", "basis R=8"]
    for row in choices.itertuples():
        # order[3] (4.15 mean) beats order[1] (4.2); order[2] diverged on one seed: never chosen
        assert row.trial == int(order[3]) and row.chosen == {"lr": lr[int(order[3])]}
        assert math.isclose(row.val_loss, 4.15)
        assert row.edge == "lr (highest tried)"
        assert row.budget_steps == 4 * 2 * 20 and row.spent_steps == 7 * 20 + 7
    shown = tuning.choice_table(choices)
    assert shown["at the range's edge"].iloc[0] == "lr (highest tried): widen it"


def _settle(store: RunStore, ids, loss_of) -> None:
    """Each trial ended as a worker would have left it: finished, with its last validation loss."""
    for run_id in ids:
        r = store.runs.get_run(run_id)
        store.metrics.add_metrics(run_id, [(r.steps, 1.0, "val_loss", loss_of(r))])
        store.runs.heartbeat(run_id, r.steps)
        store.runs.set_status(run_id, "finished")


def test_the_comparison_is_queued_exactly_once_however_many_notice_at_once(db_url):
    store = RunStore(db_url)
    spec = _spec()
    cid, ids = campaigns.start(store, spec)
    assert len(ids) == 2 * 4 and store.campaigns.get(cid).stage == "tuning"
    _settle(store, ids[:-1], lambda r: 10 * abs(math.log(r.config["lr"] / 0.1)))
    assert campaigns.advance(store, cid) == []  # one trial still queued: not yet
    _settle(store, ids[-1:], lambda r: 10 * abs(math.log(r.config["lr"] / 0.1)))
    results: list = []
    barrier = threading.Barrier(4)

    def notice():
        mine = RunStore(db_url)
        barrier.wait()
        results.append(campaigns.advance(mine, cid))
        mine.close()

    threads = [threading.Thread(target=notice) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    queued = [r for r in results if r]
    assert len(queued) == 1, results
    campaign = store.campaigns.get(cid)
    assert campaign.stage == "evaluating"
    tuned, untuned = campaign_reads.comparison(store, campaign)
    assert sorted({r.id for r in [*tuned, *untuned]}) == sorted(queued[0]) == store.campaigns.runs_of(cid)[1]
    best = min((p["lr"] for p in spec.points), key=lambda x: abs(math.log(x / 0.1)))
    assert {r.config["lr"] for r in tuned} == {best} and {r.seed for r in tuned} == {0, 1}
    assert {r.config["lr"] for r in untuned} == {0.05} and len(untuned) == 4
    assert campaigns.advance_all(store) == []  # advanced already: nothing more, ever


def test_the_pruners_stop_a_trial_behind_its_rung_and_never_a_first_one():
    from engine.analysis.pruning import decide

    earlier = [({s: 5.0 - 0.01 * s * (1 + i / 10) for s in range(10, 91, 10)}, "finished") for i in range(9)]
    behind, ahead = {s: 9.0 for s in range(10, 91, 10)}, {s: 1.0 for s in range(10, 91, 10)}
    assert decide("halving", 10, 90, earlier, {10: 9.0}, "s") is True  # far behind at the first rung
    for name in ("halving", "hyperband"):  # Hyperband's bracket (its first rung) depends on the study
        assert decide(name, 10, 90, earlier, behind, "s") is True
        assert decide(name, 10, 90, earlier, ahead, "s") is False  # ahead of every earlier trial
        assert decide(name, 10, 90, [], behind, "s") is False  # nothing to be behind


def test_a_pruned_campaign_stops_bad_trials_early_and_counts_their_steps_in_the_budget(tmp_path):
    db = f"sqlite:///{tmp_path / 'lab.db'}"
    argv = ["tune", "--db", db, "--preset", "tiny", "--estimators", "exact", "--ranks", "exact", "--steps", "30", "--eval-interval", "10",
            "--probe-interval", "0", "--val-batches", "2", "--tune", "lr=0.0003:1", "--trials", "5",
            "--tune-seeds", "7", "--seeds", "0", "--no-untuned", "--pruner", "halving", "--no-measure"]
    assert main(argv) == 0
    store = RunStore(db)
    (campaign,) = store.campaigns.list()
    spec = campaign_reads.spec_of(campaign)
    assert spec.pruner == "halving"
    trials = campaign_reads.trials(store, campaign)
    pruned = trials[trials["pruned"]]
    assert len(pruned) >= 1 and (pruned["steps_done"] < 30).all() and (pruned["status"] == "cancelled").all()
    assert not trials.loc[trials["trial"] == 0, "pruned"].any()  # the first trial has nobody to fall behind
    choices = tuning.choose(spec, trials)
    row = choices.iloc[0]
    assert row.spent_steps == trials["steps_done"].sum() < row.budget_steps == 5 * 30
    assert row.trial not in set(pruned["trial"])
    assert store.campaigns.get(campaign.id).stage == "evaluating"
    assert [r.status for r in campaign_reads.comparison(store, store.campaigns.get(campaign.id))[0]] == ["finished"]


def _record(run_id: int, config: RunConfig, status: str = "finished"):
    from types import SimpleNamespace

    return SimpleNamespace(id=run_id, config=config.to_dict(), steps=config.steps, status=status, error=None,
                           steps_done=config.steps if status == "finished" else 0, seed=config.seed)


def test_tuning_lambda_on_a_grid_at_a_nonzero_lambda_finds_every_trial_and_its_untuned_value():
    grid = Sweep(BASE, estimators=("basis",), ranks=(8,), lams=(0.01,), seeds=(0,), with_exact=False)
    spec = TuneSpec(grid, parse_ranges("lr, lam", BASE.replace(lam=0.01)), 3, (100,), (0, 1))
    assert spec.ranges[1] == Range("lam", 0.001, 0.1) and spec.base_value("lam") == 0.01
    records = [_record(i, c) for i, (_, _, c) in enumerate(spec.trial_configs(), start=1)]
    losses = [(i, c.steps, "val_loss", 5.0 - c.lr) for i, (_, _, c) in enumerate(spec.trial_configs(), start=1)]
    metrics = pd.DataFrame(losses, columns=["run_id", "step", "name", "value"])
    frame = tuning.trial_frame(spec, records, metrics)
    assert list(frame["method"]) == ["basis R=8 λ=0.01"] * 3 and sorted(frame["trial"]) == [0, 1, 2]
    choices = tuning.choose(spec, frame)
    assert choices["chosen"].iloc[0] and not choices["edge"].iloc[0].startswith("lam (lowest")
    chosen = tuning.chosen_values(spec, choices)
    comparison = [_record(100 + i, c) for i, c in enumerate(spec.eval_configs(chosen))]
    tuned, untuned = tuning.split_comparison(spec, chosen, comparison)
    assert len(tuned) == 2 and len(untuned) == 2 and {r.config["lam"] for r in untuned} == {0.01}


def test_a_method_without_a_finished_trial_is_stored_as_json_without_nan():
    import json

    spec = _spec(trials=2)
    rows = [[i + 1, m, i, 100, "failed", 3, math.nan, False, p["lr"]]
            for m in ("exact", "basis R=8") for i, p in enumerate(spec.points)]
    frame = _trials(rows).assign(pruned=False)
    stored = tuning.stored_choices(tuning.choose(spec, frame))
    json.dumps(stored, allow_nan=False)  # PostgreSQL's json refuses NaN
    assert [c["trial"] for c in stored] == [None, None] and [c["chosen"] for c in stored] == [{}, {}]


def test_the_plan_counts_every_comparison_run_for_the_launch_rule(tmp_path):
    from engine.reads.tuning_plan import plan_lines

    spec = _spec(eval_seeds=tuple(range(10)))
    trials, comparison, lines = plan_lines(spec, RunStore(f"sqlite:///{tmp_path / 'lab.db'}"), 1)
    assert len(trials) == 2 * 4 and len(comparison) == 2 * 10 * 2  # each method, seed, chosen and untuned
    assert "up to 40 runs" in lines[1]
