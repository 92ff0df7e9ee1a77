"""The Launch page's defects of issue 43, under AppTest (the browser's part, where the
field itself refuses a value, is test_browser_launch.py): a launch disarms its button
once it has queued the form (5), an estimate scales from the model's other ranks (6),
the relaunch warning says what new seeds and other steps do (7), and values a run cannot
train with are refused, absurd ones warned about, by field (13)."""

from __future__ import annotations

import dataclasses

import pytest

from app import form
from engine.config import RunConfig
from engine.reads import estimates
from storage.limits import INT_MAX
from tests.support.pages import app, button, page, read, store, url  # noqa: F401  (fixtures)
from tests.support.runs import TINY, fake_run

PAPER = RunConfig(preset="paper", steps=40, eval_interval=10, probe_interval=10, lam=0.01)
GIB = 2**30


def _timed_run(store, config: RunConfig, tokens_per_s: float) -> int:
    """A finished run of ``config`` that trained at ``tokens_per_s`` (start-up 0.5 s)."""
    run_id = store.runs.create_run(name=config.label(), config=config.to_dict(), estimator=config.estimator,
                              rank=None if config.is_exact else config.rank, lam=config.lam, seed=config.seed,
                              preset=config.preset, steps=config.steps, status="queued")
    store.runs.set_status(run_id, "running")
    store.metrics.add_metrics(run_id, [(0, 0.5, "val_loss", 10.0), (config.steps, 9.0, "val_loss", 6.0),
                               (config.steps, 9.0, "tokens_per_s", tokens_per_s)])
    store.runs.heartbeat(run_id, config.steps)
    store.runs.set_status(run_id, "finished")
    return run_id


def _under(at, label: str, kind: str = "error") -> list[str]:
    """The errors (or warnings) shown in the form's group ``label``."""
    group = next(e for e in at.expander if e.label == label)
    return [read(e.value) for e in getattr(group, kind)]


# ----------------------------------------------------------------------------- 5: one click, one sweep


def test_a_launch_disarms_its_button_says_so_above_it_and_a_second_click_queues_nothing(url, store):
    at = page(app().run(), "launch")
    at.toggle(key="launch.queue_only").set_value(True).run()
    n = len(form.DEFAULT_SWEEP.expand())
    first = button(at, f"Queue {n} runs")
    first.click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert len(store.runs.list_runs()) == n
    [said] = [read(s.value) for s in at.success]
    assert said.startswith(f"Queued {n} runs for workers")
    done = button(at, "Launched")
    assert done.disabled and not [b for b in at.button if b.label == f"Queue {n} runs"]
    # the message stands above the button, where the user clicked (not below the preview table)
    order = [getattr(e, "label", None) or getattr(e, "value", None) for e in at.main]
    assert order.index(next(v for v in order if isinstance(v, str) and v.startswith("Queued"))) < order.index(done.label)

    first.click().run()  # the same button clicked again (a double click's second press): nothing more is queued
    assert len(store.runs.list_runs()) == n and button(at, "Launched").disabled

    at.text_input(key="launch.tags").input("pilot").run()  # the form changes: the button is armed again
    assert not button(at, f"Queue {n} runs").disabled and not at.success
    at.text_input(key="launch.tags").input("").run()  # back to the launched form: disarmed again
    assert button(at, "Launched").disabled
    button(at, "Launch the same runs again").click().run()  # a deliberate repeat arms it once more
    assert not button(at, f"Queue {n} runs").disabled and len(store.runs.list_runs()) == n


# ----------------------------------------------------------------------------- 6: a new rank of a timed model


def test_a_new_rank_is_timed_from_the_same_models_other_ranks(url, store):
    for config in [dataclasses.replace(PAPER, estimator="exact", lam=0.0)] + [
            dataclasses.replace(PAPER, rank=r) for r in (1, 8, 16, 32, 64)]:
        fake_run(store, config)  # six finished runs of the paper's model; R = 4 is new
    at = page(app().run(), "launch")
    at.selectbox(key="launch.preset").set_value("paper")
    at.text_input(key="launch.ranks").input("exact, 4").run()
    shown = " ".join(m.value for m in at.markdown)
    assert "Estimated time **≈" in shown and "unknown" not in shown, shown
    assert any("Scaled from other ranks: basis R=4: interpolated between R=1 and R=8" in c.value for c in at.caption)


def test_a_rank_estimate_interpolates_between_ranks_and_says_what_it_lacks(store):
    model = dataclasses.replace(TINY, rank=8)
    tokens = model.effective_batch_size * model.effective_seq_len
    _timed_run(store, dataclasses.replace(model, rank=2), tokens / 0.010)  # 10 ms a step at R = 2
    _timed_run(store, dataclasses.replace(model, rank=10), tokens / 0.030)  # 30 ms at R = 10
    assert estimates.timing_from_history(store, model) is None  # R = 8 itself has no run
    timed, how = estimates.timing_from_ranks(store, model)
    assert timed.step_s == pytest.approx(0.025) and how == "interpolated between R=2 and R=10"
    timed, how = estimates.timing_from_ranks(store, dataclasses.replace(model, rank=14))
    assert timed.step_s == pytest.approx(0.040) and how == "extrapolated from R=2 and R=10"
    estimate = estimates.grid_estimate(store, [model, dataclasses.replace(model, estimator="exact")])
    assert not estimate.known and estimate.missing == ("exact",)  # exact backprop of it never ran
    assert "no finished run of exact, nor of its model at another rank" in estimate.text()
    assert estimates.grid_estimate(store, [model]).scaled == {"basis R=8": "interpolated between R=2 and R=10"}


# ----------------------------------------------------------------------------- 7: what steps do to a relaunch


def test_the_relaunch_warning_says_new_seeds_add_runs_and_steps_do_not(url, store):
    for c in form.DEFAULT_SWEEP.expand()[:2]:
        fake_run(store, c, status="queued", steps_done=0)
    at = app().run()
    at.switch_page("views/launch.py").run()
    [again] = [read(w.value) for w in at.warning if "already in the database" in w.value]
    assert "(or steps)" not in again
    assert "new seeds add runs" in again and "steps" in again.split("new seeds add runs", 1)[1]


# ----------------------------------------------------------------------------- 4 and 13: values a run cannot have


def test_an_integer_field_takes_any_number_so_the_schema_can_refuse_it():
    steps = next(w for w in form.widgets() if w.name == "steps")
    assert form.number_args(steps) == {"step": 100.0, "format": "%g"}  # a real input: the browser hands it over
    assert form.whole(1e20) == 10**20 and form.whole(2.5) == 2.5 and form.whole(None) is None
    grid, configs, problems = form.read({**form.values_of(form.DEFAULT_SWEEP), "steps": 1e20})
    assert configs == [] and problems == [("steps", f"Steps must be an integer in [1, {INT_MAX + 1}) "
                                                     f"(got {10**20})")]


def test_out_of_range_steps_disarm_the_launch_and_say_the_range(url, store):
    at = page(app().run(), "launch")
    at.number_input(key="launch.steps").set_value(1e20).run()
    assert _under(at, "Training") == [f"Steps must be an integer in [1, {INT_MAX + 1}) (got {10**20})"]
    assert not [b for b in at.button if b.label.startswith(("Launch", "Queue"))]
    assert not [s for s in at.subheader if "to launch" in s.value]  # no preview of another number of steps


def test_absurd_values_are_warned_and_impossible_ones_refused_by_field(url, store, monkeypatch):
    monkeypatch.setattr(form, "machine_memory", lambda: 16 * GIB, raising=False)  # (raising: today's form has none)
    at = page(app().run(), "launch")
    at.number_input(key="launch.lr").set_value(1e308).run()
    [lr] = _under(at, "Training")
    assert lr.startswith("Learning rate 1e+308 is past float32's largest number") and "\n" not in lr
    assert not [b for b in at.button if b.label.startswith("Launch")]
    at.number_input(key="launch.lr").set_value(0.01)
    at.number_input(key="launch.val_tokens").set_value(1e12).run()
    [val] = _under(at, "Data", "warning")
    assert val == "Validation tokens 1,000,000,000,000 is 15,258,789 times the value it takes by default (65,536): check it"
    assert not button(at, "Launch").disabled  # a warning, not a refusal
    at.number_input(key="launch.val_tokens").set_value(65536)
    at.number_input(key="launch.batch_size").set_value(1e9).run()
    under = _under(at, "Model")
    assert len(under) == 1 and under[0].startswith("Batch size 1,000,000,000: one train step needs at least")
    assert "more than this machine's 16.0 GiB: lower it, or queue the runs for workers" in under[0]
    assert button(at, "Launch").disabled  # it cannot train here
    at.toggle(key="launch.queue_only").set_value(True).run()  # a worker might have such a device: a warning
    assert not _under(at, "Model") and "a worker that trains it needs devices that large" in _under(
        at, "Model", "warning")[-1]
    assert not button(at, "Queue").disabled
    button(at, "Defaults").click().run()  # the batch size back to the preset's
    at.number_input(key="launch.seq_len").set_value(100_000).run()
    [warned] = _under(at, "Model", "warning")  # its attention scores alone: 2 × 2 heads × 100,000² floats
    assert warned.startswith("Sequence length 100,000: one train step needs at least 149.0 GiB a device")
    at.number_input(key="launch.seq_len").set_value(32_001).run()  # fits: warned as far from the preset's 32
    assert _under(at, "Model", "warning") == [
        "Sequence length 32,001 is 1,000 times the value it takes by default (32): check it"]
    assert store.runs.list_runs() == []


def test_a_name_past_the_limit_is_named_with_the_limit(url, store):
    from storage.limits import NAME_MAX

    name = next(w for w in form.widgets() if w.name == "name")
    assert name.max_chars == NAME_MAX  # what the schema holds; the browser field itself takes more
    at = page(app().run(), "launch")
    at.text_input(key="launch.name").input("n" * 250).run()
    assert _under(at, "Training") == [f"Name is 250 characters long; the most is {NAME_MAX}: shorten it"]


def test_trials_past_the_tuning_limit_are_named_with_it(url, store):
    from engine.config.tuning import MAX_TRIALS

    at = page(app().run(), "launch")
    at.segmented_control(key="launch.mode").set_value("tune").run()
    at.text_input(key="launch.ranks").input("8")
    at.number_input(key="launch.steps").set_value(20)
    at.text_input(key="launch.tune.eval_seeds").input("0, 1")
    at.number_input(key="launch.tune.trials").set_value(MAX_TRIALS + 1).run()
    tuning = next(e for e in at.expander if e.label.startswith("Tuning"))
    assert [read(e.value) for e in tuning.error] == [
        f"Trials per method must be an integer in [1, {MAX_TRIALS}] (got {MAX_TRIALS + 1})"]
    assert not [b for b in at.button if b.label.startswith(("Launch", "Queue"))]
    at.number_input(key="launch.tune.trials").set_value(3).run()
    assert not at.error and button(at, "Launch 6 trial runs")
