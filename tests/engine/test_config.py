"""The run schema: one declaration per field, from which validation, the CLI flags and
the Launch form's widgets are generated; sweeps and their rank clipping."""

import argparse
import dataclasses

import pytest

from app import form
from engine.cli import config_flags
from engine.cli import main as cli
from engine.config import (
    AFFECTS,
    BOOKKEEPING,
    GROUPS,
    MEASUREMENT,
    TRAJECTORY,
    ConfigError,
    FrozenMap,
    RunConfig,
    Sweep,
    comparable_key,
    differing_fields,
    from_flat,
    schema,
    seed_group_key,
    spec,
    to_flat,
)


def _schema_plus_a_field():
    """A copy of the schema with one more field, declared the way every field is."""
    return dataclasses.make_dataclass(
        "RunConfigPlus",
        [("warmup", int, dataclasses.field(default=0, metadata=spec(
            "linear learning-rate warm-up", "training", "Warm-up", affects="trajectory", unit="steps", low=0)))],
        bases=(RunConfig,), frozen=True,
    )


@pytest.mark.parametrize("sweep", [False, True])
def test_a_new_field_reaches_the_cli_and_the_form_with_no_other_edit(sweep):
    plus = _schema_plus_a_field()
    parser = argparse.ArgumentParser()
    config_flags.add_config_flags(parser, plus, sweep=sweep)
    args = parser.parse_args(["--warmup", "50", "--preset", "tiny"])
    grid = config_flags.sweep_from_args(args, plus, sweep=sweep)
    assert grid.base.warmup == 50 and all(c.warmup == 50 for c in grid.expand())
    with pytest.raises(ConfigError, match=r"warmup must be an integer >= 0 \(got -1\)"):
        config_flags.sweep_from_args(parser.parse_args(["--warmup", "-1"]), plus, sweep=sweep)
    training = form.grouped(form.widgets(plus))["training"]
    assert [w for w in training if w.name == "warmup"] == [
        form.Widget("warmup", "training", "number", "Warm-up", "linear learning-rate warm-up [steps]", step=1)]
    values = form.values_of(Sweep(plus(preset="tiny", warmup=7)), plus)
    assert values["warmup"] == 7 and form.to_sweep(values, plus).base.warmup == 7
    help_text = parser.format_help()
    assert "training options" in help_text and "--warmup WARMUP" in help_text and "[steps] (default: 0)" in help_text


def test_every_field_is_a_flag_named_after_it_and_a_widget_in_its_group():
    run = cli.build_parser()._subparsers._group_actions[0].choices["run"]
    flags = {o for a in run._actions for o in a.option_strings}
    names = {w.name for w in form.widgets()}
    for f, s, _ in schema():
        if f.name == "dataset_options":
            assert {"--data-path", "--text-field", "--data-files", "--max-documents"} <= flags
            assert {"path", "text_field", "data_files", "max_documents"} <= names
            continue
        assert "--" + f.name.replace("_", "-") in flags
        assert s.group in GROUPS
        assert (f.name if not s.swept else {"estimator": "estimators", "rank": "ranks", "lam": "lams", "seed": "seeds"}[f.name]) in names
    assert "--layers" in flags  # a short alias stays


def test_run_config_is_frozen_hashable_and_round_trips():
    a = RunConfig(preset="tiny", dataset="files", dataset_options={"path": "a.txt"})
    b = RunConfig.from_dict(a.to_dict())
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert isinstance(a.dataset_options, FrozenMap) and a.to_dict()["dataset_options"] == {"path": "a.txt"}
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.rank = 3
    with pytest.raises(AttributeError):
        a.dataset_options.x = 1
    assert from_flat(to_flat(a)) == a


@pytest.mark.parametrize("change, message", [
    ({"rank": 0}, r"rank must be an integer >= 1 \(got 0\)"),
    ({"rank": True}, r"rank must be an integer >= 1 \(got True\)"),
    ({"seed": 99999999999999999999}, r"seed must be an integer in \[0, 4294967296\)"),
    ({"lam": 1.0}, r"lam must be in \[0, 1\) \(got 1.0\)"),
    ({"lr": 0.0}, r"lr must be in \(0, inf\) \(got 0.0\)"),
    ({"lr": float("nan")}, r"lr must be in \(0, inf\)"),
    ({"preset": "huge"}, r"preset must be one of paper, small, tiny, gpt2 \(got 'huge'\)"),
    ({"batch_size": 0}, r"batch_size must be an integer >= 1 \(or None for the preset's\) \(got 0\)"),
    ({"recompute_activations": 1}, r"recompute_activations must be True or False \(got 1\)"),
    ({"probe_interval": -1}, r"probe_interval must be an integer >= 0 \(0 = never\) \(got -1\)"),
    ({"dataset_options": 3}, r"dataset_options must be a mapping"),
])
def test_validation_is_generated_from_the_field_metadata(change, message):
    with pytest.raises(ConfigError, match=message):
        RunConfig(**change)


def test_sweep_clips_ranks_to_bt_and_drops_duplicates():
    base = RunConfig(preset="tiny")  # B·T = 2·32 = 64
    grid = Sweep(base, estimators=("basis",), ranks=(8, 64, 128, 256), seeds=(0, 1), with_exact=True)
    assert [str(c) for c in grid.clipped()] == ["R=128 clips to R=64 (B·T = 64 rows)", "R=256 clips to R=64 (B·T = 64 rows)"]
    configs = grid.expand()
    assert [c.label() for c in configs] == ["exact s0", "basis R=8 s0", "basis R=64 s0", "exact s1", "basis R=8 s1", "basis R=64 s1"]
    assert len(set(configs)) == len(configs)


def test_sweep_axes_default_to_the_base_and_names_prefix_every_run():
    one = Sweep(RunConfig(preset="tiny", estimator="countsketch", rank=4, lam=0.01, seed=3, name="mine"))
    assert [(c.estimator, c.rank, c.lam, c.seed, c.name) for c in one.expand()] == [("countsketch", 4, 0.01, 3, "mine")]
    many = Sweep(RunConfig(preset="tiny", name="pilot"), ranks=(1, 2)).expand()
    assert [c.name for c in many] == ["pilot · basis R=1 s0", "pilot · basis R=2 s0"]
    with pytest.raises(ConfigError, match="the sweep is empty"):
        Sweep(RunConfig(), estimators=())
    with pytest.raises(ConfigError, match="need at least one rank"):
        Sweep(RunConfig(), ranks=())


def test_a_sweep_name_too_long_for_its_run_labels_is_refused_for_what_the_user_typed():
    """Runs of a sweep are named ``name · label``: a 200-character name (the limit of a
    run's name) leaves no room, and the error counts the name as typed, not with the suffix."""
    sweep = Sweep(RunConfig(preset="tiny", name="n" * 200), estimators=("exact", "basis"), ranks=(1, 32))
    with pytest.raises(ConfigError) as refused:
        sweep.expand()
    text = str(refused.value)
    assert refused.value.field == "name" and "211" not in text
    room = 200 - len(" · basis R=32 s0")
    assert f"at most {room} characters" in text and "it has 200" in text
    fits = Sweep(RunConfig(preset="tiny", name="n" * room), estimators=("exact", "basis"), ranks=(1, 32)).expand()
    assert max(len(c.name) for c in fits) == 200
    assert form.field_note(refused.value)[0] == "name"  # shown under the Launch form's Name field


def test_every_field_declares_what_it_affects_and_identity_ignores_bookkeeping():
    roles = {f.name: s.affects for f, s, _ in schema()}
    assert set(roles.values()) == {TRAJECTORY, MEASUREMENT, BOOKKEEPING} and all(r in AFFECTS for r in roles.values())
    assert {n for n, r in roles.items() if r == BOOKKEEPING} == {
        "steps", "eval_interval", "probe_interval", "checkpoint_interval", "checkpoint_keep", "name", "test_every_eval"}
    with pytest.raises(TypeError, match="affects"):
        spec("a field that does not say", "training", "Undeclared")
    with pytest.raises(ValueError, match="unknown affects"):
        spec("a field", "training", "Odd", affects="mood")
    a = RunConfig(preset="tiny", rank=8, seed=1, steps=60, eval_interval=25)
    cut_short = a.replace(seed=2, steps=40, eval_interval=200, probe_interval=0, checkpoint_interval=5,
                          checkpoint_keep=1, name="seed two")
    assert comparable_key(a.to_dict()) == comparable_key(cut_short.to_dict())
    assert seed_group_key(a.to_dict()) == seed_group_key(cut_short.to_dict())  # a missing seed, not a setup
    assert differing_fields([a.to_dict(), cut_short.to_dict()]) == []
    for name, value in (("lr", 0.02), ("val_batches", 2), ("remat", "full"), ("dataset_options", {"max_documents": 9})):
        other = a.replace(**{name: value}).to_dict()
        assert comparable_key(other) != comparable_key(a.to_dict()) and seed_group_key(other) != seed_group_key(a.to_dict())
        assert differing_fields([a.to_dict(), other]) == [name]
    raw = {"odd": 1, "steps": 5, "eval_interval": 1}  # not a RunConfig: raw fields, bookkeeping still ignored
    assert comparable_key(raw) == comparable_key({**raw, "steps": 9, "eval_interval": 3})


def test_what_runs_must_share_to_be_compared_and_seed_groups():
    a = RunConfig(preset="tiny", rank=8, seed=0)
    assert comparable_key(a.to_dict()) == comparable_key(a.replace(estimator="exact", rank=2, lam=0.01, seed=5, name="x").to_dict())
    assert comparable_key(a.to_dict()) != comparable_key(a.replace(lr=0.02).to_dict())
    assert comparable_key(a.to_dict()) != comparable_key(a.replace(val_batches=3).to_dict())  # a measurement field
    assert seed_group_key(a.to_dict()) == seed_group_key(a.replace(seed=4).to_dict())
    assert seed_group_key(a.to_dict()) != seed_group_key(a.replace(rank=4).to_dict())
    exact = a.replace(estimator="exact")
    assert seed_group_key(exact.to_dict()) == seed_group_key(exact.replace(rank=2, lam=0.5).to_dict())
    assert comparable_key({"odd": 1}) == comparable_key({"odd": 1, "seed": 4})  # not a RunConfig: raw fields
    assert a.label() == "basis R=8 s0" and a.replace(rank=500).label() == "basis R=64 s0"  # the effective rank
