"""Run detail: one run's status, error, notes, every chart, its config and its environment;
Stop it while active, Resume it when it ended resumable, Clone it to Launch. Its curves
take Compare's x axis, EMA smoothing and log y controls (``app.metric_charts.curve_controls``),
kept in the URL beside ``run`` as Compare keeps them (``x``, ``smooth``, ``log``).

It only reads: runs whose worker died are marked ``interrupted`` by the dashboard's sweep
(``app.state.Lab``), not here. Names, notes and error text are shown as plain text."""

from datetime import datetime

import pandas as pd
import streamlit as st

from app import confirm, form, metric_charts, runfiles, state, tables, viewstate
from app.display import plain, plot, resume_text, status_text
from engine.analysis import charts, frames
from engine.analysis.parallel import shown_config
from engine.analysis.summary import summarize
from engine.config import ConfigError
from engine.core.units import format_seconds
from engine.runner.runlog import LAB
from storage import ACTIVE_STATUSES, RESUMABLE_STATUSES, RunNotFoundError
from storage.logs import INFO

CLAIM_LINE = "claimed by "  # how the log line a claim writes begins (engine.runner.jobs)
CURVES = {"x": "detail.x", "smoothing": "detail.smoothing", "log_y": "detail.log_y"}  # the curve controls' keys
lab = state.lab()
store = lab.store
st.title("Run detail")
records = {r.id: r for r in store.runs.list_runs()}
if not records:
    st.info("No runs yet: launch one, then open it here.")
    st.page_link("views/launch.py", label="Launch a sweep", icon=":material/rocket_launch:")
    st.stop()

wanted = state.take_detail()  # set by the Runs page's Details button
if wanted is None and "detail.pick" not in st.session_state:
    wanted, problem = viewstate.url_id(st.query_params.to_dict(), "run", records)  # a link to ?run=ID
    if problem:
        st.warning(plain(f"The link's {problem}; showing another run."), icon=":material/link_off:")
if wanted is not None and wanted in records:
    st.session_state["detail.pick"] = int(wanted)
elif st.session_state.get("detail.pick") not in records:
    picked = [i for i in state.selected() if i in records]
    st.session_state["detail.pick"] = picked[0] if picked else max(records)
for problem in metric_charts.seed_curve_controls(CURVES):
    st.warning(plain(f"The link's {problem}; shown without it."), icon=":material/link_off:")
pick, *controls = st.columns([2.4, *metric_charts.CONTROL_WIDTHS], vertical_alignment="bottom")  # run, curves
run_id = pick.selectbox("Run", sorted(records, reverse=True), key="detail.pick",
                        format_func=lambda i: f"#{i} {records[i].name}")
st.query_params["run"] = str(run_id)
x, smoothing, log_y = metric_charts.curve_controls(CURVES, state.KEEP, controls)  # applied to every curve below
state.keep_in_url(metric_charts.curve_params(x, smoothing, log_y))


def _heading(run) -> None:
    """The run's name and status, its facts, its reports and (while active) its progress."""
    st.subheader(f"{plain(run.name)}  ·  {status_text(run.status)}")
    facts = [f"#{run.id}", f"sweep {run.sweep_id or '—'}", f"tags {', '.join(run.tags) if run.tags else '—'}",
             f"worker {run.owner or run.worker_id or '—'}",
             f"checkpoint step {run.checkpoint_step:,}" if run.checkpoint_step is not None else "no checkpoint"]
    st.caption(plain("  ·  ".join(facts)))
    for r in store.reports.list_reports(run_id=run.id)[:3]:
        st.page_link("views/report.py", label=plain(f"Report: {r.title}"), icon=":material/summarize:",
                     query_params={"id": str(r.id)})
    if run.sweep_id and not store.reports.list_reports(sweep_id=run.sweep_id):
        st.page_link("views/report.py", label="Build a report of its sweep", icon=":material/add_chart:",
                     query_params={"sweep": run.sweep_id})
    if run.status in ACTIVE_STATUSES:
        steps = max(run.steps or 1, 1)
        st.progress(min(run.steps_done / steps, 1.0), text=f"step {run.steps_done:,} of {steps:,}")


def _buttons(run) -> None:
    """Stop (while active), Resume (when it ended resumable) and Clone to Launch."""
    buttons = st.container(horizontal=True)
    if run.status in ACTIVE_STATUSES and buttons.button("Stop this run…", icon=":material/stop_circle:", key="detail.stop",
                                                        help="Cancel this run (asks first, naming it)."):
        state.set_dialog(("stop", [run.id]))
        st.rerun()
    if run.status in RESUMABLE_STATUSES and buttons.button(
            "Resume", icon=":material/play_arrow:", key="detail.resume", type="primary",
            help="Continue this run under its own id from its last checkpoint (from step 0 when it has none)."):
        state.flash(resume_text({run.id: run.checkpoint_step}, lab.manager.resume([run.id])))
        st.rerun()  # redraw with the refresh rate of an active run
    if buttons.button("Clone to Launch", icon=":material/content_copy:", key="detail.clone",
                      help="Fill the Launch form with this run's settings."):
        try:
            state.clone_to_launch(form.clone_sweep([run.config]))
        except (ConfigError, ValueError) as e:
            st.error(plain(f"This run cannot be cloned: {e}"))
        else:
            st.switch_page("views/launch.py")


def _numbers(run, row) -> None:
    """The run's headline figures, then its error and its notes, as plain text."""
    m = st.container(horizontal=True, gap="large")  # each figure as wide as it needs ("5 min 03 s" was cut), wrapping when narrow
    m.metric(f"steps done (of {run.steps:,})" if run.steps else "steps done", f"{run.steps_done:,}", width="content")
    m.metric("val loss", f"{row.val_loss:.4f}" if pd.notna(row.val_loss) else "—", width="content")
    m.metric("train loss", f"{row.train_loss:.4f}" if pd.notna(row.train_loss) else "—", width="content")
    m.metric("mean cos", f"{row.cos_mean:.3f}" if pd.notna(row.cos_mean) else "—", width="content")
    m.metric("tokens/s", f"{row.tokens_per_s:,.0f}" if pd.notna(row.tokens_per_s) else "—", width="content")
    m.metric("wall time", format_seconds(row.wall_s), width="content")
    if run.status == "interrupted" and run.steps_done == 0 and run.checkpoint_step is None \
            and run.interruption_cause in (None, "signal", "stale"):  # not an error: nothing was trained yet
        st.warning(plain(f"This run was interrupted before its first step {tables.cause_text(run.interruption_cause, one=True)}: "
                         "nothing was trained and nothing is lost; Resume trains it from step 0."),
                   icon=":material/restart_alt:")
    elif run.error:
        first = run.error.splitlines()[0].removeprefix(f"{run.status}: ")  # "interrupted: interrupted: …" once
        st.error(plain(f"This run {run.status}: {first}"))
        if len(run.error.splitlines()) > 1:
            with st.expander("Full error text"):
                st.code(run.error, language="text")
    if run.notes:
        st.info(plain(run.notes), icon=":material/edit_note:")


def _charts(metrics, info, summary) -> None:
    """Losses, the per-layer dW probes, throughput, memory, its breakdown and the system
    metrics; every curve on the chosen x axis and smoothing, the losses, errors, throughput
    and system metrics on the chosen y scale (the cosine keeps a linear one, as on Compare)."""
    def curve(name: str):
        return frames.series(metrics, info, name, x=x, smoothing=smoothing, pool_seeds=False)

    left, right = st.columns(2)
    with left:
        plot(charts.line_figure(curve("val_loss"), x=x, y_title="validation loss (nats/token)", title="Validation loss",
                                log_y=log_y), "d.val")
    with right:
        plot(charts.line_figure(curve("train_loss"), x=x, y_title="train loss (nats/token)",
                                title="Train loss (mean since last eval)", log_y=log_y), "d.train")
    layers = frames.layer_names(metrics)
    if layers:
        panels = {layer: curve(f"cos/{layer}") for layer in layers}
        plot(charts.panels_figure(panels, x=x, y_title="cosine", title="Cosine of sketched dW to exact dW, per layer"),
             "d.cos")
        panels = {layer: curve(f"rel_err/{layer}") for layer in layers}
        plot(charts.panels_figure(panels, x=x, y_title="‖dŴ − dW‖ / ‖dW‖", title="Relative error of sketched dW, per layer",
                                  log_y=log_y), "d.rel")
    elif not info["method"].eq("exact").all():
        st.caption("No dW probe yet (probes run every probe interval).")
    left, right = st.columns(2)
    with left:
        plot(charts.line_figure(curve("tokens_per_s"), x=x, y_title="throughput (tokens/s)", title="Training throughput",
                                log_y=log_y), "d.tps")
    with right:
        mem = frames.memory_frame(summary, info, pool_seeds=False)
        plot(charts.memory_figure(mem, title="Activation memory per device, against exact backprop"), "d.mem")
    breakdown = frames.breakdown_frame(metrics, info, pool_seeds=False)
    if not breakdown.empty:
        plot(charts.breakdown_figure(breakdown, title="Saved for backward, by category"), "d.breakdown")
    metric_charts.system_section(metrics, info, x=x, smoothing=smoothing, log_y=log_y)


def _view() -> None:
    """The run's status, numbers and charts; a live fragment while it is active."""
    try:
        run = store.runs.get_run(run_id)
    except RunNotFoundError:
        st.info("This run was deleted.")
        return
    if (run.status in ACTIVE_STATUSES) != active:
        st.rerun()  # the run started or ended: redraw with the matching refresh rate
    if message := state.take_flash():
        st.toast(plain(message))
    info = frames.describe_runs([run])
    metrics = state.metrics(store, [run_id])
    summary = summarize([run], metrics)
    _heading(run)
    _buttons(run)
    _numbers(run, summary.iloc[0])
    _charts(metrics, info, summary)


def first_start(run) -> datetime | None:
    """When the run first started training. The store keeps only the latest start
    (``started_at``: a resume sets it anew), so: the time of the first claim line its log
    holds (``claimed by …``, written by the lab each time a process takes the run, its first
    training and each resume), else, for a run never claimed again (lease epoch 1 or less),
    ``started_at``; else None."""
    claims = [line for line in store.logs.run_logs(run.id, levels=[INFO], search=CLAIM_LINE)
              if line.source == LAB and line.text.startswith(CLAIM_LINE)]
    if claims:
        return min(line.time for line in claims)
    return run.started_at if run.epoch <= 1 else None


def last_resumed(run, first: datetime | None) -> datetime | None:
    """``started_at`` when it is a resume: later than the first start (by more than a second)."""
    if run.started_at is None or first is None:
        return None
    return run.started_at if (run.started_at - first).total_seconds() > 1 else None


active = records[run_id].status in ACTIVE_STATUSES
dialog = state.dialog()
st.fragment(run_every=None if dialog else state.refresh_every(active))(state.guarded(_view))()
if dialog and dialog[0] == "stop":
    state.guarded(confirm.stop_dialog)(dialog[1])

run = records[run_id]
runfiles.tags_editor(store, run, [t for r in records.values() for t in r.tags or []])
runfiles.log_section(store, run_id, active and not dialog)
runfiles.checkpoints_section(store, run)
left, right = st.columns(2)
with left:
    st.subheader("Config")
    st.dataframe(pd.DataFrame(shown_config(run.config), columns=["field", "value"]), hide_index=True, width="stretch")
with right:
    st.subheader("Environment")
    count, kind = tables.device_parts(run.device)
    first = first_start(run)
    env = {"device": kind, "devices": count, "git commit": run.git_commit, "worker": run.owner,
           "created (UTC)": run.created_at, "first started (UTC)": first or ("— (not started yet)" if run.started_at is None else "— (not recorded)"),
           "last resumed (UTC)": last_resumed(run, first) or "— (never resumed)", "finished (UTC)": run.finished_at}
    env.update({f"{name} version": v for name, v in run.versions.items()})
    shown = ["—" if v is None else v.strftime("%Y-%m-%d %H:%M:%S") if isinstance(v, datetime) else str(v) for v in env.values()]
    st.dataframe(pd.DataFrame({"item": list(env), "value": shown}),
                 hide_index=True, width="stretch")
