"""``python -m engine reproduce``: the paper's grid, defined once (``engine.config.reproduce``)."""

import pytest

from engine.cli.main import main
from engine.config import PAPER_RANKS, REPRODUCE_TAG, RunConfig, eval_interval_for, reproduction_sweep
from storage import RunStore


@pytest.fixture
def db(tmp_path):
    return f"sqlite:///{tmp_path / 'reproduce.db'}"


def test_the_grid_is_the_papers():
    sweep = reproduction_sweep()
    configs = sweep.expand()
    assert len(configs) == 3 * (1 + len(PAPER_RANKS)) == 18
    assert sorted((c.estimator, c.rank if not c.is_exact else None, c.lam, c.seed) for c in configs) == sorted(
        [("exact", None, 0.0, s) for s in (0, 1, 2)] + [("basis", r, 0.01, s) for r in (1, 8, 16, 32, 64) for s in (0, 1, 2)])
    assert all(c.preset == "paper" and c.optimizer == "sgd" and c.lr == 0.01 and c.momentum == 0.9
               and c.steps == 50_000 and c.eval_interval == 1000 and c.probe_interval == 1000 for c in configs)
    assert sweep.tags == (REPRODUCE_TAG,) == ("reproduce",)


@pytest.mark.parametrize("steps, interval", [(50_000, 1000), (10_000, 1000), (300, 30), (25, 2), (5, 1)])
def test_a_shorter_reproduction_still_validates_about_ten_times(steps, interval):
    assert eval_interval_for(steps) == interval
    assert {c.eval_interval for c in reproduction_sweep(steps, (4,)).expand()} == {interval}


def test_queue_only_queues_exactly_the_grid_for_workers(db, capsys):
    rc = main(["reproduce", "--db", db, "--queue-only", "--steps", "40", "--seeds", "0,1", "--no-measure"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert "the paper's grid: 12 runs" in captured.err and "estimated time (by one worker): unknown" in captured.err
    # two seeds cannot decide claim (c) at the prior spread: said before anything is queued
    warning = "warning: 2 seeds cannot decide whether a method matches exact backprop within ±0.02 nats"
    assert warning in captured.err and captured.err.index(warning) < captured.err.index("estimated time")
    runs = RunStore(db).runs.list_runs()
    want = reproduction_sweep(40, (0, 1)).expand()
    assert [RunConfig.from_dict(r.config) for r in runs] == want  # the same configs, in order, nothing more
    assert {(r.status, r.owner, r.preset, r.steps) for r in runs} == {("queued", None, "paper", 40)}
    assert {tuple(r.tags) for r in runs} == {("reproduce",)}
    assert len({r.sweep_id for r in runs}) == 1 and runs[0].sweep_id in captured.out
    assert sorted((r.estimator, r.rank, r.seed) for r in runs) == sorted(
        [("exact", None, s) for s in (0, 1)] + [("basis", r, s) for r in PAPER_RANKS for s in (0, 1)])


@pytest.mark.parametrize("argv, message", [
    (["--steps", "0"], "--steps must be >= 1"),
    (["--seeds", "x"], "seeds: 'x' is not a seed"),
    (["--concurrent", "0"], "--concurrent must be >= 1"),
    (["--margin", "-1"], "--margin: the equivalence margin must be a number of nats > 0"),
])
def test_bad_reproduce_flags_write_nothing(db, capsys, argv, message):
    assert main(["reproduce", "--db", db, "--queue-only", "--no-measure", *argv]) == 2
    assert message in capsys.readouterr().err
    assert RunStore(db).runs.list_runs() == []
