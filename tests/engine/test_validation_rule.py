"""The validation rule (issue 41): what a run validates when, on which tokens.

* Every eval before the last step (step 0 included) reads the *interim* validation batches:
  the first ``effective_interim_val_batches`` of the validation set, the same ones each time
  (by default the fewest holding ``MIN_INTERIM_EVAL_TOKENS`` tokens, never more than the set).
* The last step, where comparisons read, evaluates every validation batch, and the test split
  on every test batch.
* The interim losses are exactly the first batches of a whole evaluation of the same
  parameters: the interim choice never changes training, only what is measured between.
* How often: by default ``EVALS_PER_RUN`` times a run, fewer where an interval would train
  fewer than ``TRAIN_TOKENS_PER_INTERIM_TOKEN`` tokens per interim-validated token (a short
  run validates at step 0 and its last step only).
* Every eval, interim or whole, runs one compiled program: the held-out batches sit on the
  device in chunks of the interim validation's batches, the interim validation the first.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from engine.config import RunConfig
from engine.config.run import EVALS_PER_RUN, MIN_EVAL_TOKENS, MIN_INTERIM_EVAL_TOKENS, TRAIN_TOKENS_PER_INTERIM_TOKEN
from engine.training.build import model_config
from engine.training.devices import SingleDevice
from engine.training.loop import held_out_chunks, train
from engine.training.schedule import Schedule
from engine.training.timing import EVAL_COST, PROBE_COST, StepTiming, run_seconds

RUN = RunConfig(preset="tiny", steps=4, eval_interval=2, probe_interval=0, val_tokens=4096, val_batches=4,
                interim_val_batches=2, test_every_eval=True, rank=4)


@pytest.mark.parametrize("preset", ["paper", "small", "tiny"])
def test_the_default_interim_set_holds_its_tokens_and_never_more_than_the_validation_set(preset):
    config = RunConfig(preset=preset)
    full, interim = config.effective_val_batches, config.effective_interim_val_batches
    assert full == math.ceil(MIN_EVAL_TOKENS / config.rows)
    assert interim == min(full, math.ceil(MIN_INTERIM_EVAL_TOKENS / config.rows))
    assert interim * config.rows >= min(MIN_INTERIM_EVAL_TOKENS, full * config.rows)
    assert (interim - 1) * config.rows < MIN_INTERIM_EVAL_TOKENS  # the fewest batches that hold them
    assert config.replace(interim_val_batches=3).effective_interim_val_batches == min(3, full)
    assert config.replace(val_batches=1).effective_interim_val_batches == 1


def test_the_paper_preset_validates_an_eighth_between_and_everything_at_its_last_step():
    config = RunConfig(preset="paper")
    assert (config.effective_val_batches, config.effective_interim_val_batches) == (256, 32)


def test_interim_evals_read_the_first_batches_and_the_last_step_reads_them_all():
    interim = {r.step: r for r in train(RUN)}
    whole = {r.step: r for r in train(RUN.replace(interim_val_batches=4))}
    assert sorted(interim) == sorted(whole) == [0, 2, 4]
    for step in (0, 2, 4):
        expected = 4 if step == 4 else 2
        for split in ("val", "test"):
            mine, every = interim[step].batch_losses[split], whole[step].batch_losses[split]
            assert mine.shape == (expected,) and every.shape == (4,)
            np.testing.assert_allclose(mine, every[:expected], rtol=1e-6)  # the same text, the same parameters
        values = interim[step].values
        losses = interim[step].batch_losses["val"].astype(np.float64)
        assert values["val_loss"] == pytest.approx(losses.mean(), rel=1e-6)
        assert values["val_loss_se"] == pytest.approx(losses.std(ddof=1) / np.sqrt(expected), rel=1e-5)
    for name in ("val_loss", "test_loss", "train_loss"):  # training never depends on what is measured between
        assert interim[4].values[name] == pytest.approx(whole[4].values[name], rel=1e-6)


def test_the_time_estimate_counts_interim_and_whole_evaluations():
    timing = StepTiming(step_s=0.01, startup_s=0.0, source="measured")
    config = RunConfig(preset="paper", steps=1000)
    whole = config.replace(interim_val_batches=config.effective_val_batches, eval_interval=100)
    # 11 evals: 10 interim (32 batches) and the last (256 validation + 256 test batches); 10 probes
    batches = 10 * 32 + 2 * 256
    assert run_seconds(config, timing) == pytest.approx((1000 + batches * EVAL_COST + 10 * PROBE_COST) * 0.01)
    every = 11 * 256 + 256  # before the rule: every eval on all 256 batches
    assert run_seconds(whole, timing) == pytest.approx((1000 + every * EVAL_COST + 10 * PROBE_COST) * 0.01)


@pytest.mark.parametrize("preset", ["paper", "small", "tiny"])
@pytest.mark.parametrize("steps", [1, 5, 10, 60, 95, 96, 150, 250, 999, 1000, 2000, 50_000])
def test_the_default_interval_validates_ten_times_unless_validating_would_cost_over_a_tenth(preset, steps):
    config = RunConfig(preset=preset, steps=steps)
    every, interim = config.effective_eval_interval, config.effective_interim_val_batches
    floor = TRAIN_TOKENS_PER_INTERIM_TOKEN * interim  # steps, each training one validation batch's rows
    interims = [s for s in Schedule.of(config).eval_steps() if 0 < s < steps]
    assert len(interims) <= EVALS_PER_RUN
    if steps >= EVALS_PER_RUN * floor:  # long enough: the old rule, steps ÷ 10
        assert every == steps // EVALS_PER_RUN
    elif steps < floor:  # too short for any: step 0 and the last step
        assert every == steps and Schedule.of(config).eval_steps() == ([0, steps] if steps else [0])
    else:  # as many evenly spaced as each interval trains the floor
        assert every >= floor and every == steps // (steps // floor)
    assert all(b - a >= min(floor, steps) for a, b in zip([0] + interims, interims))
    assert config.replace(eval_interval=7).effective_eval_interval == 7  # the user's interval is never changed


def test_a_ten_step_paper_run_validates_its_start_and_its_end():
    config = RunConfig(preset="paper", steps=10)
    assert Schedule.of(config).eval_steps() == [0, 10]
    assert RunConfig(preset="paper", steps=1000).effective_eval_interval == 100  # the paper preset's default run


def test_every_eval_runs_one_compiled_program():
    config = RUN.replace(seq_len=24, val_batches=6, interim_val_batches=2, steps=4)  # a shape no other test compiles
    records = {r.step: r for r in train(config)}
    assert {s: r.batch_losses["val"].shape for s, r in records.items()} == {0: (2,), 2: (2,), 4: (6,)}
    eval_fn = SingleDevice().eval_step(model_config(config))
    assert eval_fn._cache_size() == 1  # the interim eval and the whole one (3 chunks) share it
    chunks = held_out_chunks(np.asarray, np.arange(7 * 3).reshape(7, 3), 3)
    assert [c.shape for c in chunks] == [(3, 3), (3, 3), (1, 3)]
    np.testing.assert_array_equal(np.concatenate(chunks), np.arange(21).reshape(7, 3))
