"""Launching runs, for both faces of the lab: the commands ``run``, ``sweep``, ``reproduce`` and
``resume`` and ``engine.api.Lab.launch``, ``sweep`` and ``resume`` call the same functions here,
so they check a launch the same way and refuse it with the same one-line error
(a :class:`~engine.cli.arguments.CliError` or ``engine.config.ConfigError``, both
``ValueError``\\ s) before anything is written.

A launch is checked (:func:`checked`: the grid, the notes and warnings the Launch form also
shows, the one launch rule, tags, ``concurrent``), then started (:func:`start`: its data checked,
a relaunch warned about, then queued for workers or trained here). The faces differ only in how a
message names an option (``Spell``: ``--yes`` here, ``yes=True`` in the API) and where notes and
warnings go (``Say``: ``warning: …`` on stderr here, ``warnings.warn`` in the API).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Callable, Iterable, Mapping

from engine.cli.arguments import CliError, at_least, open_store, parse_tags
from engine.cli.config_flags import sweep_from_args
from engine.config import RunConfig, launch_warnings, needs_confirmation

Say = Callable[[str, str], None]  # (kind: "note" or "warning", text)
Spell = Callable[[str], str]  # an option's name → how the face names it in a message
WHERE = ("here", "queue")  # train in this process (``run``), or queue for workers (``run --queue-only``)


def flag(name: str) -> str:
    """How the CLI names option ``name`` in a message: ``--batch-size``."""
    return "--" + name.replace("_", "-")


def to_stderr(kind: str, text: str) -> None:
    """How the CLI says a note or a warning: ``warning: …`` on stderr."""
    print(f"{kind}: {text}", file=sys.stderr)


def check_where(where: str, spell: Spell = flag) -> str:
    """``where`` if it is one of ``WHERE``, else a CliError naming them."""
    if where not in WHERE:
        raise CliError(f"{spell('run')} must be one of {', '.join(map(repr, WHERE))} (got {where!r}): 'here' trains "
                       "in this process, 'queue' leaves the runs to `python -m engine worker` processes")
    return where


def grid(values: Mapping[str, Any], *, sweep: bool, yes: bool, db=None, say: Say = to_stderr,
         spell: Spell = flag) -> list[RunConfig]:
    """The runs the flat ``values`` describe (``run``: one, ``sweep``: the grid; the flags'
    destinations, ``engine.cli.config_flags``), after the notes and warnings the Launch form
    also shows; more than ``LARGE_LAUNCH`` runs need ``yes``. ``db``: where to estimate
    their time from (a URL or a ``RunStore``)."""
    described = sweep_from_args(argparse.Namespace(**values), sweep=sweep)
    for clip in described.clipped():
        say("note", f"{clip}; the run records R={clip.effective}")
    configs = described.expand()
    for w in launch_warnings(configs):
        say("warning", w.text if w.field is None else w.text.replace(w.field, spell(w.field), 1))
    check_confirmed(configs, yes, db, f"fewer {spell('seeds')}/{spell('ranks')}", spell)
    return configs


def checked(values: Mapping[str, Any], *, sweep: bool, tags: str | Iterable[str] | None, yes: bool,
            concurrent: int | None, db=None, say: Say = to_stderr, spell: Spell = flag) -> tuple[list[RunConfig],
                                                                                                 tuple[str, ...]]:
    """A launch checked before anything is written: its runs (:func:`grid`), its tags (a comma
    list or a list) and ``concurrent`` (>= 1; None: not given)."""
    configs = grid(values, sweep=sweep, yes=yes, db=db, say=say, spell=spell)
    chosen = parse_tags(tags, spell("tags"))
    at_least(concurrent, spell("concurrent"), 1)
    return configs, chosen


def confirmed(args, configs: list[RunConfig], fewer: str) -> None:
    """:func:`check_confirmed` with the flags of ``args`` (``reproduce``, ``tune``)."""
    check_confirmed(configs, args.yes, args.db, fewer)


def check_confirmed(configs: list[RunConfig], yes: bool, db, fewer: str, spell: Spell = flag) -> None:
    """The one launch rule (``needs_confirmation``, the Launch form's too): more than
    ``LARGE_LAUNCH`` runs are launched only with ``yes``; otherwise nothing is queued."""
    if needs_confirmation(len(configs)) and not yes:
        raise CliError(f"{len(configs):,} runs to launch (estimated total {total_time(db, configs)}): pass "
                       f"{spell('yes')} to launch them, or {fewer}")


def total_time(db, configs: list[RunConfig]) -> str:
    """The estimated wall time of ``configs`` from the step times of finished runs of the
    same models in the database (the Launch form's estimate), or ``unknown``. ``db``: a URL
    (opened without creating it) or an open ``RunStore``."""
    from engine.core import units
    from engine.reads import estimates
    from storage import RunStore, StorageError

    try:
        store = db if isinstance(db, RunStore) else RunStore(db, create=False)  # closed here, not by main
    except (StorageError, OSError):
        return "unknown"
    try:
        estimate = estimates.grid_estimate(store, configs)
    except StorageError:
        return "unknown"
    finally:
        if store is not db:
            store.close()
    return units.format_seconds(estimate.seconds) if estimate.known else "unknown"


def start(store, configs: list[RunConfig], tags: tuple[str, ...], *, where: str = "here", concurrent: int = 1,
          say: Say = to_stderr) -> tuple[list[int], int]:
    """Check the data of ``configs`` (a missing file: nothing is written), warn if some are in
    the database already, then queue them as one new sweep: for any worker (``where="queue"``)
    or to train in this process (``"here"``: ``train_here``, ``concurrent`` at a time, with
    progress bars and the summary, until they end). Their ids and the exit status."""
    from engine.cli.foreground import train_here
    from engine.reads.queries import relaunch_warning
    from engine.runner.jobs import new_sweep_id, queue_runs
    from engine.runner.preflight import check_data

    check_where(where)
    check_data(configs)
    if (again := relaunch_warning(store, configs)) is not None:
        say("warning", again)
    if where == "queue":
        return queue_runs(store, configs, tags=tags), 0
    ids: list[int] = []

    def begin(manager) -> list[int]:
        ids.extend(manager.submit(configs, sweep_id=new_sweep_id(), tags=tags))
        print(f"queued {len(ids)} run(s) in {store.url}: ids {ids}", file=sys.stderr)
        return list(ids)

    return ids, train_here(store, begin, concurrent)


def launch_grid(args) -> int:
    """``run`` and ``sweep``: the grid their flags describe, checked before anything is
    written, then queued or trained."""
    concurrent = getattr(args, "concurrent", None)
    configs, tags = checked(vars(args), sweep=args.command == "sweep", tags=args.tags, yes=args.yes,
                            concurrent=concurrent, db=args.db)
    store = open_store(args.db)
    ids, code = start(store, configs, tags, where="queue" if args.queue_only else "here", concurrent=concurrent or 1)
    if args.queue_only:
        print(f"queued {len(ids)} run(s) for workers in {store.url}: ids {ids}; start one with "
              "`python -m engine worker`")
    return code


# ---------------------------------------------------------------------------- resuming


def check_resume(refs, every: bool, concurrent: int | None, spell: Spell = flag) -> None:
    """What ``resume`` needs: runs named, or ``all``; ``concurrent`` >= 1."""
    if not every and not refs:
        raise CliError(f"name the runs to resume (ids or names), or pass {spell('all')}")
    at_least(concurrent, spell("concurrent"), 1)


def resume_here(store, refs, every: bool, concurrent: int = 1) -> tuple[list[int], int]:
    """Resume in this process the runs ``refs`` names (ids or names; with ``every``, also every
    interrupted run and every queued one no live process will train) from their newest
    checkpoint, ``concurrent`` at a time, and what their ends queue here meanwhile (a
    campaign's comparison), until nothing is left (``train_here``); the ids and the exit status."""
    from engine.cli.foreground import train_here

    ids: list[int] = []

    def begin(manager) -> list[int]:
        ids.extend(_hand_over(store, manager, refs, every))
        return list(ids)

    def then(manager) -> list[int]:
        more = sorted(manager.pending())
        ids.extend(i for i in more if i not in ids)
        return more

    return ids, train_here(store, begin, concurrent, then=then)


def _hand_over(store, manager, refs, every: bool) -> list[int]:
    """Hand the named runs (and with ``every`` every interrupted and orphaned one) to
    ``manager``; the ids it resumes. Each is announced without a step: the checkpoint its
    database records may be refused (damaged), and the line ``train_here`` prints once one is
    read names the step actually used."""
    from engine.runner.control import resume_targets

    ids = resume_targets(store, refs, every)
    for run_id in ids:
        r = store.runs.get_run(run_id)
        if r.status in ("running", "queued", "finished"):
            print(f"run {run_id}: {r.status}, nothing to resume", file=sys.stderr)
    moved = manager.resume(ids)
    if every:
        from engine.runner import campaigns

        campaigns.advance_all(store)  # for any process: this one adopts them next
        moved += manager.adopt_orphans()
    for run_id in moved:  # its step is named once a checkpoint is read (train_here): a damaged one is not it
        r = store.runs.get_run(run_id)
        where = "from its newest readable checkpoint" if r.checkpoint_step else "from step 0 (no checkpoint)"
        print(f"run {run_id} {r.name}: resuming {where}", file=sys.stderr)
    if not moved:
        print("nothing to resume", file=sys.stderr)
    return moved
