"""Compare: live loss, gradient-cosine and memory charts, the paper's central figure (a
quantity against the rank R at one step) and its Table 3 for the selected runs."""

import streamlit as st

from app import charts, frames, state
from app.display import plain, plot
from engine.analysis.summary import display_frame, render, summarize, table3
from engine.config import comparable_key
from storage import ACTIVE_STATUSES

lab = state.lab()
store = lab.store
st.title("Compare")
records = {r.id: r for r in store.list_runs()}
if not records:
    st.info("No runs yet: launch a sweep, then compare its runs here while they train.")
    st.page_link("views/launch.py", label="Launch a sweep", icon=":material/rocket_launch:")
    st.stop()

if "compare.pick" in st.session_state:  # the picker is on the page: it holds the selection
    picked = [i for i in st.session_state["compare.pick"] if i in records]  # less runs deleted meanwhile
    st.session_state["compare.pick"] = picked
    state.set_selected(picked)
    default = None
else:
    default = [i for i in state.selected() if i in records]
    if not default:  # nothing selected yet: the latest sweep, the runs comparable to the newest
        newest = comparable_key(records[max(records)].config)
        default = [i for i in sorted(records) if comparable_key(records[i].config) == newest][-12:]
        st.caption("Nothing selected: showing the latest sweep. Pick runs below or on the Runs page.")
    state.set_selected(default)

st.multiselect(
    "Runs", options=sorted(records, reverse=True), default=default, key="compare.pick",
    format_func=lambda i: f"#{i} {records[i].name}",
    on_change=lambda: state.set_selected(st.session_state["compare.pick"]),
)
ids = state.selected()
if not ids:
    st.info("Pick one or more runs above (or tick them on the Runs page).")
    st.stop()

c1, c2, c3, c4 = st.columns([1.2, 2, 1, 1])
x = c1.radio("x axis", ("step", "wall_time"), horizontal=True, key="compare.x",
             format_func=lambda v: {"step": "step", "wall_time": "wall time"}[v])
smoothing = c2.slider("EMA smoothing", 0.0, 0.99, 0.0, 0.01, key="compare.smoothing",
                      help="Weight w of the debiased exponential moving average: m = w·m + (1 − w)·value.")
log_y = c3.toggle("log y", key="compare.log_y")
pool = c4.toggle("pool seeds", value=True, key="compare.pool",
                 help="Runs that differ only by seed become one curve: the mean with a ± std band.")


def _status_line(runs: dict) -> None:
    """Counts by status, and a progress bar per queued or running run."""
    counts = {}
    for run in runs.values():
        counts[run.status] = counts.get(run.status, 0) + 1
    st.caption(" · ".join(f"{n} {s}" for s, n in counts.items()))
    for run in (r for r in runs.values() if r.status in ACTIVE_STATUSES):
        steps = max(run.steps or 1, 1)
        st.progress(min(run.steps_done / steps, 1.0), text=plain(f"#{run.id} {run.name}: {run.status}, step {run.steps_done:,} of {steps:,}"))


def _view() -> None:
    """Everything below the controls; a live fragment when runs are active."""
    records_now = {r.id: r for r in store.list_runs() if r.id in ids}
    if not records_now:
        st.info("The selected runs were deleted.")
        return
    info = frames.describe_runs(list(records_now.values()))
    metrics = state.metrics(store, list(records_now))
    _status_line(records_now)
    if (~info["status"].isin(ACTIVE_STATUSES)).all() != all_ended:
        st.rerun()  # all runs ended (or one started): redraw with the matching refresh rate

    st.subheader("Loss")
    left, right = st.columns(2)
    with left:
        s = frames.series(metrics, info, "val_loss", x=x, smoothing=smoothing, pool_seeds=pool)
        plot(charts.line_figure(s, x=x, y_title="validation loss (nats/token)", title="Validation loss", log_y=log_y,
                                  height=460), "val")
    with right:
        s = frames.series(metrics, info, "train_loss", x=x, smoothing=smoothing, pool_seeds=pool)
        plot(charts.line_figure(s, x=x, y_title="train loss (nats/token)", title="Train loss (mean since last eval)",
                                  log_y=log_y, height=460), "train")

    st.subheader("Gradient quality: cosine of sketched dW to exact dW")
    layers = frames.layer_names(metrics)
    if not layers:
        st.info("Cosines are probed every probe interval (exact runs too: theirs is the reference 1.0); "
                "none of the selected runs has one yet.")
    else:
        per_layer = st.toggle("per layer", key="compare.per_layer",
                              help="Probed every probe interval on a fixed batch; exact runs are probed too, as the reference 1.0.")
        if per_layer:
            panels = {layer: frames.series(metrics, info, f"cos/{layer}", x=x, smoothing=smoothing, pool_seeds=pool)
                      for layer in layers}
            plot(charts.panels_figure(panels, x=x, y_title="cosine", title="Cosine per sketched layer"), "cos_layers")
        else:
            s = frames.series(metrics, info, "cos_mean", x=x, smoothing=smoothing, pool_seeds=pool)
            plot(charts.line_figure(s, x=x, y_title="cosine (mean over sketched layers)",
                                    title="Mean cosine over sketched layers"), "cos")

    st.subheader("Memory")
    summary_end = summarize(records_now.values(), metrics)
    mem = frames.memory_frame(summary_end, info, pool_seeds=pool)
    if mem.empty:
        st.info("Memory figures are recorded at step 0 of each run; none yet.")
    else:
        plot(charts.memory_figure(mem, title="Activation memory per train step, against exact backprop of the same config"), "memory")
        notes = ["**Saved for backward**: residual bytes a train step keeps for its backward pass (parameters excluded).",
                 "The number on each bar is run ÷ exact (below 1: the run keeps less)."]
        if "Peak device memory" not in set(mem["quantity"]):
            notes.append("**Peak device memory** is recorded at the end of GPU runs only.")
        st.caption(" ".join(notes))
    breakdown = frames.breakdown_frame(metrics, info, pool_seeds=pool)
    if not breakdown.empty:
        plot(charts.breakdown_figure(breakdown, title="Saved for backward, by category"), "breakdown")

    st.subheader("Against the rank R at one step (the paper's central figure)")
    steps = sorted(set(metrics.loc[metrics["name"] == "val_loss", "step"]))
    if not steps:
        st.info("This figure and the summary appear after the first validation (step 0).")
        return
    choices = ["common", *steps]
    if st.session_state.get("compare.at", "common") not in choices:
        del st.session_state["compare.at"]  # its step belongs to runs no longer selected
    c1, c2 = st.columns([3, 2])
    at = c1.select_slider(
        "at step", options=choices, value="common", key="compare.at",
        format_func=lambda v: "latest common step" if v == "common" else f"{v:,}",
        help="Seeds are compared at one step only, in this figure and in the summary below: by default the "
             "latest step every run of a setup has validated at; a run that has not reached the chosen step "
             "counts as a missing seed.")
    at_step = None if at == "common" else at
    quantity = c2.radio("quantity", list(frames.RANK_QUANTITIES), horizontal=True, key="compare.rank_quantity",
                        format_func=lambda q: frames.RANK_QUANTITIES[q][0])
    name, y_title, _ = frames.RANK_QUANTITIES[quantity]
    by_rank = frames.rank_frame(records_now.values(), metrics, quantity, at_step)
    plot(charts.rank_figure(by_rank, y_title=y_title, title=f"{name.capitalize()} against rank R"), "by_rank")
    st.caption("One line per estimator (and λ); each point the mean over seeds at the step, its error bar ± one "
               "std over seeds (none for one seed); exact backprop is the horizontal band, mean ± std.")

    st.subheader("Summary (the paper's Table 3 form)")
    table = table3(records_now.values(), metrics, at_step=at_step)
    shown = display_frame(table)
    widths = {"method": 95, "rank": 50, "λ": 50, "seeds": 55, "step": 60, "val loss": 130, "Δ val vs exact": 105,
              "95% CI": 150, "verdict": 95, "train loss": 130, "cos": 55, "saved MiB": 80, "saved ÷ exact": 100}
    st.dataframe(shown, hide_index=True, width="stretch", placeholder="—",
                 column_config={c: st.column_config.Column(width=w) for c, w in widths.items() if c in shown})
    notes = ["Δ val vs exact: the mean over seeds of the paired difference to the exact run of the same seed "
             "(same initial parameters and batches), with its 95 % t-interval; better / worse when the interval "
             "excludes 0, else within noise; one seed has no interval.",
             "saved ÷ exact: bytes kept for the backward pass, this method ÷ exact backprop of the same config."]
    if "paper val" in shown:
        notes.append("Paper val: the paper's Table 3, after 50,000 steps.")
    st.caption(" ".join(notes))
    d1, d2, d3 = st.columns(3)
    for column, fmt, ext, mime in ((d1, "markdown", "md", "text/markdown"), (d2, "latex", "tex", "text/x-tex"),
                                   (d3, "csv", "csv", "text/csv")):
        column.download_button(f"Table 3 as {fmt}", data=render(table, fmt), file_name=f"basis-table3.{ext}",
                               mime=mime, icon=":material/download:", key=f"compare.table3.{fmt}")


all_ended = all(records[i].status not in ACTIVE_STATUSES for i in ids)
st.fragment(run_every=state.refresh_every(not all_ended))(state.guarded(_view))()
