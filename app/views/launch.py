"""Launch: a sweep form generated from the run schema; its preview shows what it will queue and how long it takes."""

import pandas as pd
import streamlit as st

from app import confirm, form, state, tuning_launch
from app.display import plain
from engine import data
from engine.config import (
    GROUPS,
    LARGE_LAUNCH,
    PAPER_STEPS,
    REPRODUCE_SEEDS,
    ConfigError,
    LaunchWarning,
    RunConfig,
    Sweep,
    launch_warnings,
    parse_seeds,
    reproduction_sweep,
)
from engine.core.choices import EQUIVALENCE_MARGIN as MARGIN
from engine.core.presets import PRESETS
from engine.core.units import format_seconds
from engine.reads import estimates, queries
from engine.runner.preflight import check_data
from engine.training import timing
from storage import StorageError

# Every value of the form lives for the whole session: a visit to another page (whose live
# refreshes run without this page's widgets) leaves it as the user left it.
SWEEP = "launch.sweep"  # the sweep's Launch button, for ``confirm.launched``
REPRODUCE = "launch.reproduce"


def _fill(sweep: Sweep) -> None:
    """Set every widget to show ``sweep`` (a button callback: runs before the widgets)."""
    for name, value in form.values_of(sweep).items():
        st.session_state[form.KEY + name] = value


def _draw(w: form.Widget, column) -> None:
    """One widget of the generated form."""
    common = {"key": w.key, "help": w.help, "persist_state": state.KEEP}
    if w.kind == "select":
        fmt = (lambda p: f"{p} — {PRESETS[p].description}") if w.name == "preset" else str
        column.selectbox(w.label, w.options, format_func=fmt, **common)
    elif w.kind == "multiselect":
        column.multiselect(w.label, w.options, wrap=True, **common)  # every chip shown whole, on more lines
    elif w.kind == "toggle":
        column.toggle(w.label, **common)
    elif w.kind == "number":
        placeholder = w.placeholder
        if w.name in ("batch_size", "seq_len"):
            preset = PRESETS.get(str(st.session_state.get(form.KEY + "preset")), PRESETS["tiny"])
            placeholder = f"preset: {preset.batch_size if w.name == 'batch_size' else preset.model.seq_len}"
        column.number_input(w.label, placeholder=placeholder, **form.number_args(w), **common)
    else:  # no max_chars: a browser field with a limit ignores a longer paste whole; the schema says the limit
        column.text_input(w.label, placeholder=w.placeholder, **common)


def _preview_frame(configs: list) -> pd.DataFrame:
    return pd.DataFrame({"run": [c.label() for c in configs], "steps": [c.steps for c in configs]})


def _data_text(grid: Sweep) -> str | None:
    """What the data options read. Sources with a user path are looked up only when the
    user asks (a glob is not run on every keystroke); the answer is kept per options."""
    source, options = grid.base.dataset, grid.base.dataset_options
    if source == "classics" or (source == "files" and not options.get("path")):
        try:
            return data.describe_source(source, **options)  # reads no user path
        except data.DataError as e:
            st.error(plain(e), icon=":material/error:")
            return None
    key = f"launch.data_check:{source}:{sorted(options.items())!r}"
    if st.button("Check data", icon=":material/fact_check:", help="Find the files the path or glob names."):
        try:
            st.session_state[key] = ("ok", data.describe_source(source, **options))
        except data.DataError as e:
            st.session_state[key] = ("error", str(e))
    verdict, text = st.session_state.get(key, (None, None))
    if verdict == "error":
        st.error(plain(text), icon=":material/error:")
        return None
    return text


def _estimate(lab: state.Lab, configs: list) -> float | None:
    """The estimated time of the launch, shown with where its step time comes from; with
    no step time known, a button to measure one. Returns the seconds, None when unknown."""
    estimate = estimates.grid_estimate(lab.store, configs, state.MAX_CONCURRENT)
    if estimate.known:
        st.markdown(f"Estimated time **≈ {format_seconds(estimate.seconds)}**")
        scaled = f" Scaled from other ranks: {estimate.scaled_text()}." if estimate.scaled else ""
        st.caption(f"Step time {estimate.step_ms_text()} ({timing.describe_sources(estimate.timings.values())}), "
                   f"plus start-up, validation and probes.{scaled}")
        return estimate.seconds
    st.markdown(f"Estimated time: **unknown** ({plain(estimate.missing_text())})")
    if st.button("Measure step time", icon=":material/timer:",
                 help="Compiles the train step of each distinct model in the grid and times a few steps."):
        with st.spinner("Compiling and timing the train step…"):
            estimates.grid_estimate(lab.store, configs, measure=True)
        st.rerun()
    return None


def _submit(lab: state.Lab, configs: list, tags: str | None, queue_only: bool, sig: str) -> None:
    """Check the data, then queue ``configs`` for workers or train them here; says (above the
    button, where the user clicked) which ids they got, selects them for Compare, and disarms the button
    until the form changes (``confirm.launched``)."""
    try:
        with st.spinner("Loading the data…"):
            check_data(configs)
    except (data.DataError, ConfigError, OSError) as e:
        st.error(plain(f"The data could not be loaded: {e}"), icon=":material/error:")
        return
    tag_list = [t.strip() for t in (tags or "").split(",") if t.strip()]
    confirm.record(SWEEP, sig, None)  # from here, another click of this form queues nothing
    try:
        if queue_only:
            from engine.runner import jobs  # JAX, for the device each run records

            ids = jobs.queue_runs(lab.store, configs, tags=tag_list)
        else:
            ids = lab.manager.submit(configs, tags=tag_list)
    except (StorageError, ValueError) as e:
        confirm.forget(SWEEP)
        st.error(plain(f"The runs could not be queued: {e}"), icon=":material/error:")
        return
    state.set_selected(ids)
    n = len(configs)
    who = "for workers (`python -m engine worker`)" if queue_only else "here"
    message = f"Queued {n} run{'s' if n != 1 else ''} {who} (ids {ids[0]}–{ids[-1]}); they are selected for Compare."
    confirm.record(SWEEP, sig, message)
    st.rerun()  # the button redrawn disarmed, the message above it


def _launched(message: str | None) -> None:
    """What the last launch of this form queued, where the Launch button was, and its links."""
    st.success(message or "Queued (the ids are on Runs).", icon=":material/check_circle:")
    st.page_link("views/compare.py", label="Watch them on Compare", icon=":material/monitoring:")
    st.page_link("views/runs.py", label="See all runs", icon=":material/table_rows:")


def _launch_state(configs: list) -> tuple[str, str | None, bool]:
    """(the form's signature: its runs, tags and where they train; what its last launch said;
    whether it has launched since it last changed: ``confirm.launched``)."""
    tags, queue_only = st.session_state.get(form.KEY + "tags"), bool(st.session_state.get(form.KEY + "queue_only"))
    sig = confirm.signature([c.to_dict() for c in configs], tags, queue_only)
    return (sig, *confirm.launched(SWEEP, sig))


def _launch_button(lab: state.Lab, configs: list, label: str, why_not: str | None, launched: tuple) -> None:
    """The Launch button, armed unless ``why_not`` says why it is not; once it has launched the
    form (``launched``: ``_launch_state``'s), the outcome in its place and the button disarmed
    until the form changes."""
    sig, message, done = launched
    if done:
        _launched(message)
        st.button("Launched: change the form to launch again", icon=":material/check:", type="primary",
                  width="stretch", disabled=True, key="launch.done")
        confirm.again(SWEEP)
        return
    slot = st.container()  # the outcome (or why it failed) goes above the button, where the user clicked
    if st.button(label, icon=":material/rocket_launch:", type="primary", width="stretch", disabled=why_not is not None,
                 help=why_not):
        with slot:
            _submit(lab, configs, st.session_state.get(form.KEY + "tags"),
                    bool(st.session_state.get(form.KEY + "queue_only")), sig)


def _preview(lab: state.Lab, grid: Sweep, configs: list, warnings: list, blocked: str | None) -> None:
    """How many runs, how long (when a step time is known), what to check (a launch of
    more than ``LARGE_LAUNCH`` runs must be confirmed), which runs; and the Launch button,
    disarmed while ``blocked`` says why the runs cannot train here."""
    for clip in grid.clipped():
        st.warning(plain(f"{clip}: the run records R = {clip.effective}."), icon=":material/content_cut:")
    n = len(configs)
    plural = "s" if n != 1 else ""
    st.subheader(f"{n:,} run{plural} to launch")
    total = _estimate(lab, configs)
    for w in warnings:
        st.warning(plain(form.labelled(w.field, w.text)), icon=":material/warning:")
    launched = _launch_state(configs)
    if not launched[2]:  # once launched, the runs it names are the ones just queued: the outcome says so instead
        _relaunch(lab, configs)
    _seed_plan(lab, configs)
    eta = format_seconds(total) if total is not None else "unknown (measure the step time above)"
    confirmed = confirm.large_launch(n, eta, "launch.confirm_large")
    st.text_input("Tags", key=form.KEY + "tags", placeholder="pilot, ablation", persist_state=state.KEEP,
                  help="Comma list; every run of this launch gets them (filter by them on Runs).")
    queue_only = st.toggle("Queue for workers", key=form.KEY + "queue_only", persist_state=state.KEEP,
                           help="Leave the runs to `python -m engine worker` processes (other machines or GPUs) "
                                "instead of training them in this dashboard.")
    source_text = _data_text(grid)
    if blocked:
        st.error(plain(blocked), icon=":material/memory:")
    why_not = blocked or (None if confirmed else f"More than {LARGE_LAUNCH} runs: tick the confirmation above first.")
    _launch_button(lab, configs, f"{'Queue' if queue_only else 'Launch'} {n:,} run{plural}", why_not, launched)
    st.dataframe(_preview_frame(configs), hide_index=True, width="stretch", height=min(35 * n + 38, 420),
                 placeholder="—")
    st.caption(plain(f"Data: {source_text}") if source_text else "Data: not checked yet (Launch checks it too).")


def _relaunch(lab: state.Lab, configs: list) -> None:
    """Warn (the Launch button stays) when runs of this grid are already in the database with
    the same config and seed (``engine.reads.queries.relaunch_warning``), naming them."""
    try:
        again = queries.relaunch_warning(lab.store, configs)
    except StorageError:
        return
    if again is not None:
        st.warning(plain(again), icon=":material/content_copy:")


def _seed_plan(lab: state.Lab, configs: list) -> None:
    """Say, before anything starts, when the grid's seeds cannot decide whether a method matches
    exact backprop (``engine.reads.queries.seed_plan``, at the default margin)."""
    try:
        plan = queries.seed_plan(lab.store, configs)
    except StorageError:
        return
    if plan is not None:  # advice, not a fault: a smoke test need not decide anything
        st.info(plain(f"Seeds: {plan}. Table 3 and the report judge Δ val against ±{MARGIN:g} nats unless told "
                      "another margin."), icon=":material/query_stats:")


def _reproduce(lab: state.Lab) -> None:
    """The paper's grid (``engine.config.reproduce``, the same as ``python -m engine reproduce``)
    in one action: its size and estimated time shown before the button queues it."""
    with st.expander("Reproduce the paper", icon=":material/science:", expanded=False):
        st.caption("The paper's grid: the paper preset, exact backprop and BASIS at R = 1, 8, 16, 32, 64 with "
                   "λ = 0.01, over seeds, tagged `reproduce`. When its last run ends, its report is built and stored "
                   "with the sweep (the Report page). The same as `python -m engine reproduce`.")
        c1, c2 = st.columns(2)
        st.session_state.setdefault(form.KEY + "reproduce.steps", PAPER_STEPS)  # kept across pages, like the form
        st.session_state.setdefault(form.KEY + "reproduce.seeds", ", ".join(map(str, REPRODUCE_SEEDS)))
        steps = form.whole(c1.number_input("Steps per run", step=1000.0, format="%g", key=form.KEY + "reproduce.steps",
                                           persist_state=state.KEEP, help="The paper trains 50,000 steps; fewer give a "
                                                                    "quicker, rougher reproduction."))
        seeds = c2.text_input("Seeds", key=form.KEY + "reproduce.seeds", persist_state=state.KEEP,
                              help="Comma list or range; each seed gives every method the same initial parameters "
                                   "and batches.")
        try:
            RunConfig(steps=steps)  # the schema's check of what the box holds (a real input: any number reaches it)
            sweep = reproduction_sweep(steps, parse_seeds(seeds))
        except ConfigError as e:
            st.error(plain(form.labelled(getattr(e, "field", None), str(e))), icon=":material/error:")
            return
        configs = sweep.expand()
        estimate = estimates.grid_estimate(lab.store, configs, state.MAX_CONCURRENT)
        st.markdown(f"**{len(configs)} runs**, {steps:,} steps each. Estimated time "
                    f"**{plain(estimate.text())}**, {state.MAX_CONCURRENT} at a time here.")
        _relaunch(lab, configs)
        _seed_plan(lab, configs)
        if not estimate.known and st.button("Measure step time", icon=":material/timer:", key="reproduce.measure",
                                            help="Compiles the train step of each of the grid's models and times a few steps."):
            with st.spinner("Compiling and timing the train step…"):
                estimates.grid_estimate(lab.store, configs, measure=True)
            st.rerun()
        st.toggle("Queue for workers", key=form.KEY + "reproduce.queue_only", persist_state=state.KEEP,
                  help="Leave the runs to `python -m engine worker` processes instead of training them here.")
        confirmed = confirm.large_launch(len(configs), plain(estimate.text()), "launch.reproduce.confirm_large")
        _reproduce_button(lab, sweep, configs, None if confirmed else
                          f"More than {LARGE_LAUNCH} runs: tick the confirmation above first.")


def _reproduce_button(lab: state.Lab, sweep: Sweep, configs: list, why_not: str | None) -> None:
    """"Reproduce the paper", disarmed once it has queued this grid until the grid changes
    (``confirm.launched``), with what it queued above it."""
    queue_only = bool(st.session_state.get(form.KEY + "reproduce.queue_only"))
    sig = confirm.signature([c.to_dict() for c in configs], queue_only)
    message, done = confirm.launched(REPRODUCE, sig)
    if done:
        st.success(message or "Queued the paper's grid (the ids are on Runs).", icon=":material/check_circle:")
        st.page_link("views/compare.py", label="Watch them on Compare", icon=":material/monitoring:")
        st.page_link("views/report.py", label="Reports", icon=":material/summarize:")
        st.button("Queued: change the grid to reproduce again", icon=":material/check:", type="primary",
                  key="reproduce.done", disabled=True)
        confirm.again(REPRODUCE)
        return
    slot = st.container()
    if not st.button("Reproduce the paper", icon=":material/play_circle:", type="primary", key="reproduce.go",
                     disabled=why_not is not None, help=why_not):
        return
    with slot:
        try:
            with st.spinner("Loading the data…"):
                check_data(configs)
            confirm.record(REPRODUCE, sig, None)  # from here, another click of this grid queues nothing
            if queue_only:
                from engine.runner import jobs  # JAX, for the device each run records

                ids = jobs.queue_runs(lab.store, configs, tags=sweep.tags)
            else:
                ids = lab.manager.submit(configs, tags=sweep.tags)
        except (data.DataError, ConfigError, OSError, StorageError, ValueError) as e:
            confirm.forget(REPRODUCE)
            st.error(plain(f"The reproduction could not be queued: {e}"), icon=":material/error:")
            return
    state.set_selected(ids)
    message = (f"Queued the paper's grid: {len(ids)} runs (ids {ids[0]}–{ids[-1]}), sweep "
               f"{lab.store.runs.get_run(ids[0]).sweep_id}; they are selected for Compare.")
    confirm.record(REPRODUCE, sig, plain(message))
    st.rerun()


WIDGETS = form.widgets()
for name, value in form.values_of(form.DEFAULT_SWEEP).items():  # first visit: the defaults
    st.session_state.setdefault(form.KEY + name, value)
if (clone := state.take_clone()) is not None:  # "Clone to Launch" from Runs or Run detail
    _fill(clone)

lab = state.lab()
st.title("Launch a sweep")
st.caption(
    "One run per estimator × rank × λ × seed (exact backprop once per seed). Runs train in the "
    f"background, {state.MAX_CONCURRENT} at a time, and keep going if you leave this page."
)
tune = tuning_launch.mode_picker()  # a plain sweep, or each method tuned first, then compared
values = {w.name: st.session_state.get(w.key) for w in WIDGETS}
if tune:
    values["seeds"] = "0"  # the grid's seeds are the protocol's (tuning and evaluation seeds)
grid, configs, problems = form.read(values)  # every error at once
problems += [(field, form.labelled(field, text)) for field, text in form.refusals(configs)]
if problems:
    grid, configs = None, []
here = not st.session_state.get(tuning_launch.K["queue_only"] if tune else form.KEY + "queue_only")
memory = form.memory_note(configs, form.machine_memory())  # (field, text): one step needs more than this machine has
blocked = form.labelled(memory[0], f"{memory[1]}: lower it, or queue the runs for workers with devices that large") \
    if memory is not None and here else None
plan, tune_problems = tuning_launch.read(lab, grid) if tune else (None, {})
far = [w for w in form.far_values(configs) if memory is None or w.field != memory[0]]  # the memory note says it
warnings = launch_warnings(configs) + far if configs else []
if memory is not None and not here:
    warnings.append(LaunchWarning(memory[0], f"{memory[1]}: a worker that trains it needs devices that large"))
notes: dict[str, list[tuple[str, str]]] = {}  # widget → what to show under it (error or warning, text)
for widget, text in problems + ([(memory[0], blocked)] if memory is not None and blocked else []):
    if widget:
        notes.setdefault(widget, []).append(("error", text))
for warned in warnings:
    if (target := form.widget_of(warned.field)) is not None:
        notes.setdefault(target.name, []).append(("warning", form.labelled(warned.field, warned.text)))

form_col, preview_col = st.columns([2, 1], gap="large")
with form_col:
    b1, b2, _ = st.columns([1, 1, 2])
    b1.button("Paper settings", icon=":material/description:", on_click=_fill, args=(form.PAPER_SWEEP,), width="stretch",
              help="The paper's run: preset paper (T 64, d 64, 2 layers, batch 1), SGD momentum 0.9, "
                   "lr 0.01, λ = 0.01 as in its code, ranks 1–64, 50,000 steps, validation every 1,000.")
    b2.button("Defaults", icon=":material/restart_alt:", on_click=_fill, args=(form.DEFAULT_SWEEP,), width="stretch",
              help="A quick tiny-model sweep.")
    if tune:
        tuning_launch.inputs(tune_problems)
    else:
        _reproduce(lab)
    dataset = st.session_state.get(form.KEY + "dataset")
    for group, ws in form.grouped(WIDGETS).items():
        shown = [w for w in ws if (not w.sources or dataset in w.sources) and not (tune and w.name == "seeds")]
        flagged = any(w.name in notes for w in shown)
        with st.expander(GROUPS[group], expanded=flagged or group in ("method", "model", "training", "data")):
            for row in form.rows(shown):  # three fields to a row of columns: a narrow screen stacks them in order
                columns = [st.container()] if row[0].kind == "multiselect" else st.columns(3)
                for w, column in zip(row, columns):
                    _draw(w, column)
                    for kind, text in notes.get(w.name, []):  # the field's own error or warning, under it
                        getattr(column, kind)(plain(text), icon=":material/error:" if kind == "error" else
                                              ":material/warning:")

with preview_col:
    if problems:
        marked = [text for widget, text in problems if widget]
        head = (f"Fix the {len(marked)} fields marked in the form:" if len(marked) > 1 else
                "Fix the field marked in the form:" if marked else "")
        lines = [plain(text) for widget, text in problems if not widget] + [f"- {plain(text)}" for text in marked]
        st.error("\n".join(([head] if head else []) + lines), icon=":material/error:")
    if tune:
        tuning_launch.preview(lab, plan, tune_problems, blocked)
    elif configs and grid is not None:
        _preview(lab, grid, configs, warnings, blocked)
