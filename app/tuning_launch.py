"""Launch's "Tune, then compare" mode: the grid of the form, each method tuned to its own best
value of some float fields under one budget, then compared on fresh seeds (``engine.config.tuning``;
the same protocol as ``python -m engine tune``).

The page draws the mode switch (``mode_picker``), reads the tuning inputs with the grid
(``read``: the protocol, or one problem per input, shown under it by ``inputs``), and in the
preview column shows the plan before anything is written (``preview``: the trial runs, each
method's budget, the comparison, the estimated time, the CLI's lines) with the sweep's
confirmation rule above ``LARGE_LAUNCH`` runs; its button stores the campaign and its trials
(``engine.runner.campaigns.start``), trained here or queued for workers."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import pandas as pd
import streamlit as st

from app import confirm, form, state
from app.display import plain
from engine import data
from engine.cli.commands.tune import TRIALS, TUNE_SEEDS
from engine.config import LARGE_LAUNCH, ConfigError, Sweep, parse_seeds
from engine.config.tuning import MAX_TRIALS, TuneSpec, parse_ranges, qmc_points
from engine.core.choices import EQUIVALENCE_MARGIN as MARGIN
from storage import StorageError

CAMPAIGN = "launch.tune"  # the campaign's button, for ``confirm.launched``
MODE = form.KEY + "mode"
MODES = {"sweep": "A sweep", "tune": "Tune, then compare"}
K = {name: form.KEY + "tune." + name for name in ("fields", "trials", "tune_seeds", "eval_seeds", "untuned",
                                                  "queue_only", "confirm")}
AUTO = "auto"
DEFAULTS = {"fields": "lr", "trials": TRIALS, "tune_seeds": TUNE_SEEDS, "eval_seeds": AUTO, "untuned": True}  # the CLI's
LABELS = {"fields": "Fields to tune", "trials": "Trials per method", "tune_seeds": "Tuning seeds",
          "eval_seeds": "Evaluation seeds", "untuned": "Also at the untuned value"}
# a protocol error's field (ConfigError.field) → the input it is about
FIELD_INPUT = {"tune": "fields", "trials": "trials", "tune_seeds": "tune_seeds", "eval_seeds": "eval_seeds",
               "seed": "eval_seeds"}
# the CLI's flags in the protocol's messages, as the form names them
FLAG_NAMES = (("--tune-seeds", "Tuning seeds"), ("--seeds", "Evaluation seeds"), ("--trials", "Trials per method"),
              ("--tune ", "Fields to tune: "), ("--tune:", "Fields to tune:"))


@dataclass(frozen=True)
class Plan:
    """A protocol that reads: the spec, why its evaluation seeds, the runs and the plan's lines."""

    spec: TuneSpec
    why: str
    trials: list
    comparison: list
    lines: list[str]


def mode_picker() -> bool:
    """The switch between a plain sweep and a tuning campaign; whether the form tunes."""
    st.session_state.setdefault(MODE, "sweep")
    for name, value in DEFAULTS.items():
        st.session_state.setdefault(K[name], value)
    st.segmented_control("What to launch", list(MODES), format_func=MODES.__getitem__, key=MODE, persist_state=state.KEEP,
                         required=True, help="A tuning campaign trains each method of the grid at several values of "
                                             "the tuned fields first, then compares them, each at its own best value, "
                                             "on evaluation seeds none was tuned on.")
    return st.session_state.get(MODE) == "tune"


def _text(message: str) -> str:
    for flag, name in FLAG_NAMES:
        message = message.replace(flag, name)
    return message


@functools.lru_cache(maxsize=64)
def _points(ranges: tuple, trials: int, seed: int) -> tuple[dict, ...]:
    """The QMC points (drawn once per protocol, not on every rerun of the page)."""
    return tuple(qmc_points(ranges, trials, seed))


def _seeds(name: str, problems: dict[str, str]) -> tuple[int, ...]:
    try:
        return tuple(parse_seeds(str(st.session_state.get(K[name]) or "")))
    except ConfigError as e:
        problems[name] = f"{LABELS[name]}: {str(e).removeprefix('seeds: ')}"
        return ()


def _inputs_read(grid: Sweep, problems: dict[str, str]):
    """(ranges, trials, tuning seeds, evaluation seeds or AUTO) of the inputs; problems by input."""
    ranges: tuple = ()
    try:
        ranges = parse_ranges(str(st.session_state.get(K["fields"]) or ""), grid.base.replace(lam=grid.lams[0]))
    except ConfigError as e:
        problems["fields"] = _text(str(e))
    trials = form.whole(st.session_state.get(K["trials"]))  # a real input: whatever the box holds reaches here
    if isinstance(trials, bool) or not isinstance(trials, int) or not 1 <= trials <= MAX_TRIALS:
        problems["trials"] = f"{LABELS['trials']} must be an integer in [1, {MAX_TRIALS}] (got {trials!r})"
    tune_seeds = _seeds("tune_seeds", problems)
    auto = str(st.session_state.get(K["eval_seeds"]) or "").strip().lower() == AUTO
    eval_seeds = AUTO if auto else _seeds("eval_seeds", problems)
    return ranges, trials if isinstance(trials, int) else 0, tune_seeds, eval_seeds


def read(lab: state.Lab, grid: Sweep | None) -> tuple[Plan | None, dict[str, str]]:
    """The plan the grid and the tuning inputs describe, or the problems (input → message)."""
    problems: dict[str, str] = {}
    if grid is None:
        return None, problems
    ranges, trials, tune_seeds, eval_seeds = _inputs_read(grid, problems)
    if problems:
        return None, problems
    from engine.reads import tuning_plan as cli  # the CLI's plan and its evaluation-seed rule, shared

    try:
        why = "evaluation seeds as given"
        if eval_seeds == AUTO:
            eval_seeds, why = cli.auto_seeds(lab.store, grid, MARGIN, tune_seeds)
        spec = TuneSpec(grid, ranges, trials, tune_seeds, eval_seeds, untuned=bool(st.session_state.get(K["untuned"])),
                        margin=MARGIN, points=_points(ranges, trials, 0))
        trial_configs, comparison, lines = cli.plan_lines(spec, lab.store, state.MAX_CONCURRENT)
    except ConfigError as e:
        return None, {FIELD_INPUT.get(getattr(e, "field", None) or "", "fields"): _text(str(e))}
    return Plan(spec, _text(why), trial_configs, comparison, lines), problems


def inputs(problems: dict[str, str]) -> None:
    """The tuning inputs (an expander in the form), each with its problem under it."""
    with st.expander("Tuning: what to tune, how many trials, which seeds", icon=":material/tune:", expanded=True):
        c1, c2 = st.columns(2)
        c1.text_input(LABELS["fields"], key=K["fields"], persist_state=state.KEEP, placeholder="lr or lr=0.001:0.1",
                      help="Float fields of a run, comma separated: FIELD (a decade either side of the form's value) "
                           "or FIELD=LOW:HIGH, drawn log-uniformly by Optuna's QMC sampler, the same points for "
                           "every method.")
        c2.number_input(LABELS["trials"], key=K["trials"], step=1.0, format="%g", persist_state=state.KEEP,  # the range: read()'s
                        help="Every method trains this many values on every tuning seed: the same budget for each.")
        _note(c1, problems, "fields")
        _note(c2, problems, "trials")
        c3, c4 = st.columns(2)
        c3.text_input(LABELS["tune_seeds"], key=K["tune_seeds"], persist_state=state.KEEP, placeholder="1000",
                      help="The seeds the trials train on; the choice is the lowest mean validation loss over them.")
        c4.text_input(LABELS["eval_seeds"], key=K["eval_seeds"], persist_state=state.KEEP, placeholder="auto or 0-4",
                      help="The comparison's seeds, none of them a tuning seed. auto: as many as the power rule asks "
                           "for at the spread the lab expects (at most 10).")
        _note(c3, problems, "tune_seeds")
        _note(c4, problems, "eval_seeds")
        st.toggle(LABELS["untuned"], key=K["untuned"], persist_state=state.KEEP,
                  help="The comparison also trains every method at the form's values, so Table 3 at the untuned value "
                       "sits beside Table 3 at each method's best value.")
        st.caption("The grid's Seeds are replaced by the tuning and evaluation seeds here.")


def _note(column, problems: dict[str, str], name: str) -> None:
    if name in problems:
        column.error(plain(problems[name]), icon=":material/error:")


def _trial_frame(plan: Plan) -> pd.DataFrame:
    rows = [{"method": method, "trial": i + 1, **{f: getattr(c, f) for f in plan.spec.fields}, "seed": c.seed}
            for method, i, c in plan.spec.trial_configs()]
    return pd.DataFrame(rows)


def preview(lab: state.Lab, plan: Plan | None, problems: dict[str, str], blocked: str | None = None) -> None:
    """The plan (before anything is written), the confirmation, where to train, the button
    (disarmed while ``blocked`` says why the runs cannot train here, and once it has started
    this campaign until the plan changes: ``confirm.launched``)."""
    if plan is None:
        if problems:
            st.error("\n".join(["Fix the tuning fields marked in the form:"]
                               + [f"- {plain(text)}" for text in problems.values()]), icon=":material/error:")
        return
    total = len(plan.trials) + len(plan.comparison)
    st.subheader(f"Tune, then compare: {len(plan.trials):,} trial runs")
    st.markdown("\n".join(f"- {plain(line)}" for line in plan.lines))
    st.caption(plain(f"Seeds: {plan.why}."))
    eta = plan.lines[-1].removeprefix("estimated time: ")
    if eta.startswith("unknown") and st.button("Measure step time", icon=":material/timer:", key="launch.tune.measure",
                                               help="Compiles the train step of each distinct model and times a few "
                                                    "steps."):
        from engine.reads import estimates

        with st.spinner("Compiling and timing the train step…"):
            estimates.grid_estimate(lab.store, [*plan.trials, *plan.comparison], measure=True)
        st.rerun()
    confirmed = confirm.large_launch(total, plain(eta), K["confirm"])
    queue_only = st.toggle("Queue for workers", key=K["queue_only"], persist_state=state.KEEP,
                           help="Leave the trials (and the comparison they lead to) to `python -m engine worker` "
                                "processes instead of training them in this dashboard.")
    if blocked:
        st.error(plain(blocked), icon=":material/memory:")
    why_not = blocked or (None if confirmed else f"More than {LARGE_LAUNCH} runs: tick the confirmation above first.")
    _button(lab, plan, queue_only, why_not)
    st.dataframe(_trial_frame(plan), hide_index=True, width="stretch", height=min(35 * len(plan.trials) + 38, 420))


def _button(lab: state.Lab, plan: Plan, queue_only: bool, why_not: str | None) -> None:
    """The campaign's button, or once it has started this plan, what it queued in its place."""
    sig = confirm.signature([c.to_dict() for c in plan.trials], plan.lines, queue_only)
    message, done = confirm.launched(CAMPAIGN, sig)
    if done:
        st.success(message or "Queued (the ids are on Runs).", icon=":material/check_circle:")
        st.page_link("views/compare.py", label="Watch the trials on Compare", icon=":material/monitoring:")
        st.button("Launched: change the plan to launch again", icon=":material/check:", type="primary",
                  width="stretch", disabled=True, key="launch.tune.done")
        confirm.again(CAMPAIGN)
        return
    slot = st.container()  # the outcome goes above the button, where the user clicked
    if st.button(f"{'Queue' if queue_only else 'Launch'} {len(plan.trials):,} trial runs",
                 icon=":material/rocket_launch:", type="primary", width="stretch", disabled=why_not is not None,
                 key="launch.tune.go", help=why_not):
        with slot:
            _launch(lab, plan, queue_only, sig)


def _launch(lab: state.Lab, plan: Plan, queue_only: bool, sig: str) -> None:
    """Check the data, store the campaign and its trials, train them here or leave them to workers."""
    from engine.runner import campaigns
    from engine.runner.preflight import check_data

    try:
        with st.spinner("Loading the data…"):
            check_data([*plan.trials, *plan.comparison])
    except (data.DataError, ConfigError, OSError) as e:
        st.error(plain(f"The data could not be loaded: {e}"), icon=":material/error:")
        return
    confirm.record(CAMPAIGN, sig, None)  # from here, another click of this plan queues nothing
    try:
        if queue_only:
            cid, ids = campaigns.start(lab.store, plan.spec)
        else:
            manager = lab.manager
            cid, ids = campaigns.start(lab.store, plan.spec, owner=manager.owner)
            manager.train(ids)
    except (StorageError, ValueError) as e:
        confirm.forget(CAMPAIGN)
        st.error(plain(f"The campaign could not be queued: {e}"), icon=":material/error:")
        return
    state.set_selected(ids)
    who = "for workers (`python -m engine worker`)" if queue_only else "here"
    confirm.record(CAMPAIGN, sig, f"Campaign {cid}: queued {len(ids)} trial runs {who} (ids {ids[0]}–{ids[-1]}); the "
                                  "comparison is queued when the last one ends. They are selected for Compare.")
    st.rerun()  # the button redrawn disarmed, the message above it
