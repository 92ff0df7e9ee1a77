"""Cohorts (issue 41): runs that differ only by seed and learning rate, trained as one vmapped program.

A member computes what its run alone computes (``engine.training.loop.train``): the same
records (validation, train and test losses, probes, memory figures) and the same checkpointed
parameters, to float32 rounding, for every estimator. A member that diverges, is stopped or is
dropped leaves alone; a cohort resumes from its members' checkpoints, members at different
steps included, and ends where the uninterrupted runs end.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

import engine.training.cohort as cohort_mod
from engine.config import ConfigError, RunConfig
from engine.core.choices import ESTIMATORS
from engine.training.build import initial_params, optimizer_for
from engine.training.checkpoints import RunCheckpoints
from engine.training.cohort import Cohort, Ended, check_cohort, train_cohort
from engine.training.loop import Record, TrainingDiverged, train
from engine.training.steps import init_state, optimizer_of
from engine.training.system import is_system

RUN = RunConfig(preset="tiny", steps=4, eval_interval=2, probe_interval=2, val_batches=2, val_tokens=4096,
                interim_val_batches=1, rank=4)
_SINGLES: dict[tuple[str, int], tuple[dict[int, Record], np.ndarray]] = {}


def _leaf(ckpt: RunCheckpoints, config: RunConfig, step: int | None = None) -> np.ndarray:
    """A checkpointed parameter leaf (the first MLP kernel) at ``step`` (default: the newest)."""
    target = init_state(initial_params(config), optimizer_for(config))
    state, _ = ckpt.restore(target, step)
    return np.asarray(state.params["block_0"]["mlp"]["fc"]["kernel"])


def _single(estimator: str, seed: int, tmp_path) -> tuple[dict[int, Record], np.ndarray]:
    """(records by step, final checkpointed leaf) of the run alone; trained once per process."""
    if (estimator, seed) not in _SINGLES:
        config = RUN.replace(estimator=estimator, seed=seed)
        with RunCheckpoints(tmp_path / f"single-{estimator}-{seed}", keep=2) as ckpt:
            records = {r.step: r for r in train(config, checkpoints=ckpt)}
            _SINGLES[estimator, seed] = records, _leaf(ckpt, config)
    return _SINGLES[estimator, seed]


def _assert_member_equals_single(records: list[Record], single: dict[int, Record]) -> None:
    for r in records:
        ref = single[r.step]
        assert r.values.keys() == ref.values.keys() and r.batch_losses.keys() == ref.batch_losses.keys()
        for split in r.batch_losses:
            np.testing.assert_allclose(r.batch_losses[split], ref.batch_losses[split], rtol=1e-5, atol=1e-6)
        for name, value in ref.values.items():
            if name != "tokens_per_s" and not is_system(name):
                assert r.values[name] == pytest.approx(value, rel=1e-5, abs=1e-6, nan_ok=True), (r.step, name)


def _split(items) -> tuple[dict[int, list[Record]], dict[int, Ended]]:
    records: dict[int, list[Record]] = {}
    ends: dict[int, Ended] = {}
    for i, item in items:
        assert i not in ends, "nothing of a member follows its end"
        if isinstance(item, Ended):
            ends[i] = item
        else:
            records.setdefault(i, []).append(item)
    return records, ends


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_a_member_computes_what_its_run_alone_computes(estimator, tmp_path):
    """Seeds 1 and 0 as one cohort (member 0 is seed 1): seed 1's records and checkpointed
    parameters equal its single run's to rounding; the members differ from each other."""
    configs = [RUN.replace(estimator=estimator, seed=s) for s in (1, 0)]
    ckpts = [RunCheckpoints(tmp_path / f"member-{i}", keep=2) for i in range(2)]
    with ckpts[0], ckpts[1]:
        records, ends = _split(train_cohort(configs, checkpoints_each=ckpts))
        leaves = [_leaf(c, configs[0]) for c in ckpts]
    assert ends == {0: Ended(4, "finished"), 1: Ended(4, "finished")}
    assert [r.step for r in records[0]] == [0, 2, 4] == [r.step for r in records[1]]
    single, leaf = _single(estimator, 1, tmp_path)
    _assert_member_equals_single(records[0], single)
    np.testing.assert_allclose(leaves[0], leaf, rtol=1e-5, atol=1e-6)
    assert not np.allclose(leaves[0], leaves[1])  # another seed: other parameters and batches
    assert records[0][-1].values["test_loss"] != records[1][-1].values["test_loss"]


def test_a_member_that_diverges_is_stopped_or_dropped_leaves_the_others_training(tmp_path, monkeypatch):
    """Member 1 starts from NaN parameters (diverges at its first read), member 2 is stopped
    after step 2 (it saves), member 3 dropped after step 1 (no save): member 0 trains on and
    equals its run alone."""
    real_init = cohort_mod.init_params
    nan_key = jax.random.key_data(cohort_mod.run_keys(11)[0])

    def init(cfg, key):
        params = real_init(cfg, key)
        if np.array_equal(jax.random.key_data(key), nan_key):
            params = jax.tree.map(lambda x: x * np.nan, params)
        return params

    monkeypatch.setattr(cohort_mod, "init_params", init)
    configs = [RUN.replace(estimator="basis", seed=s) for s in (0, 11, 12, 13)]
    steps = {i: 0 for i in range(4)}
    ckpts = [RunCheckpoints(tmp_path / f"member-{i}", keep=2) for i in range(4)]

    def on_step(i):
        def hear(step, loss):
            steps[i] = step
            if i == 3 and step == 1:
                cohort.drop(3)
        return hear

    cohort = Cohort(configs, checkpoints_each=ckpts, on_step_each=[on_step(i) for i in range(4)],
                    should_stop_each=[lambda: False, lambda: False, lambda: steps[2] >= 2, lambda: False])
    records, ends = _split(cohort.records())
    assert ends[0] == Ended(4, "finished")
    assert ends[1].how == "failed" and isinstance(ends[1].error, TrainingDiverged) and ends[1].error.step == 1
    assert ends[2] == Ended(2, "stopped") and ckpts[2].steps() == [2]
    assert ends[3] == Ended(1, "dropped") and ckpts[3].steps() == []
    assert [r.step for r in records[1]] == [0]  # its step-0 record, nothing measured after the NaN
    assert [r.step for r in records[2]] == [0, 2] and [r.step for r in records[3]] == [0]
    single, leaf = _single("basis", 0, tmp_path)
    _assert_member_equals_single(records[0], single)
    np.testing.assert_allclose(_leaf(ckpts[0], configs[0]), leaf, rtol=1e-5, atol=1e-6)
    for c in ckpts:
        c.close()


def test_a_cohort_resumes_from_its_members_checkpoints_at_different_steps(tmp_path):
    """Member 0 (seed 0) stops after step 3, member 1 (seed 1) after step 2; resumed, member
    1 steps alone to step 3, then both train on together: every record after the resume and
    the final parameters equal the runs alone, uninterrupted."""
    configs = [RUN.replace(estimator="basis", seed=s) for s in (0, 1)]
    done = {0: 0, 1: 0}
    heard = [lambda s, loss: done.__setitem__(0, s), lambda s, loss: done.__setitem__(1, s)]
    with RunCheckpoints(tmp_path / "m0", keep=3) as c0, RunCheckpoints(tmp_path / "m1", keep=3) as c1:
        _, ends = _split(train_cohort(configs, checkpoints_each=[c0, c1], on_step_each=heard,
                                      should_stop_each=[lambda: done[0] >= 3, lambda: done[1] >= 2]))
        assert ends == {0: Ended(3, "stopped"), 1: Ended(2, "stopped")}
        resumed_at = {}
        hooks = [lambda step, notes: resumed_at.__setitem__(0, step), lambda step, notes: resumed_at.__setitem__(1, step)]
        records, ends = _split(train_cohort(configs, checkpoints_each=[c0, c1], resume=True, on_resume_each=hooks))
        leaves = [_leaf(c0, configs[0]), _leaf(c1, configs[1])]
    assert resumed_at == {0: 3, 1: 2}
    assert ends == {0: Ended(4, "finished"), 1: Ended(4, "finished")}
    assert [r.step for r in records[0]] == [4] and [r.step for r in records[1]] == [4]
    for i, seed in enumerate((0, 1)):
        single, leaf = _single("basis", seed, tmp_path)
        _assert_member_equals_single(records[i], single)
        np.testing.assert_allclose(leaves[i], leaf, rtol=1e-5, atol=1e-6)


def test_only_runs_that_differ_by_seed_name_and_learning_rate_form_a_cohort():
    check_cohort([RUN.replace(seed=0, name="a"), RUN.replace(seed=1)])
    check_cohort([RUN, RUN.replace(lr=0.05), RUN.replace(seed=1, lr=0.05)])  # a campaign's trials of one method
    assert RUN.replace(seed=3, name="x", lr=0.3).cohort() == RUN.cohort()
    for others in ([RUN, RUN.replace(seed=1, rank=8)], [RUN, RUN.replace(seed=1, steps=5)], [RUN, RUN],
                   [RUN.replace(lr=0.05), RUN.replace(lr=0.05, name="again")], [RUN, RUN.replace(seed=1, momentum=0.5)],
                   [RUN, RUN.replace(seed=1, optimizer="adamw")], []):
        with pytest.raises(ConfigError):
            check_cohort(others)


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_a_learning_rate_is_data_of_one_program_and_each_trial_computes_its_run_alone(optimizer, tmp_path):
    """Three trials of one method (seed 1 at two learning rates, seed 0 at a third) as one
    cohort: each member's records and parameters equal its single run's at its learning rate,
    and the optimizer state is the pytree a run with the rate as a constant keeps."""
    lrs = (0.03, 0.002, 0.01) if optimizer == "sgd" else (0.003, 0.0002, 0.001)
    configs = [RUN.replace(estimator="basis", optimizer=optimizer, seed=s, lr=lr) for s, lr in zip((1, 1, 0), lrs)]
    ckpts = [RunCheckpoints(tmp_path / f"member-{i}", keep=2) for i in range(3)]
    with ckpts[0], ckpts[1], ckpts[2]:
        records, ends = _split(train_cohort(configs, checkpoints_each=ckpts))
        leaves = [_leaf(c, config) for c, config in zip(ckpts, configs)]
    assert ends == {i: Ended(4, "finished") for i in range(3)}
    for i, config in enumerate(configs):
        with RunCheckpoints(tmp_path / f"single-{i}", keep=2) as ckpt:
            single = {r.step: r for r in train(config, checkpoints=ckpt)}
            leaf = _leaf(ckpt, config)
        _assert_member_equals_single(records[i], single)
        np.testing.assert_allclose(leaves[i], leaf, rtol=1e-5, atol=1e-6)
    assert not np.allclose(leaves[0], leaves[1])  # one seed, two learning rates: two trajectories
    params = initial_params(configs[0])
    fixed = init_state(params, optimizer_for(configs[0]))
    as_data = init_state(params, optimizer_of(optimizer, jax.numpy.float32(0.01)))
    assert jax.tree.structure(fixed) == jax.tree.structure(as_data)
