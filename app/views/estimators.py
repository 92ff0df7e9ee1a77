"""Estimators: squared bias, variance and MSE of every dW estimator, measured on a run's own
state and batches (``engine.runner.diagnosis``); new diagnoses run in the background."""

import streamlit as st

from app import estimators as est
from app import state
from app.display import plain, plot, status_text
from engine.config import ConfigError, RunConfig
from engine.runner import diagnosis
from engine.training.checkpoints import CheckpointError
from storage import ACTIVE_STATUSES

lab = state.lab()
store = lab.store
st.title("Estimators")
st.caption("How far each estimator's d̂W is from the exact dW on a run's real training state: squared bias, "
           "variance and MSE over K sketch keys, relative to ‖dW‖², against the rank R.")
records = {r.id: r for r in store.list_runs()}
if not records:
    st.info("No runs yet: launch one (with checkpoints), then diagnose its estimators here.")
    st.page_link("views/launch.py", label="Launch a sweep", icon=":material/rocket_launch:")
    st.stop()

if st.session_state.get("estimators.run") not in records:
    picked = [i for i in state.selected() if i in records]
    st.session_state["estimators.run"] = picked[0] if picked else max(records)
run_id = st.selectbox("Run", sorted(records, reverse=True), key="estimators.run",
                      format_func=lambda i: f"#{i} {records[i].name}")
run = records[run_id]
diagnosis.check_stale_diagnoses(store)
diags = store.diagnostics_frame(run_id)

with st.expander("New diagnosis", expanded=diags.empty, icon=":material/add_chart:"):
    try:
        steps = diagnosis.checkpoint_steps(store, run_id, lab.manager.checkpoint_root)
    except CheckpointError as e:
        st.warning(plain(e), icon=":material/warning:")
        steps = []
    with st.form(f"estimators.new.{run_id}", border=False):
        c1, c2 = st.columns([1, 2])
        step = c1.selectbox(
            "State", [*reversed(steps), 0], key=f"estimators.step.{run_id}",
            format_func=lambda s: f"checkpoint at step {s:,}" if s else "initial parameters (step 0)",
            help="A saved checkpoint of the run, or its initial parameters. The batches are the ones the run "
                 "trained on next.")
        chosen = c2.multiselect("Estimators", diagnosis.SKETCHED, default=list(diagnosis.SKETCHED),
                                key=f"estimators.which.{run_id}")
        c1, c2, c3, c4 = st.columns(4)
        ranks = c1.text_input("Ranks R", ", ".join(map(str, diagnosis.DEFAULT_RANKS)), key=f"estimators.ranks.{run_id}",
                              help="Comma list; ranks above B·T are clipped to B·T.")
        lams = c2.text_input("Shrink λ", f"{RunConfig.from_dict(run.config).lam:g}", key=f"estimators.lams.{run_id}",
                             help="Comma list of λ in [0, 1); the run's own λ by default.")
        keys = c3.number_input("Sketch keys K", min_value=2, value=diagnosis.DEFAULT_KEYS, step=32,
                               key=f"estimators.keys.{run_id}", help="Independent sketches per batch.")
        batches = c4.number_input("Batches N", min_value=1, max_value=diagnosis.MAX_BATCHES,
                                  value=diagnosis.DEFAULT_BATCHES, key=f"estimators.batches.{run_id}")
        if st.form_submit_button("Run diagnosis", icon=":material/play_arrow:", type="primary"):
            try:
                new = lab.manager.diagnose(run_id, step=int(step), estimators=chosen or "", ranks=ranks, lams=lams,
                                           keys=int(keys), batches=int(batches))
            except (ConfigError, ValueError) as e:  # CheckpointError and DataError are ValueErrors
                st.error(plain(str(e).splitlines()[0]), icon=":material/error:")
            else:
                st.session_state["estimators.diag"] = new
                st.toast(f"Diagnosis #{new} started in the background.")
                diags = store.diagnostics_frame(run_id)

if diags.empty:
    st.info("No diagnosis of this run yet: start one above.")
    st.stop()

rows = {int(r.id): r for r in diags.itertuples(index=False)}
if st.session_state.get("estimators.diag") not in rows:
    finished = [i for i, r in rows.items() if r.status == "finished"]
    st.session_state["estimators.diag"] = max(finished or rows)
diag_id = st.selectbox("Diagnosis", sorted(rows, reverse=True), key="estimators.diag",
                       format_func=lambda i: f"{status_text(rows[i].status)}  {est.diagnosis_label(diags[diags.id == i].iloc[0])}")


def _view() -> None:
    """The chosen diagnosis: progress while it computes, else its chart and table."""
    frame = store.diagnostics_frame(run_id)
    frame = frame[frame["id"] == diag_id]
    if frame.empty:
        st.info("This diagnosis was deleted.")
        return
    row = frame.iloc[0]
    if (row["status"] in ACTIVE_STATUSES) != active:
        st.rerun()  # it started or ended: redraw with the matching refresh rate
    settings = row["settings"] or {}
    st.markdown(plain(est.measured_on(run_id, run.name, settings)))
    for note in settings.get("notes", []):
        st.caption(plain(note))
    if row["status"] in ACTIVE_STATUSES:
        progress = lab.manager.diagnosis_progress(diag_id)
        text = (f"{status_text(row['status'])}: {progress[0]:,} of {progress[1]:,} (batch, estimator, rank, λ) done"
                if progress else f"{status_text(row['status'])} in another process")
        st.progress(est.progress_fraction(progress), text=text)
        return
    if row["status"] != "finished":
        first = (row["error"] or "").splitlines()[0] if row["error"] else "no error recorded"
        st.error(plain(f"This diagnosis {row['status']}: {first}"), icon=":material/error:")
        return
    results = store.diagnostic_results(diag_id)
    if results.empty:
        st.info("This diagnosis stored no results.")
        return
    c1, c2 = st.columns([2, 1])
    layer = c1.selectbox("Layer", est.layers(results), format_func=est.layer_label, key="estimators.layer")
    split = c2.toggle("split into bias² and variance", key="estimators.split",
                      help="MSE = bias² + variance. An open ▽ marks a bias² that is zero within 2 standard "
                           "errors, drawn at that upper bound.")
    plot(est.mse_figure(results, layer, split=split, title=f"Relative MSE against R: {est.layer_label(layer)}"),
         "estimators.mse")
    st.caption("Log–log axes. bias² is corrected for Monte-Carlo noise (‖ē‖² − V/K), so an unbiased estimator's "
               "is 0 ± se; ▽ marks such an upper bound. A value that is 0 to float32 precision (below 1e-10: "
               "an estimator that keeps X whole at that rank) is not drawn; see the table.")
    choices = est.ranks(results)
    rank = st.select_slider("Table at rank R", choices, value=choices[len(choices) // 2], key="estimators.rank")
    number = st.column_config.NumberColumn(format="%.3g")
    st.dataframe(est.table_at(results, layer, rank), hide_index=True, width="stretch",
                 column_config={c: number for c in est.TABLE_COLUMNS if c != "estimator"})
    st.download_button("Results as CSV", data=diagnosis.results_csv(store, diag_id, results),
                       file_name=f"basis-diagnosis-{diag_id}.csv", mime="text/csv", icon=":material/download:",
                       key="estimators.csv")


active = rows[diag_id].status in ACTIVE_STATUSES
st.fragment(run_every=state.refresh_every(active))(state.guarded(_view))()
