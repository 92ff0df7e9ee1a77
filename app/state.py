"""What the pages share: the process-wide store and job manager, and per-session state.

- ``lab()``: one ``RunStore`` and one ``JobManager`` per database URL for the whole
  server process (``st.cache_resource``): every browser tab and every reload sees
  the same runs and the same queue. The URL is ``storage.resolve_url()``
  (``$BASIS_LAB_DB_URL`` or the default SQLite file), read on every call, so a
  process (or a test) with another URL gets its own pair. The job manager (and
  with it JAX) starts when a page first trains, resumes, cancels or diagnoses,
  so pages that only read or fill the Launch form load no framework. Pages only read:
  runs whose worker died are marked ``interrupted`` by the ``Lab``'s sweep, a heartbeat
  of the dashboard process (``engine.runner.liveness.sweep``; the job manager's own
  heartbeat sweeps once it has started), never by a page render.
- The selection: the run ids the user picked (Runs table, Compare picker, or the
  runs just launched), kept in ``st.session_state`` under ``SELECTED``.
- ``metrics(store, ids)``: this session's ``storage.MetricsFeed`` for the URL, so a
  live refresh reads only metric rows newer than the last it read (per run: nothing is
  missed on PostgreSQL, and a resumed run's replaced history is re-read).
- ``paused()``: the sidebar's switch that stops live refreshes.
- The URL: ``seed_from_url`` sets a page's controls from its link when they are first drawn,
  ``keep_in_url`` holds what they show in the URL (``app.viewstate`` reads and checks the values).
- What one page hands another (a run to open in Run detail, a sweep to clone into
  Launch, the Runs page's open dialog, its last message and its standing error): typed accessors
  below, so no page reads a bare session-state key of another.
"""

from __future__ import annotations

import atexit
import functools
import threading
from typing import TYPE_CHECKING, Callable, Iterable, Literal, Mapping, Optional, Sequence

import pandas as pd
import streamlit as st

from app import viewstate
from app.text import plain
from engine.config import Sweep
from engine.runner import liveness
from storage import BasisLabError, MetricsFeed, RunStore, StorageError, UserError, resolve_url

if TYPE_CHECKING:
    from engine.runner.jobs import JobManager

Persist = Optional[Literal["page", "session"]]  # where a widget keeps its value (Streamlit's ``persist_state``)
KEEP: Persist = "session"  # a control keeps its value for the session: through other pages and their live refreshes
REFRESH_S = 2.0  # live refresh period while runs are active
IDLE_REFRESH_S = 10.0  # period of the Runs page when nothing runs (to see CLI launches)
SELECTED = "selected_runs"
PAUSED = "paused"
_DETAIL_RUN = "detail.run"
_CLONE = "launch.clone"
_DIALOG = "dialog"
_FLASH = "runs.flash"
_EPOCH = "runs.epoch"
_ERROR = "runs.error"
MAX_CONCURRENT = 1


class Lab:
    """The database and the one job manager that trains into it, started on first use, and
    the sweep that marks runs whose worker died ``interrupted`` (on a heartbeat, not in pages)."""

    def __init__(self, store: RunStore):
        self.store = store
        self._manager: JobManager | None = None
        self._lock = threading.Lock()
        self._sweeper = liveness.Heartbeat(self._sweep, name="basis-dashboard-sweep").start()

    def _sweep(self) -> None:
        """``liveness.sweep`` until the job manager starts (its heartbeat sweeps from then on)."""
        if self.started_manager() is None:
            liveness.sweep(self.store)

    @property
    def manager(self) -> JobManager:
        """This process's job manager (registered as a worker from its first use on)."""
        with self._lock:
            if self._manager is None:
                from engine.runner.jobs import JobManager

                self._manager = JobManager(self.store, max_concurrent=MAX_CONCURRENT)
            return self._manager

    def started_manager(self) -> JobManager | None:
        """The job manager if a page has started it, else None (starts nothing)."""
        with self._lock:
            return self._manager

    def close(self, cancel_running: bool = False) -> None:
        """Stop the sweep, shut the job manager down, if it started, and close the store."""
        self._sweeper.stop()
        with self._lock:
            manager, self._manager = self._manager, None
        if manager is not None:
            manager.shutdown(cancel_running=cancel_running)
        self.store.close()


@st.cache_resource(show_spinner=False)
def _lab(url: str) -> Lab:
    """Created once per URL and process; runs keep training when the page goes away.
    When the process exits (Streamlit stops on SIGTERM, SIGINT or SIGQUIT and returns
    normally), its runs checkpoint and end ``interrupted``, as the CLI's do."""
    lab = Lab(RunStore(url))
    # Before interpreter shutdown stops thread pools: checkpoint writes (orbax) submit to
    # concurrent.futures executors, which refuse new work once their own threading-atexit
    # hook has run, and an ``atexit`` handler runs after it. Hooks registered later run
    # first, so this one checkpoints while the pools still work.
    register = getattr(threading, "_register_atexit", atexit.register)
    register(_checkpoint_on_exit, lab)
    return lab


def _checkpoint_on_exit(lab: Lab) -> None:
    """Interrupt this process's runs: each running run writes a checkpoint at its current
    step and ends ``interrupted`` (resumable); queued ones end ``interrupted`` too. A
    process whose job manager never started (it only read) has nothing to stop."""
    manager = lab.started_manager()
    if manager is None or manager.closed:
        return
    try:
        manager.shutdown(cancel_running=False)
    except (BasisLabError, OSError, RuntimeError):  # exiting anyway; what was written stays written
        pass


def db_url() -> str:
    """The database URL this process uses now."""
    return resolve_url()


def lab() -> Lab:
    """The store and job manager of the current database URL (created once per process)."""
    return _lab(db_url())


def selected() -> list[int]:
    """The run ids selected in this session, in the order they were picked."""
    return list(st.session_state.get(SELECTED, []))


def set_selected(run_ids: Iterable[int]) -> None:
    """Replace this session's selection (duplicates dropped, order kept)."""
    st.session_state[SELECTED] = list(dict.fromkeys(int(i) for i in run_ids))


def paused() -> bool:
    """Whether the sidebar's switch has paused live refreshes."""
    return bool(st.session_state.get(PAUSED, False))


def refresh_every(active: bool, idle: float | None = None) -> float | None:
    """The ``run_every`` of a live fragment: None when paused, ``REFRESH_S`` while
    runs are active, else ``idle`` (None: no refresh)."""
    if paused():
        return None
    return REFRESH_S if active else idle


def guarded(fn: Callable) -> Callable:
    """``fn`` that shows a :class:`~storage.UserError` (a database that went away, a run
    deleted meanwhile, a value out of range) as one error line on the page instead of a
    traceback; a ``StorageError`` reads ``Database error: …``. Any other exception is a bug
    and reaches Streamlit, which shows its traceback."""

    @functools.wraps(fn)
    def run(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except UserError as e:
            text = f"Database error: {e}" if isinstance(e, StorageError) else str(e)
            st.error(plain(text.splitlines()[0] if text.strip() else type(e).__name__), icon=":material/error:")

    return run


def metrics(store: RunStore, run_ids: Iterable[int], names: Optional[Sequence[str]] = None) -> pd.DataFrame:
    """Every metric row of ``run_ids`` (ordered by id), of ``names`` only (None: every
    name), reading only rows newer than what this session already holds for the current
    database. The session keeps one feed of every name and one of a name list; another
    list replaces that one and reads afresh, so a page that reads a few names (Compare)
    holds only those."""
    names = None if names is None else sorted(set(names))
    key = f"metrics_feed::{db_url()}" + ("" if names is None else "::named")
    feed = st.session_state.get(key)
    if feed is None or feed.names != names:
        feed = st.session_state[key] = MetricsFeed(names)
    feed.poll(store, run_ids)
    return feed.frame


def url_query() -> dict[str, list[str]]:
    """The page's URL query, every value of a repeated parameter kept."""
    return {name: st.query_params.get_all(name) for name in st.query_params}


def seed_from_url(params: Sequence[viewstate.Param], choices: Mapping[str, Sequence[str]]) -> list[str]:
    """Set each control of ``params`` that is not drawn yet in this session from the URL
    (``viewstate.read_params``), so a link opens the page as its sender saw it; the
    problems of the values that were used (none once every control is drawn)."""
    missing = [p for p in params if p.key not in st.session_state]
    if not missing:
        return []
    values, problems = viewstate.read_params(url_query(), missing, choices)
    for key, value in values.items():
        st.session_state[key] = value
    return problems


def keep_in_url(values: Mapping[str, object]) -> None:
    """Hold each value in its URL parameter (``viewstate.param_text``; a blank one removes the
    parameter), where the URL holds another: what the page shows is what a link to it opens."""
    query = url_query()
    for name, value in values.items():
        text = viewstate.param_text(value)
        if (query.get(name) or None) == (text if isinstance(text, list) or text is None else [text]):
            continue
        if text is None:
            del st.query_params[name]
        else:
            st.query_params[name] = text


def open_detail(run_id: int) -> None:
    """Ask Run detail to show ``run_id`` next time it is drawn."""
    st.session_state[_DETAIL_RUN] = int(run_id)


def take_detail() -> int | None:
    """The run another page asked Run detail to show (once)."""
    return st.session_state.pop(_DETAIL_RUN, None)


def clone_to_launch(sweep: Sweep) -> None:
    """Ask Launch to fill its form with ``sweep`` next time it is drawn."""
    st.session_state[_CLONE] = sweep


def take_clone() -> Sweep | None:
    """The sweep another page asked Launch to show (once)."""
    return st.session_state.pop(_CLONE, None)


def dialog() -> tuple | None:
    """The open confirmation dialog (``app.confirm``): ``("stop", [ids])``, ``("delete", [ids])``
    or the Runs page's ``("edit", id)``; None when none is open."""
    return st.session_state.get(_DIALOG)


def set_dialog(value: tuple | None) -> None:
    if value is None:
        st.session_state.pop(_DIALOG, None)
    else:
        st.session_state[_DIALOG] = value


def flash(message: str) -> None:
    """A message (plain text) for the page to show as a toast after the next rerun."""
    st.session_state[_FLASH] = message


def take_flash() -> str | None:
    return st.session_state.pop(_FLASH, None)


def runs_error() -> str | None:
    """The Runs page's standing error (a refused action): shown, outside the live
    table, until the user dismisses it or acts again."""
    return st.session_state.get(_ERROR)


def set_runs_error(message: str | None) -> None:
    """Set (or with None clear) the Runs page's standing error."""
    if message is None:
        st.session_state.pop(_ERROR, None)
    else:
        st.session_state[_ERROR] = str(message)


def table_epoch() -> int:
    """Bumped when runs are deleted, so the Runs table (and its selection) is rebuilt."""
    return st.session_state.get(_EPOCH, 0)


def bump_table_epoch() -> None:
    st.session_state[_EPOCH] = table_epoch() + 1
