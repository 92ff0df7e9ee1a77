"""Confirmations for the actions that stop compute or lose data: Stop and Delete; the
tick a launch of many runs needs (``large_launch``); and the guard that keeps a launch
button from queueing the same runs twice (``launched``, ``record``, ``forget``).

Each dialog is opened with run *ids* (``state.set_dialog(("stop", ids))``), reads
those runs again from the database, names them (id, name as plain text, status) and
acts on exactly those ids, never on a table row: a row can hold another run by the
time the user confirms. While a dialog is open the page does not refresh (a
refresh would close it).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Iterable

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


LAUNCHED = "confirm.launched."  # + a launch button's key: (the form's signature when it launched, what it said)


def signature(*parts: Any) -> str:
    """A digest of what a launch button would queue (configs, tags, where): equal while the form
    is unchanged."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def launched(key: str, sig: str) -> tuple[str | None, bool]:
    """(what the launch ``key`` said, True) while its form still reads ``sig`` since it launched
    (the message is None while it is queueing); (None, False) when it may launch. A second click,
    or a double click, of the same form queues nothing: the button is disarmed until the form
    changes or the user asks for the same runs again (``again``)."""
    done = st.session_state.get(LAUNCHED + key)
    if done is not None and done[0] == sig:
        return done[1], True
    return None, False


def record(key: str, sig: str, message: str | None) -> None:
    """Remember that the launch ``key`` of the form ``sig`` went (``message``: what it queued;
    None: it is queueing now). Set before the first database write, so a click that interrupts
    the script after it cannot queue the runs again."""
    st.session_state[LAUNCHED + key] = (sig, message)


def forget(key: str) -> None:
    """Arm the launch button ``key`` again for the form as it is."""
    st.session_state.pop(LAUNCHED + key, None)


def again(key: str) -> None:
    """The button that arms a launched form's button once more (a deliberate repeat)."""
    st.button("Launch the same runs again", key=f"{key}.again", icon=":material/replay:", type="tertiary",
              on_click=forget, args=(key,),
              help="Arms the button above for the same runs once more: they train again, and Compare keeps the "
                   "furthest-trained run of each seed.")


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
    records = [r for r in lab.store.runs.list_runs() if r.id in set(ids) and r.status in ACTIVE_STATUSES]
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
    records = [r for r in store.runs.list_runs() if r.id in set(ids)]
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
