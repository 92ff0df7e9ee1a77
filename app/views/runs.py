"""Runs: every run in the database, live; select runs to compare, resume, clone, stop,
delete, rename, annotate, export; a scatter of any final metric against any field over the
runs the filters show (``app.scatter``); and the workers that train them.

The table refreshes in a fragment; it only reads (runs whose worker died are marked
``interrupted`` by the dashboard's sweep, ``app.state.Lab``, not by a render). Delete and rename open a modal dialog from a
full run; while one is open the table does not refresh (a refresh would close it).
A refused action's error is kept in session state and drawn outside the fragment,
so a refresh does not wipe it; it stays until dismissed or the next action.
Names, notes and error text are user text: shown as plain text, never as markdown.
"""

import json
import zlib

import streamlit as st

from app import confirm, display, form, scatter, slurm_panel, state, tables, viewstate
from engine.analysis import progress
from engine.analysis.where import EXAMPLE, WhereError
from engine.config import ConfigError, shape_columns
from engine.reads.queries import where_ids
from engine.runner import liveness
from engine.runner.tags import change_tags
from engine.runner.tensorboard import tensorboard_zip
from storage import (
    ACTIVE_STATUSES,
    CSV_COLUMNS,
    ENDED_STATUSES,
    RESUMABLE_STATUSES,
    RUN_STATUSES,
    RunNotFoundError,
    StorageError,
)
from storage.backup import backup_bytes, pg_dump_path
from storage.export import export_bytes
from storage.limits import NAME_MAX, NOTES_MAX

lab = state.lab()
store = lab.store
_LAST_TABLE = "runs.table.last"
_EDIT_SHOWN = "runs.edit.shown_tags."  # + run id: the tags the open edit dialog showed
GRID_TOOLBAR_CLEARANCE_PX = 30  # the toolbar (44 px) less the gap between elements (16 px), and a margin
CSV_HELP = "Columns:  \n" + "  \n".join(f"**{display.plain(c)}**: {display.plain(t)}" for c, t in CSV_COLUMNS.items())  # (widget key, the run ids of its rows) of the table drawn last


def _refuse(message: str) -> None:
    """Keep ``message`` on the page (outside the live table) and redraw it."""
    state.set_runs_error(message)
    st.rerun()


@st.dialog("Rename, tag and annotate", dismissible=False)
def _edit_dialog(run_id: int) -> None:
    try:
        record = store.runs.get_run(run_id)
    except RunNotFoundError:
        confirm.close(f"Run {run_id} was deleted meanwhile.")
    shown = st.session_state.setdefault(f"{_EDIT_SHOWN}{run_id}", ", ".join(record.tags or []))
    with st.form("runs.edit"):
        name = st.text_input("Name", value=record.name, max_chars=NAME_MAX)
        notes = st.text_area("Notes", value=record.notes, placeholder="What this run is for, what you saw…",
                             max_chars=NOTES_MAX)
        tags = st.text_input("Tags", value=shown, placeholder="pilot, ablation",
                             help="A comma list; `python -m engine tag` edits them too.")
        c1, c2 = st.columns(2)
        save = c1.form_submit_button("Save", type="primary")
        cancel = c2.form_submit_button("Cancel")
    if save:
        try:
            change_tags(store, run_id, shown, tags)  # first: a refused tag leaves name and notes unsaved too
            store.runs.rename_run(run_id, name)
            store.runs.set_notes(run_id, notes)
        except (StorageError, ValueError) as e:
            st.error(display.plain(e))
        else:
            confirm.close(f"Saved #{run_id}.")
    if cancel:
        confirm.close()


def resume(run_ids: list[int]) -> str:
    """Resume ``run_ids`` in this dashboard's job manager; says which run continues
    from which checkpoint step (or from step 0)."""
    steps = {r.id: r.checkpoint_step for r in store.runs.list_runs() if r.id in set(run_ids)}
    return display.resume_text(steps, lab.manager.resume(run_ids))


def _buttons(row, n: int, resumable: list[int], active: list[int]) -> dict[str, bool]:
    """The action buttons in ``row`` for ``n`` ticked rows; which of them was clicked."""
    return {
        "compare": row.button("Compare", icon=":material/monitoring:", disabled=not n, type="primary", key="runs.compare"),
        "resume": row.button("Resume", icon=":material/play_arrow:", disabled=not resumable, key="runs.resume",
                             help="Continue the selected interrupted, cancelled or failed runs from their last checkpoint."),
        "clone": row.button("Clone to Launch", icon=":material/content_copy:", disabled=not n, key="runs.clone",
                            help="Fill the Launch form with the settings of the selected runs."),
        "stop": row.button("Stop…", icon=":material/stop_circle:", disabled=not active, key="runs.stop",
                           help="Cancel the selected queued or running runs (asks first, naming them)."),
        "delete": row.button("Delete…", icon=":material/delete:", disabled=not n, key="runs.delete",
                             help="Deletes runs, metrics and checkpoints (asks first, naming them). Running runs must be stopped first."),
        "edit": row.button("Rename…", icon=":material/edit:", disabled=n != 1, key="runs.edit",
                           help="Rename the run, edit its tags or add notes."),
        "detail": row.button("Details", icon=":material/description:", disabled=n != 1, key="runs.detail"),
    }


def _act(clicked: dict[str, bool], ids: list[int], active: list[int], running: list[int],
         resumable: list[int]) -> None:
    """Do what the clicked button asks: open a page, resume, or open a dialog."""
    if any(clicked.values()):
        state.set_runs_error(None)  # acting again clears a standing error
    if clicked["compare"]:
        st.switch_page("views/compare.py")
    if clicked["resume"]:
        state.flash(resume(resumable))
        st.rerun()
    if clicked["clone"]:
        try:
            sweep = form.clone_sweep([store.runs.get_run(i).config for i in sorted(ids)])  # in launch order
        except (ConfigError, ValueError) as e:
            _refuse(f"These runs cannot be cloned: {e}")
        state.clone_to_launch(sweep)
        st.switch_page("views/launch.py")
    if clicked["stop"]:
        state.set_dialog(("stop", active))
        st.rerun()
    if clicked["delete"]:
        if running:
            _refuse(f"Run(s) {', '.join(map(str, running))} are running: stop them first, then delete.")
        state.set_dialog(("delete", ids))
        st.rerun()
    if clicked["edit"]:
        st.session_state.pop(f"{_EDIT_SHOWN}{ids[0]}", None)  # the dialog shows the tags stored now
        state.set_dialog(("edit", ids[0]))
        st.rerun()
    if clicked["detail"]:
        state.open_detail(ids[0])
        st.switch_page("views/detail.py")


def _csv_download(row, ids: list[int]) -> None:
    """The CSV of the ticked runs, long (a row per value) or wide (a row per run and step):
    built only on click, streamed a chunk of metric rows at a time through a temporary
    file (``storage.export.export_bytes``), so the server holds the file's bytes (Streamlit
    serves a download from memory), never the table behind it. Beside it, the same runs as
    TensorBoard event folders in a zip (``engine.runner.tensorboard.tensorboard_zip``), built
    on click the same way."""
    n = len(ids)
    fmt = row.radio("CSV format", ("long", "wide"), horizontal=True, key="runs.csv_format",
                    help="long: one row per metric value. wide: one row per run and step, a column per metric.")
    row.download_button(
        f"CSV of {n} run{'s' if n != 1 else ''} ({fmt})", icon=":material/download:", key="runs.download",
        data=lambda: export_bytes(store, ids, fmt, shape_columns), file_name=f"basis-runs-{fmt}.csv",
        mime="text/csv", help=CSV_HELP,
    )
    row.download_button(
        "TensorBoard (zip)", icon=":material/download:", key="runs.download_tensorboard",
        data=lambda: tensorboard_zip(store, ids), file_name="basis-runs-tensorboard.zip", mime="application/zip",
        help="The ticked runs as TensorBoard event files, a folder per run with its config and method in the HParams "
             "view (the same as `python -m engine export --format tensorboard DIR`): unzip, then run `tensorboard "
             "--logdir basis-runs-tensorboard`.",
    )


def _actions(view, chosen: list[int]) -> None:
    """The buttons for the ticked rows: compare, resume, clone, stop, delete, rename, details, CSV."""
    rows = view[view["id"].isin(chosen)]
    ids = [int(i) for i in rows["id"]]
    active = [int(i) for i, s in zip(rows["id"], rows["status"]) if s in ACTIVE_STATUSES]
    running = [int(i) for i, s in zip(rows["id"], rows["status"]) if s == "running"]
    resumable = [int(i) for i, s in zip(rows["id"], rows["status"]) if s in RESUMABLE_STATUSES]
    n = len(ids)
    st.caption(f"{n} selected" if n else "Tick rows to compare, resume, clone, stop, delete, rename or export them.")
    row = st.container(horizontal=True, vertical_alignment="bottom")
    _act(_buttons(row, n, resumable, active), ids, active, running, resumable)
    if n:
        _csv_download(row, ids)


def _resume_all(frame) -> None:
    """Resume every interrupted run and train every orphaned queued run here."""
    interrupted = [int(i) for i in frame.loc[frame["status"] == "interrupted", "id"]]
    orphans = frame[(frame["status"] == "queued") & frame["owner"].isna()]
    if not st.button("Resume all", icon=":material/resume:", key="runs.resume_all", disabled=not (interrupted or len(orphans)),
                     help="Continue every interrupted run from its last checkpoint, and train here every queued run "
                          "whose queuing process is gone."):
        return
    state.set_runs_error(None)
    text = resume(interrupted) if interrupted else ""
    adopted = lab.manager.adopt_orphans()
    if adopted:
        text += f" Training {len(adopted)} orphaned queued run(s) here: {', '.join(f'#{i}' for i in adopted)}."
    state.flash(text.strip() or "Nothing to resume.")
    st.rerun()


def _backup() -> None:
    """A download of a consistent copy of the whole database (``storage.backup``)."""
    sqlite = store.engine.url.get_backend_name() == "sqlite"
    missing = not sqlite and pg_dump_path() is None
    st.download_button(
        "Back up the database", icon=":material/backup:", key="runs.backup", disabled=missing,
        data=lambda: backup_bytes(store)[0], file_name="basis-lab-backup.db" if sqlite else "basis-lab-backup.dump",
        mime="application/octet-stream",
        help="A consistent copy of every run, metric, worker and diagnosis, taken while runs keep training "
             "(the same as `python -m engine backup OUT`). " + (
                 "A SQLite file: open it with `--db`." if sqlite else "A pg_dump archive: restore it with pg_restore.")
             + (" Needs pg_dump: install the PostgreSQL client tools on this machine." if missing else ""),
    )


def _workers() -> None:
    """The workers registered in the database: active, stopped, or gone (silent too long)."""
    workers = tables.workers_view(liveness.worker_states(store.frames.workers_frame()))
    counts = workers["state"].value_counts()
    label = "Workers · " + (", ".join(f"{counts[s]} {s}" for s in ("active", "gone", "stopped") if s in counts) or "none")
    with st.expander(label, key="runs.workers", icon=":material/dns:"):
        if workers.empty:
            st.caption("No worker has registered yet: this dashboard registers one when it starts training, "
                       "and so does each `python -m engine worker`.")
            slurm_panel.section(store)
            return
        st.dataframe(
            workers.assign(state=workers["state"].map(display.worker_state_text)), hide_index=True, width="stretch",
            placeholder="—", key="runs.workers.table",
            column_config={
                "id": st.column_config.TextColumn("worker", width=220),
                "state": st.column_config.TextColumn("state", width=90),
                "pid": st.column_config.NumberColumn("pid", format="%d"),
                "current_run": st.column_config.NumberColumn("training run", format="%d"),
                "heartbeat_age_s": st.column_config.NumberColumn(
                    "last heartbeat (s ago)", format="%.0f",
                    help=f"A worker silent for more than {liveness.STALE_AFTER_S:.0f} s, or whose process is gone, is shown as gone."),
            },
        )
        slurm_panel.section(store)


def _filters(runs) -> tuple[str, str, list, list, list, list]:
    """The filter box (``engine.analysis.where``: any run or config field or metric) and the
    Search, Status, Estimator, Sweep and Tag filters, each kept in the URL
    (``viewstate.RUNS_PARAMS``), so a link opens the table as its sender filtered it; a value the
    link holds that matches nothing is named in one line and dropped. Returns (filter text,
    search, statuses, estimators, sweeps, tags)."""
    choices = {"status": RUN_STATUSES, "estimator": sorted(set(runs["estimator"].dropna())),
               "sweep": tables.sweeps_of(runs), "tag": tables.tags_of(runs)}
    for problem in state.seed_from_url(viewstate.RUNS_PARAMS, choices):
        st.warning(display.plain(f"The link's {problem}; shown without it."), icon=":material/link_off:")
    where = st.text_input("Filter", key="runs.where", placeholder=EXAMPLE,
                          help="Any run field (status, name, estimator, rank, lam, seed, steps, sweep, tags…), config "
                               "field or metric (its final value), with and, or, not, ( ), ==, !=, <, <=, >, >=, "
                               "contains and in [..]; text quoted or as bare words.").strip()
    f1, f2, f3, f4, f5 = st.columns([3, 2, 2, 2, 2])
    shown = (where, f1.text_input("Search", placeholder="name or notes", key="runs.search"),
             f2.multiselect("Status", RUN_STATUSES, key="runs.status"),
             f3.multiselect("Estimator", choices["estimator"], key="runs.estimator"),
             f4.multiselect("Sweep", choices["sweep"], key="runs.sweep"),
             f5.multiselect("Tag", choices["tag"], key="runs.tag"))
    state.keep_in_url({p.name: st.session_state.get(p.key) for p in viewstate.RUNS_PARAMS})
    return shown


def _where_filter(view, text: str):
    """``view``'s rows that the filter ``text`` matches; a bad filter shows its one-line
    error and leaves the rows as they are."""
    if not text:
        return view
    try:
        keep = where_ids(store, text)
    except WhereError as e:
        st.error(f"Filter not applied: {display.plain(e)}", icon=":material/filter_alt_off:")
        return view
    return view[view["id"].isin(keep)].reset_index(drop=True)


def _eta() -> str:
    """The time left for every queued and running run, from the running runs' step rates
    (``engine.analysis.progress``, as on Compare)."""
    active = store.runs.list_runs(statuses=ACTIVE_STATUSES)
    running = [r.id for r in active if r.status == "running"]
    return progress.progress(active, store.metrics(running, names=["val_loss"])).eta_text()


def _columns(view) -> dict:
    """The grid's column headings, widths, formats and help (widths fit ``view``'s text)."""
    return {
        "id": st.column_config.NumberColumn("id", format="%d", width=36, pinned=True),
        "name": st.column_config.TextColumn("name", width=110, pinned=True),
        "sweep": st.column_config.TextColumn("sweep", width=tables.text_width(view["sweep"]),
                                             help="The launch the run belongs to (its sweep id)."),
        "tags": st.column_config.ListColumn("tags", width=tables.tags_width(view["tags"])),
        "status": st.column_config.TextColumn("status", width=92, pinned=True,
                                              help=f"{tables.NOT_STARTED}: interrupted before its first step (nothing "
                                                   "trained, nothing lost); Resume trains it from step 0."),
        "progress": st.column_config.ProgressColumn("progress", min_value=0.0, max_value=1.0, format="percent", width=84,
                                                    pinned=True),
        "estimator": st.column_config.TextColumn("estimator", width=65),
        "rank": st.column_config.NumberColumn("R", format="%d", width=36),
        "lam": st.column_config.NumberColumn("λ", format="%.3g", width=40),
        "seed": st.column_config.NumberColumn("seed", format="%d", width=40),
        "steps_text": st.column_config.TextColumn("steps", width=tables.text_width(view["steps_text"], low=64, high=140),
                                                  help="Steps done / steps."),
        "devices": st.column_config.NumberColumn("devices", format="%d", width=50,
                                                 help="Devices the run spans (its batch split across them)."),
        "device": st.column_config.TextColumn("device", width=90, help="The kind of device that trains the run."),
        "worker": st.column_config.TextColumn("worker", width=85, help="The process (host:pid) that trains or queued the run."),
        "train_loss": st.column_config.NumberColumn("train", format="%.3f", width=50, help="Train loss (mean since the last eval)."),
        "val_loss": st.column_config.NumberColumn("val", format="%.3f", width=50, help="Last validation loss."),
        "mean_cos": st.column_config.NumberColumn("cos", format="%.3f", width=50,
                                                  help="Mean cosine of sketched dW to exact dW at the last probe."),
        "started": st.column_config.DatetimeColumn("started (UTC)", format="MM-DD HH:mm", width=85,
                                                   help="When its latest training began (a resume starts it anew); "
                                                        "Run detail shows the first start too."),
        "duration_s": st.column_config.NumberColumn("time (s)", format="%.0f", width=55, help="Duration in seconds."),
        "notes": st.column_config.TextColumn("notes", width=tables.text_width(view["notes"], high=170)),
    }


def _grid(view) -> list[int]:
    """The runs grid of ``view``; its ticks are kept as run ids in the selection. Returns
    the ids of the rows ticked now."""
    visible = [int(i) for i in view["id"]]
    # The grid selects row positions; the selection is kept as run ids. A table whose
    # rows changed (a run left the filter, another started) is a new widget whose
    # ticks are drawn from the ids, so a tick never moves to the run now in its row.
    key = tables.table_key(f"runs.table.{filter_id}.{state.table_epoch()}", visible)
    last = st.session_state.get(_LAST_TABLE)
    if last and last[0] != key and last[0] in st.session_state:  # a tick on the table drawn before
        rows = st.session_state[last[0]]["selection"]["rows"]
        state.set_selected(tables.merge_selection(state.selected(), last[1], tables.ids_at(last[1], rows)))
    st.session_state[_LAST_TABLE] = (key, visible)
    selected = state.selected()
    event = st.dataframe(
        view.assign(status=view["status"].map(display.status_text).where(~tables.never_started(view), tables.NOT_STARTED)),
        key=key,
        on_select="rerun", selection_mode="multi-row",
        selection_default={"selection": {"rows": [p for p, i in enumerate(visible) if i in selected]}},
        hide_index=True, width="stretch", height=min(38 + 35 * len(view), 600), placeholder="—",
        # id, name, status and progress are pinned: a 420 px phone keeps them while the
        # rest scrolls; notes, sweep and tags follow, wide enough for a whole sweep id and
        # the longest tag list; the columns the name mostly repeats (estimator, R, λ, seed)
        # and the times scroll in from the right
        column_order=["id", "name", "status", "progress", "notes", "sweep", "tags", "steps_text", "train_loss", "val_loss",
                      "mean_cos", "estimator", "rank", "lam", "seed", "devices", "device", "worker", "started",
                      "duration_s"],
        column_config=_columns(view),
    )
    chosen = tables.ids_at(visible, event.selection.rows)
    state.set_selected(tables.merge_selection(selected, visible, chosen))
    return chosen


def _table(has_active: bool) -> None:
    """The live table (a fragment), its actions and the workers; ``has_active``:
    whether the refresh rate was chosen for active runs."""
    frame = store.frames.runs_frame()
    if frame.empty:
        st.info("No runs yet. Launch a sweep from the form, or from a terminal with `python -m engine sweep`.")
        st.page_link("views/launch.py", label="Launch your first sweep", icon=":material/rocket_launch:")
        _workers()
        return
    if (not frame["status"].isin(ENDED_STATUSES).all()) != has_active:
        st.rerun()  # runs started or all ended: redraw with the matching refresh rate
    if message := state.take_flash():
        st.toast(display.plain(message))
    view = _where_filter(tables.filter_runs(tables.runs_view(frame), text, statuses, estimators, sweeps, tags), where)
    notice = tables.interrupted_text(frame)
    if notice:  # said where it is seen, with the button that resumes them beside it
        box = st.container(horizontal=True, vertical_alignment="center")
        box.warning(display.plain(notice), icon=":material/restart_alt:", width="stretch")
        with box:
            _resume_all(frame)
    head = st.container(horizontal=True, vertical_alignment="center")
    head.caption(tables.count_text(view, len(frame)) + (f" — for the queued and running runs, {_eta()}" if has_active else ""))
    with head:
        if not notice:
            _resume_all(frame)
        _backup()
    st.space(GRID_TOOLBAR_CLEARANCE_PX)  # the grid's hover toolbar stands above its top right: not on the buttons
    if view.empty:
        st.info("No run matches the filters.")
        _workers()
        return
    _actions(view, _grid(view))
    scatter.section(store, [int(i) for i in view["id"]])
    _workers()


st.title("Runs")
try:
    runs = tables.runs_view(store.frames.runs_frame())
except StorageError as e:
    st.error(f"Database error: {display.plain(e)}", icon=":material/error:")
    st.stop()
where, text, statuses, estimators, sweeps, tags = _filters(runs)
filter_id = zlib.crc32(json.dumps([text, statuses, estimators, sweeps, tags, where]).encode())  # a new table (and selection) per filter

if error := state.runs_error():
    box = st.container(horizontal=True, vertical_alignment="center")
    box.error(display.plain(error), icon=":material/error:", width="stretch")
    box.button("Dismiss", key="runs.error.dismiss", on_click=state.set_runs_error, args=(None,))

dialog = state.dialog()
active_now = not runs["status"].isin(ENDED_STATUSES).all()
every = None if dialog else state.refresh_every(active_now, idle=state.IDLE_REFRESH_S)
st.fragment(run_every=every)(state.guarded(_table))(active_now)
if dialog and dialog[0] == "delete":
    state.guarded(confirm.delete_dialog)(dialog[1])
elif dialog and dialog[0] == "stop":
    state.guarded(confirm.stop_dialog)(dialog[1])
elif dialog and dialog[0] == "edit":
    state.guarded(_edit_dialog)(dialog[1])
