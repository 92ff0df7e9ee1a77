"""Launching runs from the command line (``run``, ``sweep``, ``reproduce``): the notes and
warnings the Launch form also shows, the one launch rule, and queueing or training them."""

from __future__ import annotations

import sys

from engine.cli.arguments import CliError, at_least, open_store, parse_tags
from engine.cli.config_flags import sweep_from_args
from engine.config import RunConfig, launch_warnings, needs_confirmation


def grid(args) -> list[RunConfig]:
    """The runs to launch, after the notes and warnings the Launch form also shows; more
    than ``LARGE_LAUNCH`` runs need ``--yes``."""
    sweep = sweep_from_args(args, sweep=args.command == "sweep")
    for clip in sweep.clipped():
        print(f"note: {clip}; the run records R={clip.effective}", file=sys.stderr)
    configs = sweep.expand()
    for w in launch_warnings(configs):
        text = w.text if w.field is None else w.text.replace(w.field, "--" + w.field.replace("_", "-"), 1)
        print(f"warning: {text}", file=sys.stderr)
    confirmed(args, configs, "fewer --seeds/--ranks")
    return configs


def confirmed(args, configs: list[RunConfig], fewer: str) -> None:
    """The one launch rule (``needs_confirmation``, the Launch form's too): more than
    ``LARGE_LAUNCH`` runs are launched only with ``--yes``; otherwise nothing is queued."""
    if needs_confirmation(len(configs)) and not args.yes:
        raise CliError(f"{len(configs):,} runs to launch (estimated total {total_time(args.db, configs)}): pass --yes to "
                       f"launch them, or {fewer}")


def total_time(url, configs: list[RunConfig]) -> str:
    """The estimated wall time of ``configs`` from the step times of finished runs of the
    same models in the database (the Launch form's estimate), or ``unknown``."""
    from engine.core import units
    from engine.runner import estimates
    from storage import StorageError

    try:
        store = open_store(url, create=False)
    except (StorageError, OSError):
        return "unknown"
    try:
        estimate = estimates.grid_estimate(store, configs)
    except StorageError:
        return "unknown"
    finally:
        store.close()
    return units.format_seconds(estimate.seconds) if estimate.known else "unknown"


def launch_grid(args) -> int:
    """``run`` and ``sweep``: the grid their flags describe, validated before anything is
    written, then queued or trained."""
    configs = grid(args)
    chosen = parse_tags(args.tags)
    at_least(getattr(args, "concurrent", None), "--concurrent", 1)
    return launch(args, configs, chosen)


def launch(args, configs: list[RunConfig], tags: tuple[str, ...]) -> int:
    """Queue ``configs`` for workers (``--queue-only``) or train them here as one new sweep."""
    from engine.cli.foreground import train_here
    from engine.runner.jobs import new_sweep_id, queue_runs
    from engine.runner.preflight import check_data
    from engine.runner.queries import relaunch_warning

    store = open_store(args.db)
    check_data(configs)
    if (again := relaunch_warning(store, configs)) is not None:
        print(f"warning: {again}", file=sys.stderr)
    if args.queue_only:
        ids = queue_runs(store, configs, tags=tags)
        print(f"queued {len(ids)} run(s) for workers in {store.url}: ids {ids}; start one with "
              "`python -m engine worker`")
        return 0

    def start(manager):
        ids = manager.submit(configs, sweep_id=new_sweep_id(), tags=tags)
        print(f"queued {len(ids)} run(s) in {store.url}: ids {ids}", file=sys.stderr)
        return ids

    return train_here(store, start, getattr(args, "concurrent", 1))
