"""Confirmations for the actions that stop compute or lose data: Stop and Delete; and
the tick a launch of many runs needs (``large_launch``).

Each dialog is opened with run *ids* (``state.set_dialog(("stop", ids))``), reads
those runs again from the database, names them (id, name as plain text, status) and
acts on exactly those ids, never on a table row: a row can hold another run by the
time the user confirms. While a dialog is open the page does not refresh (a
refresh would close it).
"""

from __future__ import annotations

from typing import Iterable

import streamlit as st

from app import state
from app.display import plain
from engine.config import LARGE_LAUNCH, needs_confirmation
from storage import ACTIVE_STATUSES


def large_launch(n: int, eta: str, key: str) -> bool:
    """Whether a launch of ``n`` runs may go: the CLI's rule (``needs_confirmation``: more
    than ``LARGE_LAUNCH`` runs need ``--yes``) as a tick, unticked until the user ticks it."""
    if not needs_confirmation(n):
        return True
    return st.checkbox(f"Yes, launch all {n:,} runs (estimated total time {eta})", key=key, value=False,
                       help=f"More than {LARGE_LAUNCH} runs in one launch: check the seeds and ranks first.")


def close(message: str | None = None) -> None:
    """Close the open dialog and rerun the app (``st.rerun``: does not return);
    ``message`` is shown as a toast after the rerun."""
    state.set_dialog(None)
    if message:
        state.flash(message)
    st.rerun()


def run_list(records: Iterable) -> str:
    """A markdown list naming each run: ``- #14 basis R=8 s0 (running)``, the name as plain text."""
    return "\n".join(f"- #{r.id} {plain(r.name)} ({r.status})" for r in records)


def ids_text(ids: Iterable[int]) -> str:
    """``#3, #4``."""
    return ", ".join(f"#{i}" for i in ids)


@st.dialog("Stop runs", dismissible=False)
def stop_dialog(ids: list[int]) -> None:
    """Stop the runs ``ids`` that are still queued or running, after the user confirms."""
    lab = state.lab()
    records = [r for r in lab.store.list_runs() if r.id in set(ids) and r.status in ACTIVE_STATUSES]
    if not records:
        st.write(f"{ids_text(ids)} {'is' if len(ids) == 1 else 'are'} no longer queued or running: nothing to stop.")
        if st.button("Close", key="confirm.stop.close"):
            close()
        return
    n = len(records)
    st.write(f"Stop {n} run{'s' if n != 1 else ''}? A running run checkpoints and ends cancelled (Resume continues "
             "it); a queued run is cancelled before it starts.")
    st.markdown(run_list(records))
    c1, c2 = st.columns(2)
    if c1.button(f"Stop {ids_text(r.id for r in records)}", type="primary", key="confirm.stop.ok"):
        for r in records:
            lab.manager.cancel(r.id)
        close(f"Stop requested for {ids_text(r.id for r in records)}.")
    if c2.button("Keep them", key="confirm.stop.cancel"):
        close()


@st.dialog("Delete runs", dismissible=False)
def delete_dialog(ids: list[int]) -> None:
    """Delete the runs ``ids`` with their metrics and checkpoints, after the user confirms."""
    store = state.lab().store
    records = [r for r in store.list_runs() if r.id in set(ids)]
    n = len(records)
    st.write(f"Delete {n} run{'s' if n != 1 else ''} and all their metrics and checkpoints? This cannot be undone.")
    st.markdown(run_list(records))
    c1, c2 = st.columns(2)
    if c1.button(f"Delete {ids_text(r.id for r in records)}", type="primary", key="runs.delete.confirm", disabled=not n):
        from engine.runner import jobs  # checkpoints (orbax, JAX) only when something is deleted

        problems = jobs.delete_runs(store, [r.id for r in records])
        state.set_selected([i for i in state.selected() if i not in {r.id for r in records}])
        state.bump_table_epoch()
        if problems:
            state.set_runs_error("; ".join(problems))
        close(None if problems else f"Deleted {ids_text(r.id for r in records)}.")
    if c2.button("Cancel", key="runs.delete.cancel"):
        close()
