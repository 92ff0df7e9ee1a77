"""Alerts: a run that fails (an error, or a loss that went NaN) raises a toast on every open
page of every browser session, once per session.

A failed end is stored as an ``ALERT`` line of the run's log (``engine.runner.runlog``,
written by whichever process trained it, on any machine). Each session keeps the highest
log line id it has seen (``SEEN``, starting at the newest line when the session opens, so
old failures are not announced); ``watch`` toasts the alert lines above it and moves it
up. ``watcher`` runs ``watch`` in a small fragment of the page shell every ``POLL_S``
seconds, so a page that is only read still hears of a failure.
"""

from __future__ import annotations

import streamlit as st

from app import state
from app.text import plain
from storage import RunNotFoundError, RunStore

SEEN = "alerts.seen"  # the highest run-log line id this session has seen
POLL_S = 5.0
MAX_TOASTS = 3  # toasts at once; more failures at once are counted in one more


def watch(store: RunStore) -> int:
    """Toast the alerts stored since this session last looked; how many it toasted."""
    seen = st.session_state.get(SEEN)
    if seen is None:
        st.session_state[SEEN] = store.logs.last_log_id()
        return 0
    new = store.logs.alerts_after(int(seen))
    if not new:
        return 0
    st.session_state[SEEN] = max(line.id for line in new)
    for line in new[-MAX_TOASTS:]:
        try:
            name = store.runs.get_run(line.run_id).name
        except RunNotFoundError:
            name = "(deleted)"
        st.toast(plain(f"Run #{line.run_id} {name} {line.text}. Open it in Run detail for its log."),
                 icon=":material/error:", duration="long")
    if len(new) > MAX_TOASTS:
        st.toast(plain(f"… and {len(new) - MAX_TOASTS} more failed runs: see the Runs page."), icon=":material/error:",
                 duration="long")
    return min(len(new), MAX_TOASTS)


def watcher(store: RunStore) -> None:
    """``watch`` now and every ``POLL_S`` seconds, in a fragment of its own (draws nothing)."""
    st.fragment(run_every=POLL_S)(state.guarded(watch))(store)
