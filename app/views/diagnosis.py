"""Diagnosis: squared bias, variance and MSE of every dW estimator, measured on a run's own
state and batches (``engine.runner.diagnosis``); new diagnoses run in the background."""

import streamlit as st

from app import diagnosis_charts as figures
from app import state, viewstate
from app.display import plain, plot, status_text
from engine.config import ConfigError, RunConfig
from engine.core.units import format_seconds
from engine.runner import diagnosis
from storage import ACTIVE_STATUSES, StorageError

lab = state.lab()
store = lab.store


def _started(start, message) -> bool:
    """Start a diagnosis (``start()`` returns its id), show it and say so with
    ``message(id)``; False, with the error shown, when it cannot start."""
    try:
        new = start()
    except (ConfigError, ValueError) as e:
        st.error(plain(str(e).splitlines()[0]), icon=":material/error:")
        return False
    st.session_state["diagnosis.diag"] = new
    st.toast(message(new))
    return True


def _seed(query, name: str, key: str, choices: list, what: str, instead: str) -> list[str]:
    """Set control ``key`` from the link's parameter ``name`` when it is one of ``choices``;
    else, when the link holds another value, the one line that says so and what is shown
    ``instead`` (in a list)."""
    value, problem = viewstate.url_pick(query, name, choices, what)
    if value is not None:
        st.session_state[key] = value
    return [f"The link's {problem}; {instead}."] if problem else []


st.title("Diagnosis")
st.caption("How far each estimator's d̂W is from the exact dW on a run's real training state: squared bias, "
           "variance and MSE over K sketch keys, relative to ‖dW‖², against the rank R.")
records = {r.id: r for r in store.runs.list_runs()}
if not records:
    st.info("No runs yet: launch one (with checkpoints), then diagnose its estimators here.")
    st.page_link("views/launch.py", label="Launch a sweep", icon=":material/rocket_launch:")
    st.stop()

query = state.url_query()
linked = "diagnosis.run" not in st.session_state  # the page's first draw: its controls come from the link
wanted, problem = viewstate.url_id(query, "run", records) if linked else (None, None)
if wanted is not None:
    st.session_state["diagnosis.run"] = wanted
if st.session_state.get("diagnosis.run") not in records:
    picked = [i for i in state.selected() if i in records]
    st.session_state["diagnosis.run"] = picked[0] if picked else max(records)
run_id = st.selectbox("Run", sorted(records, reverse=True), key="diagnosis.run",
                      format_func=lambda i: f"#{i} {records[i].name}")
run = records[run_id]
diags = store.frames.diagnostics_frame(run_id)
try:
    steps, no_steps = diagnosis.checkpoint_steps(store, run_id, lab.manager.checkpoint_root), None
except diagnosis.CheckpointError as e:
    steps, no_steps = [], e
states = [*reversed(steps), 0]
problems = [f"The link's {problem}; showing run #{run_id} instead."] if problem else []
if linked:
    problems += _seed(query, "state", f"diagnosis.step.{run_id}", states, f"a saved state of run #{run_id}",
                      "New diagnosis starts from its latest state instead")
    problems += _seed(query, "diag", "diagnosis.diag", [int(i) for i in diags["id"]],
                      f"a diagnosis of run #{run_id}", "showing its latest diagnosis instead")
for problem in problems:
    st.warning(plain(problem), icon=":material/link_off:")

with st.expander("New diagnosis", expanded=diags.empty or "state" in query, icon=":material/add_chart:"):
    if no_steps is not None:
        st.warning(plain(no_steps), icon=":material/warning:")
    # plain widgets, not an st.form: Enter in a field only updates the cost; only the button starts
    c1, c2 = st.columns([1, 2])
    step = c1.selectbox(
        "State", states, key=f"diagnosis.step.{run_id}",
        format_func=lambda s: f"checkpoint at step {s:,}" if s else "initial parameters (step 0)",
        help="A saved checkpoint of the run, or its initial parameters. The batches are the ones the run "
             "trained on next.")
    chosen = c2.multiselect("Estimators", diagnosis.SKETCHED, default=list(diagnosis.SKETCHED),
                            key=f"diagnosis.which.{run_id}")
    c1, c2, c3, c4 = st.columns(4)
    ranks = c1.text_input("Ranks R", ", ".join(map(str, diagnosis.DEFAULT_RANKS)), key=f"diagnosis.ranks.{run_id}",
                          help="Comma list; ranks above B·T are clipped to B·T.")
    lams = c2.text_input("Shrink λ", f"{RunConfig.from_dict(run.config).lam:g}", key=f"diagnosis.lams.{run_id}",
                         help="Comma list of λ in [0, 1); the run's own λ by default.")
    keys = c3.number_input("Sketch keys K", min_value=2, value=diagnosis.DEFAULT_KEYS, step=32,
                           key=f"diagnosis.keys.{run_id}",
                           help=f"Independent sketches per batch, shared by every estimator (paired). "
                                f"{diagnosis.DEFAULT_KEYS} detects a variance ratio of 0.8 with power 0.8.")
    batches = c4.number_input("Batches N", min_value=1, max_value=diagnosis.MAX_BATCHES,
                              value=diagnosis.DEFAULT_BATCHES, key=f"diagnosis.batches.{run_id}")
    plan: diagnosis.Plan | None
    try:
        plan = diagnosis.plan_diagnosis(store, run_id, step=int(step), estimators=chosen or "", ranks=ranks,
                                        lams=lams, keys=int(keys), batches=int(batches),
                                        checkpoints=lab.manager.checkpoint_root)
    except (ConfigError, ValueError) as e:  # CheckpointError and DataError are ValueErrors
        plan = None
        st.error(plain(str(e).splitlines()[0]), icon=":material/error:")
    if plan is not None:
        eta = diagnosis.estimate_seconds(store, plan)
        st.caption(plain(f"Cost: {plan.cost_text()}. Estimated time: "
                         + (format_seconds(eta) if eta is not None else
                            "unknown (no finished diagnosis of this model yet)") + "."))
    start = st.button("Run diagnosis", icon=":material/play_arrow:", type="primary", disabled=plan is None,
                      key=f"diagnosis.start.{run_id}")
    if start and plan is not None and _started(lambda: lab.manager.start_diagnosis(plan),
                                               lambda new: f"Diagnosis #{new} started in the background."):
        diags = store.frames.diagnostics_frame(run_id)

if diags.empty:
    st.info("No diagnosis of this run yet: start one above.")
    state.keep_in_url({"run": run_id, "state": step, "diag": None, "layer": None, "split": None, "rank": None})
    st.stop()

rows = {int(r.id): r for r in diags.itertuples(index=False)}
if st.session_state.get("diagnosis.diag") not in rows:
    finished = [i for i, r in rows.items() if r.status == "finished"]
    st.session_state["diagnosis.diag"] = max(finished or rows)
# the choices name what each diagnosis measures, not its status: a label is drawn with the page and would go
# stale while the diagnosis moves on; the status is shown below, by the live part, from the current state
diag_id = st.selectbox("Diagnosis", sorted(rows, reverse=True), key="diagnosis.diag",
                       format_func=lambda i: figures.diagnosis_label(diags[diags.id == i].iloc[0]))
chosen_status = rows[diag_id].status
state.keep_in_url({"run": run_id, "state": step, "diag": diag_id})
actions = st.container(horizontal=True)
if actions.button("Cancel diagnosis", icon=":material/stop_circle:", key="diagnosis.cancel",
                  disabled=chosen_status not in ACTIVE_STATUSES,
                  help="Stop it after its current step; it keeps what it measured so far and ends cancelled."):
    lab.manager.cancel_diagnosis(diag_id)
    st.toast(f"Cancel requested for diagnosis #{diag_id}.")
    st.rerun()
if actions.button("Run again", icon=":material/replay:", key="diagnosis.rerun",
                  help="A new diagnosis with this one's settings (state, estimators, ranks, λs, keys, batches)."):
    if _started(lambda: lab.manager.rerun_diagnosis(diag_id), lambda again: f"Diagnosis #{again} started: #{diag_id} again."):
        st.rerun()
if actions.button("Delete diagnosis…", icon=":material/delete:", key="diagnosis.delete",
                  disabled=chosen_status == "running", help="Delete this diagnosis and its results (asks first)."):
    st.session_state["diagnosis.confirm_delete"] = diag_id
if st.session_state.get("diagnosis.confirm_delete") == diag_id:
    box = st.container(border=True)
    box.warning(plain(f"Delete diagnosis #{diag_id} ({figures.diagnosis_label(diags[diags.id == diag_id].iloc[0])}) and its "
                      "results? This cannot be undone."), icon=":material/delete:")
    yes, no = box.columns(2)
    if yes.button(f"Delete #{diag_id}", type="primary", key="diagnosis.delete.ok"):
        try:
            store.diagnostics.delete_diagnostic(diag_id)
        except StorageError as e:
            st.error(plain(e), icon=":material/error:")
        else:
            st.session_state.pop("diagnosis.confirm_delete", None)
            st.session_state.pop("diagnosis.diag", None)
            st.toast(f"Deleted diagnosis #{diag_id}.")
            st.rerun()
    if no.button("Keep it", key="diagnosis.delete.cancel"):
        st.session_state.pop("diagnosis.confirm_delete", None)
        st.rerun()


def _shown_from_link(layers: list[str], ranks: list[int]) -> None:
    """Layer, split and rank of the chosen diagnosis's results: from the link when the page is
    drawn first (a value not among them said in one line), else as chosen, a rank not measured
    here moved to the middle one."""
    if linked and "diagnosis.layer" not in st.session_state:
        query, said = state.url_query(), []
        said += _seed(query, "layer", "diagnosis.layer", layers, "a layer of this diagnosis", "showing the first")
        said += _seed(query, "rank", "diagnosis.rank", ranks, "a rank of this diagnosis", "the table reads the middle one")
        split = viewstate.values_of(query, "split")
        if split and split[-1] not in ("0", "1"):
            said.append(f"The link's split={viewstate.shown(split[-1])} is not 0 or 1; shown unsplit.")
        st.session_state["diagnosis.split"] = split[-1:] == ["1"]
        for line in said:
            st.warning(plain(line), icon=":material/link_off:")
    if st.session_state.get("diagnosis.rank") not in ranks:
        st.session_state["diagnosis.rank"] = ranks[len(ranks) // 2]


def _view() -> None:
    """The chosen diagnosis: progress while it computes, else its chart and table."""
    frame = store.frames.diagnostics_frame(run_id)
    frame = frame[frame["id"] == diag_id]
    if frame.empty:
        st.info("This diagnosis was deleted.")
        return
    row = frame.iloc[0]
    if (row["status"] in ACTIVE_STATUSES) != active:
        st.rerun()  # it started or ended: redraw with the matching refresh rate
    settings = row["settings"] or {}
    st.markdown(f"**{plain(status_text(row['status']))}** · " + plain(figures.measured_on(run_id, run.name, settings)))
    for note in settings.get("notes", []):
        st.caption(plain(note))
    if row["status"] in ACTIVE_STATUSES:
        progress = lab.manager.diagnosis_progress(diag_id)
        text = (f"{status_text(row['status'])}: {progress[0]:,} of {progress[1]:,} (batch, estimator, rank, λ) done"
                if progress else f"{status_text(row['status'])} in another process")
        st.progress(figures.progress_fraction(progress), text=text)
        state.keep_in_url(dict.fromkeys(("layer", "split", "rank")))
        return
    results = store.diagnostics.diagnostic_results(diag_id)
    if row["status"] != "finished":
        first = (row["error"] or "").splitlines()[0] if row["error"] else "no error recorded"
        if row["status"] == "cancelled" and not results.empty:  # partial results: shown, and said so
            st.warning(plain(f"This diagnosis was cancelled: {first}"), icon=":material/stop_circle:")
        else:
            st.error(plain(f"This diagnosis {row['status']}: {first}"), icon=":material/error:")
            return
    if results.empty:
        st.info("This diagnosis stored no results.")
        return
    choices = figures.ranks(results)
    _shown_from_link(figures.layers(results), choices)
    c1, c2 = st.columns([2, 1])
    layer = c1.selectbox("Layer", figures.layers(results), format_func=figures.layer_label, key="diagnosis.layer")
    split = c2.toggle("split into bias² and variance", key="diagnosis.split",
                      help="MSE = bias² + variance. An open ▽ marks a bias² that is zero within 2 standard "
                           "errors, drawn at that upper bound.")
    plot(figures.mse_figure(results, layer, split=split, title=f"Relative MSE against R: {figures.layer_label(layer)}"),
         "diagnosis.mse")
    st.caption("Log–log axes. bias² is corrected for Monte-Carlo noise (‖ē‖² − V/K), so an unbiased estimator's "
               "is 0 ± se; ▽ marks such an upper bound. A value that is 0 to float32 precision (below 1e-10: "
               "an estimator that keeps X whole at that rank) is not drawn; see the table.")
    rank = st.select_slider("Table at rank R", choices, key="diagnosis.rank")
    state.keep_in_url({"layer": layer, "split": "1" if split else None, "rank": rank})
    number = st.column_config.NumberColumn(format="%.3g")
    st.dataframe(figures.table_at(results, layer, rank), hide_index=True, width="stretch",
                 column_config={c: number for c in figures.TABLE_COLUMNS if c != "estimator"})
    st.download_button("Results as CSV", data=diagnosis.results_csv(store, diag_id, results),
                       file_name=f"basis-diagnosis-{diag_id}.csv", mime="text/csv", icon=":material/download:",
                       key="diagnosis.csv")


active = rows[diag_id].status in ACTIVE_STATUSES
st.fragment(run_every=state.refresh_every(active))(state.guarded(_view))()
