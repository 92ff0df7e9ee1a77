"""The training schedule (``engine.training.schedule``): which steps evaluate, probe, sample,
record and checkpoint, and where compiled blocks end. Pure arithmetic on the run config."""

from __future__ import annotations

import itertools

import pytest

from engine.config import CHECKPOINT_SECONDS, RunConfig
from engine.training.schedule import TIME_CHECKPOINT_SLACK, Schedule
from engine.training.timing import EVAL_COST, PROBE_COST, StepTiming, run_seconds

TINY = RunConfig(preset="tiny", steps=13, eval_interval=6, probe_interval=4, val_batches=2, rank=4)
EXACT_NOTHING_SKETCHED = TINY.replace(estimator="exact", sketched_layers="none")


def _schedule(steps=13, eval_every=6, probe_every=4, probing=True, checkpoint_every=None, limit=4,
              test_every_eval=False) -> Schedule:
    return Schedule(steps=steps, eval_every=eval_every, probe_every=probe_every, probing=probing,
                    checkpoint_every=checkpoint_every, test_every_eval=test_every_eval, limit=limit)


def _walk(schedule: Schedule, checkpoints: bool = False) -> tuple[list[tuple[int, int]], list[int]]:
    """The blocks a run takes from step 0 and the steps it checkpoints at (the last step's
    included), saving by steps alone (its clock never reaches a time checkpoint)."""
    blocks, saved, last_saved, first = [], [], 0, 1
    while first <= schedule.steps:
        last = schedule.block_end(first, last_saved if checkpoints else None)
        blocks.append((first, last))
        if checkpoints and (schedule.is_last(last) or schedule.checkpoint_due(last, last_saved, 0.0)):
            saved.append(last)
            last_saved = last
        first = last + 1
    return blocks, saved


# ----------------------------------------------------------------------------- from a run config


def test_a_config_gives_its_intervals_and_whether_it_probes():
    s = Schedule.of(TINY.replace(checkpoint_interval=5, test_every_eval=True), limit=8)
    assert (s.steps, s.eval_every, s.probe_every, s.checkpoint_every, s.limit) == (13, 6, 4, 5, 8)
    assert s.probing and s.test_every_eval
    assert Schedule.of(TINY.replace(eval_interval=None, steps=1000)).eval_every == RunConfig(steps=1000).effective_eval_interval
    # an exact run probes the layers a sketched twin would sketch (its reference 1.0); with none, nothing
    assert Schedule.of(TINY.replace(estimator="exact")).probing
    assert not Schedule.of(EXACT_NOTHING_SKETCHED).probing


# ----------------------------------------------------------------------------- evals, probes, records


@pytest.mark.parametrize("steps,every,expected", [
    (13, 6, [0, 6, 12, 13]),  # the last step evaluates off the interval too
    (12, 6, [0, 6, 12]),
    (5, 10, [0, 5]),
    (3, 1, [0, 1, 2, 3]),
])
def test_evals_fall_on_every_interval_step_and_the_last(steps, every, expected):
    s = _schedule(steps=steps, eval_every=every)
    assert s.eval_steps() == expected
    assert [step for step in range(steps + 1) if s.evaluates(step)] == expected
    assert [step for step in range(steps + 1) if s.whole(step)] == [steps]  # the others read the interim batches


def test_the_test_split_is_read_at_the_last_step_and_with_test_every_eval_at_every_eval():
    only_last, every = _schedule(), _schedule(test_every_eval=True)
    assert [step for step in only_last.eval_steps() if only_last.tests(step)] == [13]
    assert [step for step in every.eval_steps() if every.tests(step)] == [0, 6, 12, 13]


def test_probes_sampling_records_and_reads():
    s = _schedule()
    assert s.probe_steps() == [4, 8, 12] == [step for step in range(1, 14) if s.probes(step)]
    assert [step for step in range(1, 14) if s.samples(step)] == [4, 8, 12]
    quiet = _schedule(probing=False)
    assert quiet.probe_steps() == [] and not any(quiet.probes(step) for step in range(14))
    assert [step for step in range(1, 14) if quiet.samples(step)] == [4, 8, 12]  # system metrics all the same
    never = _schedule(probe_every=0)
    assert never.probe_steps() == [] and not any(never.probes(x) or never.samples(x) for x in range(14))
    assert s.records(4, 4) and s.reads(4, 4)  # a probe
    assert s.records(5, 6) and s.reads(5, 6)  # an eval
    assert quiet.records(3, 4) and not quiet.reads(3, 4)  # a sample alone: a record, no read of the losses
    assert not s.records(1, 2) and not s.reads(1, 2)


# ----------------------------------------------------------------------------- blocks


def _admissible(s: Schedule, first: int, last: int, last_saved: int | None, until: int | None) -> bool:
    """The block rule stated step by step: no event inside the block, a probe step alone, no
    more than ``limit`` steps, a power of two, within the checkpoint and ``until`` caps."""
    n = last - first + 1
    if n < 1 or n > s.limit or n & (n - 1):
        return False
    if s.probes(first) and last != first:
        return False
    inside = range(first, last)  # steps after which the block may not go on
    if any(s.evaluates(x) or s.samples(x) or s.is_last(x) for x in inside) or last > s.steps:
        return False
    if any(s.probes(x) for x in range(first + 1, last + 1)):
        return False
    if s.checkpoint_every is not None and last_saved is not None and last > max(first, last_saved + s.checkpoint_every):
        return False
    return until is None or last <= max(first, until)


GRID = list(itertools.product([1, 7, 13, 16], [1, 3, 6], [0, 2, 4], [True, False], [None, 1, 3], [1, 2, 4, 8]))


def _grid() -> list[Schedule]:
    """Schedules of (steps, eval_every, probe_every, probing, checkpoint_every, limit) in ``GRID``."""
    return [_schedule(*point) for point in GRID]


def test_a_block_is_the_longest_that_skips_no_due_event():
    for s in _grid():
        _check_block_ends(s)


def _check_block_ends(s: Schedule) -> None:
    steps = s.steps
    for first in range(1, steps + 1):
        for last_saved in (None, max(0, first - 2), first - 1):
            for until in (None, first, first + 2):
                last = s.block_end(first, last_saved, until)
                assert _admissible(s, first, last, last_saved, until), (s, first, last_saved, until, last)
                assert not any(_admissible(s, first, longer, last_saved, until) for longer in range(last + 1, steps + 1)), (
                    s, first, last_saved, until, last)


def test_blocks_stop_at_probes_evals_samples_and_the_last_step():
    blocks, _ = _walk(_schedule())
    assert blocks == [(1, 2), (3, 3), (4, 4), (5, 6), (7, 7), (8, 8), (9, 10), (11, 11), (12, 12), (13, 13)]
    quiet, _ = _walk(_schedule(probing=False, limit=8))
    assert [last for _, last in quiet] == [4, 6, 8, 12, 13]  # no probe, but samples at 4, 8, 12
    ends = {last for _, last in _walk(_schedule(steps=200, eval_every=50, probe_every=0, limit=64))[0]}
    assert {50, 100, 150, 200} <= ends and max(b - a + 1 for a, b in _walk(_schedule(steps=200, limit=64))[0]) <= 64


def test_walking_the_blocks_reaches_every_due_step():
    for s in _grid():
        _check_walk(s)


def _check_walk(s: Schedule) -> None:
    steps, checkpoint_every = s.steps, s.checkpoint_every
    blocks, saved = _walk(s, checkpoints=True)
    assert [a for a, _ in blocks] == [1] + [b + 1 for _, b in blocks[:-1]] and blocks[-1][1] == steps
    firsts, lasts = {a for a, _ in blocks}, {b for _, b in blocks}
    assert set(s.eval_steps()) - {0} <= lasts
    assert {x for x in range(1, steps + 1) if s.samples(x)} <= lasts
    assert set(s.probe_steps()) <= firsts & lasts  # a probe step is a block of its own
    if checkpoint_every is not None:  # by steps: every checkpoint_every steps, and the last
        assert saved == sorted(set(range(checkpoint_every, steps + 1, checkpoint_every)) | {steps})
    assert saved[-1] == steps


def test_without_checkpoints_a_checkpoint_interval_does_not_cut_blocks():
    s = _schedule(probe_every=0, checkpoint_every=1)
    assert s.block_end(2) == 5  # the run keeps no checkpoints: nothing to cut for
    assert s.block_end(2, last_saved=1) == 2  # with them: one step past the last save
    assert s.block_end(2, last_saved=0) == 2  # overdue: the block is one step, never empty


def test_a_block_never_passes_a_step_a_cohort_member_waits_at():
    s = _schedule(steps=64, eval_every=64, probe_every=0, limit=64)
    assert s.block_end(1) == 64
    assert [s.block_end(1, until=u) for u in (1, 2, 3, 7, 8, 40)] == [1, 2, 2, 4, 8, 32]


# ----------------------------------------------------------------------------- checkpoints by time


def test_time_checkpoints_wait_a_period_at_an_eval_step_and_half_as_long_again_elsewhere():
    s = _schedule()
    period = CHECKPOINT_SECONDS
    assert s.evaluates(6) and not s.evaluates(5)
    assert not s.checkpoint_due(6, 0, period - 0.01) and s.checkpoint_due(6, 0, period)
    assert not s.checkpoint_due(5, 0, period) and not s.checkpoint_due(5, 0, TIME_CHECKPOINT_SLACK * period - 0.01)
    assert s.checkpoint_due(5, 0, TIME_CHECKPOINT_SLACK * period)
    assert s.checkpoint_due(13, 12, period)  # the last step evaluates


def test_a_step_interval_replaces_the_clock():
    s = _schedule(checkpoint_every=3)
    assert not s.checkpoint_due(6, 4, 10 * CHECKPOINT_SECONDS)  # two steps: not due, however long ago
    assert s.checkpoint_due(7, 4, 0.0) and s.checkpoint_due(9, 4, 0.0)


# ----------------------------------------------------------------------------- the time estimate reads it


def test_the_time_estimate_counts_the_evals_and_probes_the_schedule_runs():
    timing = StepTiming(step_s=1.0, startup_s=0.0, source="measured")
    config = TINY.replace(interim_val_batches=1, test_tokens=0)
    # evals at 0, 6, 12 on the interim batch and at 13 on both; probes before 4, 8, 12
    assert run_seconds(config, timing) == pytest.approx(13 + (3 * 1 + 2) * EVAL_COST + 3 * PROBE_COST)
    assert run_seconds(config.replace(estimator="exact", sketched_layers="none"), timing) == pytest.approx(
        13 + (3 * 1 + 2) * EVAL_COST)
