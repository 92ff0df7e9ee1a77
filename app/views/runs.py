"""Runs: every run in the database, live; select runs to compare, stop, delete, rename, annotate, export.

The table refreshes in a fragment. Delete and rename open a modal dialog from a
full run; while one is open the table does not refresh (a refresh would close it).
"""

import json
import zlib

import streamlit as st

from app import display, form, state, tables
from storage import ACTIVE_STATUSES, ENDED_STATUSES, RUN_STATUSES, RunNotFoundError, StorageError, long_frame, to_csv_bytes, wide_frame


lab = state.lab()
store = lab.store


def _close_dialog(message: str | None = None) -> None:
    """Close the open dialog and rerun the app (``st.rerun``: does not return);
    ``message`` is shown as a toast after the rerun."""
    state.set_dialog(None)
    if message:
        state.flash(message)
    st.rerun()


@st.dialog("Delete runs", dismissible=False)
def _delete_dialog(ids: list[int]) -> None:
    records = {r.id: r for r in store.list_runs() if r.id in ids}
    st.write(f"Delete {len(records)} run{'s' if len(records) != 1 else ''} and all their metrics? This cannot be undone.")
    st.markdown("\n".join(f"- #{r.id} {r.name} ({r.status})" for r in records.values()))
    c1, c2 = st.columns(2)
    if c1.button("Delete", type="primary", key="runs.delete.confirm"):
        problems = []
        for run_id in records:
            try:
                store.delete_run(run_id)
            except StorageError as e:
                problems.append(str(e))
        state.set_selected([i for i in state.selected() if i not in records])
        state.bump_table_epoch()
        _close_dialog("; ".join(problems) or f"Deleted {len(records)} run(s).")
    if c2.button("Cancel", key="runs.delete.cancel"):
        _close_dialog()


@st.dialog("Rename and annotate", dismissible=False)
def _edit_dialog(run_id: int) -> None:
    try:
        record = store.get_run(run_id)
    except RunNotFoundError:
        _close_dialog(f"Run {run_id} was deleted meanwhile.")
    with st.form("runs.edit"):
        name = st.text_input("Name", value=record.name)
        notes = st.text_area("Notes", value=record.notes, placeholder="What this run is for, what you saw…")
        c1, c2 = st.columns(2)
        save = c1.form_submit_button("Save", type="primary")
        cancel = c2.form_submit_button("Cancel")
    if save:
        try:
            store.rename_run(run_id, name)
            store.set_notes(run_id, notes)
        except (StorageError, ValueError) as e:
            st.error(str(e))
        else:
            _close_dialog(f"Saved #{run_id}.")
    if cancel:
        _close_dialog()


def _actions(view, chosen: list[int]) -> None:
    """The buttons for the ticked rows: compare, stop, delete, rename, details, CSV."""
    rows = view[view["id"].isin(chosen)]
    ids = [int(i) for i in rows["id"]]
    active = [int(i) for i, s in zip(rows["id"], rows["status"]) if s in ACTIVE_STATUSES]
    running = [int(i) for i, s in zip(rows["id"], rows["status"]) if s == "running"]
    n = len(ids)
    st.caption(f"{n} selected" if n else "Tick rows to compare, stop, delete, rename or export them.")
    row = st.container(horizontal=True, vertical_alignment="bottom")
    if row.button("Compare", icon=":material/monitoring:", disabled=not n, type="primary", key="runs.compare"):
        st.switch_page("views/compare.py")
    if row.button("Stop", icon=":material/stop_circle:", disabled=not active, key="runs.stop", help="Cancel the selected queued or running runs."):
        for run_id in active:
            lab.manager.cancel(run_id)
        st.toast(f"Stop requested for {len(active)} run(s).")
    if row.button("Delete…", icon=":material/delete:", disabled=not n, key="runs.delete",
                 help="Running runs must be stopped first."):
        if running:
            st.error(f"Run(s) {', '.join(map(str, running))} are running: stop them first, then delete.")
        else:
            state.set_dialog(("delete", ids))
            st.rerun()
    if row.button("Rename…", icon=":material/edit:", disabled=n != 1, key="runs.edit", help="Rename the run or add notes."):
        state.set_dialog(("edit", ids[0]))
        st.rerun()
    if row.button("Details", icon=":material/description:", disabled=n != 1, key="runs.detail"):
        state.open_detail(ids[0])
        st.switch_page("views/detail.py")
    if n:
        fmt = row.radio("CSV format", ("long", "wide"), horizontal=True, key="runs.csv_format",
                        help="long: one row per metric value. wide: one row per run and step, a column per metric.")
        build = long_frame if fmt == "long" else wide_frame
        row.download_button(
            f"CSV of {n} run{'s' if n != 1 else ''} ({fmt})", icon=":material/download:", key="runs.download",
            data=lambda: to_csv_bytes(build(store, ids)), file_name=f"basis-runs-{fmt}.csv", mime="text/csv",
        )


def _table(has_active: bool) -> None:
    """The live table (a fragment) and its actions; ``has_active``: whether the
    refresh rate was chosen for active runs."""
    frame = store.runs_frame()
    if frame.empty:
        st.info("No runs yet. Launch a sweep from the form, or from a terminal with `python -m engine sweep`.")
        st.page_link("views/launch.py", label="Launch your first sweep", icon=":material/rocket_launch:")
        return
    if (not frame["status"].isin(ENDED_STATUSES).all()) != has_active:
        st.rerun()  # runs started or all ended: redraw with the matching refresh rate
    if message := state.take_flash():
        st.toast(message)
    view = tables.filter_runs(tables.runs_view(frame), text, statuses, estimators)
    counts = frame["status"].value_counts()
    st.caption(" · ".join(f"{counts[s]} {s}" for s in RUN_STATUSES if s in counts) + f" · {len(frame)} in all")
    if view.empty:
        st.info("No run matches the filters.")
        return
    selected = state.selected()
    visible = [int(i) for i in view["id"]]
    event = st.dataframe(
        view.assign(status=view["status"].map(display.status_text)), key=f"runs.table.{filter_id}.{state.table_epoch()}",
        on_select="rerun", selection_mode="multi-row",
        selection_default={"selection": {"rows": [p for p, i in enumerate(visible) if i in selected]}},
        hide_index=True, width="stretch", height=min(38 + 35 * len(view), 600), placeholder="—",
        column_order=["name", "status", "progress", "estimator", "rank", "lam", "seed", "steps_done",
                      "train_loss", "val_loss", "mean_cos", "started", "duration_s", "notes"],
        column_config={
            "name": st.column_config.TextColumn("name", width="medium"),
            "progress": st.column_config.ProgressColumn("progress", min_value=0.0, max_value=1.0, format="percent", width="small"),
            "rank": st.column_config.NumberColumn("rank", format="%d"),
            "lam": st.column_config.NumberColumn("λ", format="%.3g"),
            "steps_done": st.column_config.NumberColumn("steps done", format="%d"),
            "train_loss": st.column_config.NumberColumn("train loss", format="%.4f"),
            "val_loss": st.column_config.NumberColumn("val loss", format="%.4f"),
            "mean_cos": st.column_config.NumberColumn("mean cos", format="%.3f",
                                                      help="Mean cosine of sketched dW to exact dW at the last probe."),
            "started": st.column_config.DatetimeColumn("started (UTC)", format="YYYY-MM-DD HH:mm:ss"),
            "duration_s": st.column_config.NumberColumn("duration (s)", format="%.0f"),
        },
    )
    chosen = [visible[i] for i in event.selection.rows if i < len(visible)]
    state.set_selected(tables.merge_selection(selected, visible, chosen))
    _actions(view, chosen)


st.title("Runs")
runs = store.runs_frame()
f1, f2, f3 = st.columns(3)
text = f1.text_input("Search", placeholder="name or notes", key="runs.search")
statuses = f2.multiselect("Status", RUN_STATUSES, key="runs.status")
estimators = f3.multiselect("Estimator", sorted(set(runs["estimator"].dropna())), key="runs.estimator")
filter_id = zlib.crc32(json.dumps([text, statuses, estimators]).encode())  # a new table (and selection) per filter

dialog = state.dialog()
active_now = not runs["status"].isin(ENDED_STATUSES).all()
every = None if dialog else state.refresh_every(active_now, idle=state.IDLE_REFRESH_S)
st.fragment(run_every=every)(state.guarded(_table))(active_now)
if dialog and dialog[0] == "delete":
    state.guarded(_delete_dialog)(dialog[1])
elif dialog and dialog[0] == "edit":
    state.guarded(_edit_dialog)(dialog[1])
