"""Run detail's tags editor, log and checkpoints.

- Tags: edited in place (``engine.runner.tags.change_tags``: what the box added and removed since
  it was drawn is applied to the tags stored when it saves, so an edit made elsewhere meanwhile is kept;
  a bad tag is refused in one line, nothing stored).
- Log: the run's stored log lines (``storage.logs``: what its training thread printed, warned
  and logged, its claims, progress and end), from a level up, searched, refreshed while it
  runs (the newest ``SHOWN_MAX``), downloadable.
- Checkpoints: listed with step, lease and size when the expander is opened (listing them
  loads the checkpoint library, which pages that only read otherwise never load), and the
  newest downloadable as a tar made from disk when the button is pressed.
"""

from __future__ import annotations

import streamlit as st

from app import state
from app.text import plain
from storage import LOG_LEVELS, RunRecord, RunStore, StorageError

_LEVELS = {"debug": "debug and up", "info": "info and up", "warning": "warnings and errors", "error": "errors"}
LOG_HEIGHT_PX = 320
SHOWN_MAX = 2_000  # the newest lines drawn (the download has them all)


def _save_tags(store: RunStore, run_id: int, key: str) -> None:
    from engine.runner.tags import change_tags

    try:
        tags = change_tags(store, run_id, st.session_state.get(f"{key}.stored"), st.session_state.get(key) or [])
    except (ValueError, StorageError) as e:
        st.session_state[f"{key}.error"] = str(e)
        st.session_state[key] = st.session_state.get(f"{key}.stored", [])  # show what is stored
        return
    st.session_state.pop(f"{key}.error", None)
    st.session_state[f"{key}.stored"] = tags
    st.session_state[key] = tags


def tags_editor(store: RunStore, run: RunRecord, known: list[str]) -> None:
    """A multiselect of the run's tags: pick known tags or type new ones; saved on change."""
    key = f"detail.tags.{run.id}"
    stored = list(run.tags or [])
    if st.session_state.get(f"{key}.stored") != stored:  # first drawn, or changed elsewhere (the CLI, Runs)
        st.session_state[key] = stored
        st.session_state[f"{key}.stored"] = stored
    st.multiselect("Tags", sorted(set(known) | set(stored)), key=key, accept_new_options=True,
                   placeholder="add a tag: pick one or type a new one", on_change=_save_tags, args=(store, run.id, key),
                   help="Saved as you change them. Compare and Runs filter by tag; `python -m engine tag` edits them too.")
    if error := st.session_state.get(f"{key}.error"):
        st.error(plain(f"Tags not saved: {error}"), icon=":material/sell:")


def log_text(lines) -> str:
    """The log lines as text, one a line: time (UTC), level, text (a console line's with its stream in front)."""
    return "\n".join(f"{line.time:%Y-%m-%d %H:%M:%S}  {line.level.upper():<7}  {line.shown}" for line in lines)


def _no_lines(least: str, search: str) -> str:
    if search:
        return f"No log line holds “{search}”" + ("." if least == "info" else f" at {least} or above.")
    return ("No log lines yet: a run logs when it is claimed, what it prints, warns and logs while it trains, its "
            "progress at every evaluation, and its end." if least in ("debug", "info") else
            "No warnings or errors." if least == "warning" else "No errors.")


def log_section(store: RunStore, run_id: int, active: bool) -> None:
    """The run's console and log from the chosen level up, searched (a live fragment while the run is active)."""
    st.subheader("Log")
    left, right = st.columns([3, 2], vertical_alignment="bottom")
    with left:
        least = st.segmented_control("Show", list(_LEVELS), format_func=_LEVELS.__getitem__, default="info",
                                     key="detail.log_level", width="content") or "info"
    with right:
        search = st.text_input("Search the log", key="detail.log_search", placeholder="text, stderr, a logger…",
                               help="Lines whose text or source (stdout, stderr, warning, a logger's name) holds "
                                    "this, any case. `python -m engine logs RUN --grep TEXT` searches the same.").strip()
    levels = LOG_LEVELS[LOG_LEVELS.index(least):]

    def draw() -> None:
        lines = store.logs.run_logs(run_id, levels=levels, search=search, tail=SHOWN_MAX)
        if not lines:
            st.caption(plain(_no_lines(least, search)))
            return
        if len(lines) == SHOWN_MAX:
            st.caption(f"The newest {SHOWN_MAX:,} lines; the download holds every line shown by this filter.")
        with st.container(height=LOG_HEIGHT_PX if len(lines) > 12 else "content", border=False):
            st.code(log_text(lines), language=None, wrap_lines=True)
        st.download_button("Download the log", data=lambda: log_text(store.logs.run_logs(run_id, levels=levels, search=search))
                           + "\n", file_name=f"run-{run_id}-log.txt", mime="text/plain",
                           icon=":material/download:", key="detail.log_download", on_click="ignore")

    st.fragment(run_every=state.refresh_every(active))(state.guarded(draw))()


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB" if n >= 2**20 else f"{n / 2**10:,.1f} KiB"


def checkpoints_section(store: RunStore, run: RunRecord) -> None:
    """The run's checkpoints, read when the expander is opened; the newest downloadable."""
    box = st.expander("Checkpoints", icon=":material/save:", key="detail.checkpoints", on_change="rerun")
    if not box.open:
        return
    from engine.runner import artifacts  # the checkpoint library: only when asked
    from engine.training.checkpoints import CheckpointError

    with box:
        try:
            found = artifacts.run_checkpoints(store, run)
        except CheckpointError as e:
            st.warning(plain(e), icon=":material/folder_off:")
            return
        if not found:
            st.caption("No checkpoint of this run on this machine (it never saved one, or its checkpoint folder "
                       "is on the machine that trained it; set BASIS_LAB_CHECKPOINTS to a shared folder).")
            return
        rows = [{"step": c.step, "lease": c.epoch, "size": _mib(c.bytes),
                 "folder": ("copied from: " if c.borrowed else "") + str(c.folder)} for c in reversed(found)]
        st.dataframe(rows, hide_index=True, width="stretch",
                     column_config={"step": st.column_config.NumberColumn("step", format="%d", width=70),
                                    "lease": st.column_config.NumberColumn("lease", format="%d", width=55),
                                    "size": st.column_config.TextColumn("size", width=90)})
        newest = found[-1]
        st.download_button(f"Download the newest (step {newest.step:,}, {_mib(newest.bytes)}, tar)",
                           data=lambda: artifacts.archive_bytes(newest.folder), file_name=f"run-{run.id}-step-{newest.step}.tar",
                           mime="application/x-tar", icon=":material/download:", key="detail.checkpoint_download",
                           on_click="ignore")
