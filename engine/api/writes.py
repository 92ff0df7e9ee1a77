"""``engine.api.Lab``'s writes: launch, sweep, wait, tag, note, cancel and resume, through the
functions the CLI's commands call (``engine.cli.launch``, ``engine.runner.control``,
``engine.runner.tags``): the same checks, before anything is written, and the same one-line
errors, each a ``ValueError`` (``ConfigError`` for a run field, ``CliError`` for the rest).
A message names an option as a call does (``pass yes=True``) where the CLI names its flag
(``pass --yes``); the notes and warnings the CLI prints on stderr are :class:`LaunchWarning`\\ s.
"""

from __future__ import annotations

import difflib
import signal
import sys
import time
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Optional, Union

import pandas as pd

from storage import RunStore

Refs = Union[int, str, Iterable[Union[int, str]]]  # a run, or runs, by id or exact name
ENDED = ("finished", "failed", "cancelled", "interrupted")  # what ``wait`` waits for; interrupted: resumable
_SPELLED = {"yes": "yes=True", "all": "all=True"}
_ENGINE = str(Path(__file__).resolve().parents[1])  # the engine package's folder


class LaunchWarning(UserWarning):
    """A note or warning about a launch: what ``python -m engine run``/``sweep`` print as
    ``note: …`` and ``warning: …`` (a clipped rank, an eval interval longer than the run, runs
    already in the database)."""


def spell(name: str) -> str:
    """How a message of the API names option ``name``: as its keyword argument."""
    return _SPELLED.get(name, name)


def say(kind: str, text: str) -> None:
    """A note or a warning of a launch, as a :class:`LaunchWarning` issued at the caller's line
    (the first frame outside the engine package)."""
    frame, level = sys._getframe(0), 1
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_ENGINE):
        frame, level = frame.f_back, level + 1
    warnings.warn(f"{kind}: {text}" if kind == "note" else text, LaunchWarning, stacklevel=level)


def refs_of(ids: Refs) -> list[Union[int, str]]:
    """``ids`` as a list of run references: one id or name, or several."""
    return [ids] if isinstance(ids, (int, str)) else list(ids)


def flat_values(fields: Mapping[str, Any], *, sweep: bool) -> dict[str, Any]:
    """The flat values the CLI's flags would hold for these run fields (``engine.cli.launch.grid``
    reads them): every flag's default, and ``fields`` over them. In a sweep the swept fields
    take lists (``ranks=["exact", 1, 8]``, ``seeds="0-4"``; ``rank=`` is ``ranks=``, as ``--rank``
    is ``--ranks``). A data option goes by its name or its flag's (``path=`` or ``data_path=``,
    ``--data-path``). A float field given an int is that float, as the CLI reads ``--lr 1``.
    A name that is no run field is a ``ConfigError`` naming the closest one; nothing is written."""
    from engine.cli.config_flags import flag_defaults
    from engine.config import DATA_OPTIONS, SWEEP_AXES, ConfigError

    values = flag_defaults(sweep=sweep)
    given: dict[str, str] = {}  # field → the name it was given as
    plurals = {name: plural for name, (plural, _) in SWEEP_AXES.items()} if sweep else {}
    aliases = {**{o.cli_flag.lstrip("-").replace("-", "_"): o.name for o in DATA_OPTIONS}, **plurals}
    for name, value in fields.items():
        key = aliases.get(name, name)
        if key not in values:
            close = difflib.get_close_matches(name, list(values), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"unknown run field {name!r}{hint}; the fields are RunConfig's (engine.config) and the "
                              f"data options, as `python -m engine {'sweep' if sweep else 'run'} --help` lists them")
        if key in given:
            raise ConfigError(f"{given[key]!r} and {name!r} are the same field; give one of them", field=key)
        given[key] = name
        values[key] = _as_flag_value(key, value, key in plurals.values())
    return values


def _as_flag_value(name: str, value: Any, listed: bool) -> Any:
    """``value`` as the flag ``name`` would hold it: a swept list as a list, an int as a float
    for a float field (``lr=1``), anything else as given (the schema checks it)."""
    from engine.config import RunConfig, base_type, schema

    if listed:
        return value if isinstance(value, str) or isinstance(value, Iterable) else [value]
    kind = next((base_type(tp)[0] for f, _, tp in schema(RunConfig) if f.name == name), None)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


class Writes:
    """The write methods of ``engine.api.Lab``, on its ``store``."""

    store: RunStore

    def launch(self, *, run: str = "here", tags: Union[str, Iterable[str], None] = None, **fields: Any) -> int:
        """Launch one run, as ``python -m engine run``: ``fields`` are run fields by name (those
        of ``RunConfig`` and the data options; the rest take the CLI's defaults), checked before
        anything is written. ``run="here"`` (the CLI's default) trains it in this process until
        it ends, with a progress bar and the summary; ``run="queue"`` (``--queue-only``) leaves
        it to ``python -m engine worker`` processes and returns at once (then :meth:`wait`).
        ``tags``: a comma list or a list. Its id. A run that fails ends ``failed`` with its error
        (``lab.wait``, ``lab.runs``: where the CLI exits 1), not an exception; Ctrl-C while it trains
        here checkpoints it, ends it interrupted and raises ``KeyboardInterrupt``.

        >>> Lab(create=True).launch(preset="tiny", rank=8, steps=200, run="queue", tags="pilot")  # doctest: +SKIP
        """
        return self._launch(fields, sweep=False, run=run, tags=tags, yes=False, concurrent=None)[0]

    def sweep(self, *, estimators: Any = None, ranks: Any = None, lams: Any = None, seeds: Any = None,
              run: str = "here", concurrent: int = 1, tags: Union[str, Iterable[str], None] = None,
              yes: bool = False, **fields: Any) -> list[int]:
        """Launch a grid, as ``python -m engine sweep``: ``estimators`` × ``ranks`` × ``lams`` ×
        ``seeds`` (each a list or the CLI's comma text; ``"exact"`` among the ranks adds exact
        backprop once per seed; None: the CLI's default, ``ranks="exact,1,8,32"``) over the other
        run ``fields``. More than ``LARGE_LAUNCH`` runs need ``yes=True``. ``run`` as in
        :meth:`launch`; ``concurrent`` runs train at once here. Their ids, in order.

        >>> Lab(create=True).sweep(preset="tiny", ranks=["exact", 8, 32], seeds=range(3), steps=200)  # doctest: +SKIP
        """
        swept = {"estimators": estimators, "ranks": ranks, "lams": lams, "seeds": seeds}
        fields = {**{k: v for k, v in swept.items() if v is not None}, **fields}
        return self._launch(fields, sweep=True, run=run, tags=tags, yes=yes, concurrent=concurrent)

    def _launch(self, fields: Mapping[str, Any], *, sweep: bool, run: str, tags, yes: bool,
                concurrent: Optional[int]) -> list[int]:
        """``engine.cli.launch.checked`` then ``start``, as ``run`` and ``sweep`` call them."""
        from engine.cli.launch import check_where, checked, start

        check_where(run, spell)
        values = flat_values(fields, sweep=sweep)
        configs, chosen = checked(values, sweep=sweep, tags=tags, yes=bool(yes), concurrent=concurrent,
                                  db=self.store, say=say, spell=spell)
        if run == "here":
            _one_host()
        ids, code = start(self.store, configs, chosen, where=run, concurrent=concurrent or 1, say=say)
        _after_signal(code, ids)
        return ids

    def wait(self, ids: Refs, timeout: Optional[float] = None, poll: float = 1.0) -> pd.DataFrame:
        """Block until every run ``ids`` names (ids or names) has ended: finished, failed,
        cancelled or interrupted (resumable: :meth:`resume`), polling the database every
        ``poll`` seconds (whoever trains them: a worker, this process, another machine). Their
        rows of :meth:`runs`, in the order given. After ``timeout`` seconds (None: no limit) a
        ``TimeoutError`` naming the runs not ended yet.

        >>> lab.wait(lab.sweep(preset="tiny", ranks=[8], seeds="0-2", run="queue"), timeout=3600)  # doctest: +SKIP
        """
        if not poll > 0 or (timeout is not None and not timeout >= 0):
            raise ValueError(f"poll must be > 0 and timeout >= 0 seconds or None (got poll={poll!r}, timeout={timeout!r})")
        wanted = self.store.runs.resolve_runs(refs_of(ids))
        deadline = None if timeout is None else time.monotonic() + timeout
        while left := _not_ended(self.store, wanted):
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                raise TimeoutError(_timeout_text(left, len(wanted), timeout))
            time.sleep(poll if deadline is None else min(poll, deadline - now))
        from engine.reads.queries import runs_where

        frame = runs_where(self.store, None, metrics="all")
        frame = frame[frame["id"].isin(wanted)].set_index("id", drop=False)
        return frame.loc[[i for i in wanted if i in frame.index]].reset_index(drop=True)

    def tag(self, ids: Refs, add: Union[str, Iterable[str]] = (),
            remove: Union[str, Iterable[str]] = ()) -> dict[int, list[str]]:
        """Give runs ``ids`` (ids or names) the tags ``add`` and take ``remove`` away (comma lists
        or lists), as ``python -m engine tag``: every run is checked before any is changed (a tag
        to remove that one lacks changes none). Per run id, its tags after."""
        from engine.runner.tags import tag_runs

        return tag_runs(self.store, refs_of(ids), add=add, remove=remove)

    def note(self, run: Union[int, str], text: str, *, append: bool = False) -> str:
        """Set the notes of run ``run`` (id or name) to ``text`` (what the dashboard's notes box
        stores), or with ``append`` add ``text`` as a line below them; its notes after."""
        run_id = self.store.runs.resolve_runs([run])[0]
        if append:
            self.store.runs.append_notes(run_id, str(text))
        else:
            self.store.runs.set_notes(run_id, text)
        return self.store.runs.get_run(run_id).notes

    def cancel(self, ids: Refs) -> dict[int, str]:
        """Stop runs ``ids`` (ids or names), whichever process trains them, as ``python -m engine
        cancel``: a queued run is cancelled at once, a running one checkpoints and stops within a
        step (:meth:`wait` for it). Per run id, what happened (``cancelled``, ``cancel requested;
        it stops within a step``, ``not active (finished); nothing to cancel``)."""
        from engine.runner.control import cancel_runs

        return cancel_runs(self.store, refs_of(ids))

    def resume(self, ids: Optional[Refs] = None, *, all: bool = False, run: str = "here",
               concurrent: int = 1) -> list[int]:
        """Continue runs ``ids`` (ids or names; with ``all=True`` also every interrupted run and
        every queued one no live process will train) from their newest checkpoint, under their
        own ids, as ``python -m engine resume``: ``run="here"`` trains them in this process
        (``concurrent`` at a time) until they end, ``run="queue"`` (``--queue-only``) hands them
        back to the queue for workers. The ids resumed (with ``all=True`` and ``run="queue"``,
        and the comparison runs of tuning campaigns whose trials have ended)."""
        from engine.cli.launch import check_resume, check_where, resume_here
        from engine.runner.control import requeue_for_workers

        refs = [] if ids is None else refs_of(ids)
        check_where(run, spell)
        check_resume(refs, bool(all), concurrent, spell)
        if run == "queue":
            moved, new = requeue_for_workers(self.store, refs, bool(all))
            return moved + new
        _one_host()
        resumed, code = resume_here(self.store, refs, bool(all), concurrent)
        _after_signal(code, resumed)
        return resumed


def _one_host() -> None:
    """Training here from Python is on one host: with ``engine.runner.hosts``' variables set,
    a ``CliError`` naming the commands that train on several."""
    from engine.cli.arguments import CliError
    from engine.runner import hosts

    if hosts.settings() is not None:
        raise CliError("the Python API trains on one host; on several, run `python -m engine run`/`sweep`/`resume` "
                       "on every host, or launch with run='queue' and start `python -m engine worker` processes")


def _after_signal(code: int, ids: list[int]) -> None:
    """After training here: the signal that stopped it (the runs checkpointed and ended
    interrupted), raised on as the CLI exits on it; SIGINT as ``KeyboardInterrupt``."""
    if code > 128:
        text = f"runs {ids} interrupted; lab.resume({ids}) continues them"
        if code - 128 == signal.SIGINT:
            raise KeyboardInterrupt(text)
        raise SystemExit(code)


def _not_ended(store: RunStore, ids: list[int]) -> dict[int, str]:
    """Those of ``ids`` still queued or running, with that status (a deleted run has ended)."""
    active = {r.id: r.status for r in store.runs.list_runs(statuses=["queued", "running"])}
    return {i: active[i] for i in ids if i in active}


def _timeout_text(left: dict[int, str], total: int, timeout: Optional[float]) -> str:
    named = ", ".join(f"{i} ({status})" for i, status in left.items())
    return (f"{len(left)} of the {total} runs did not end within {timeout:g} s: {named}; wait longer, start "
            "`python -m engine worker` for queued runs, or cancel them (lab.cancel)")
