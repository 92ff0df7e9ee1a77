"""``worker``: a long-lived process that trains queued runs from the database until stopped."""

from __future__ import annotations

import sys
import time

from engine.cli import arguments
from engine.core.choices import COHORT_SETTINGS


def register(subparsers) -> None:
    p = subparsers.add_parser("worker", parents=[arguments.db_parent()],
                              help="train queued runs from the database until stopped",
                              description="A long-lived process that claims queued runs (whoever queued them) and "
                                          "trains them; run one per GPU or machine against one shared database.")
    arguments.add_concurrent(p)
    p.add_argument("--max-runs", type=int, help="exit after this many runs")
    p.add_argument("--idle-exit", type=float, metavar="S", help="exit after S seconds with nothing to train")
    p.add_argument("--cohorts", choices=COHORT_SETTINGS, default=None,
                   help="train queued runs of a sweep that differ only by seed and learning rate as one program: on, off, or auto "
                        "(on a GPU only; default: $BASIS_LAB_COHORTS, else auto)")


def run(args) -> int:
    from engine.cli.foreground import Signals
    from engine.cli.process import training_starts
    from engine.runner import campaigns
    from engine.runner.jobs import JobManager

    arguments.at_least(args.concurrent, "--concurrent", 1)
    arguments.at_least(args.max_runs, "--max-runs", 1)
    arguments.at_least(args.idle_exit, "--idle-exit", 0, " seconds")
    store = arguments.open_store(args.db)
    training_starts()
    manager = JobManager(store, max_concurrent=args.concurrent, pull=True, max_runs=args.max_runs, on_step=None,
                         cohorts=args.cohorts)
    campaigns.advance_all(store)  # a campaign whose last trial ended while no process could queue its comparison
    print(f"worker {manager.worker_id} on {store.url}: training queued runs, {args.concurrent} at a time; "
          f"checkpoints in {manager.checkpoint_root}", file=sys.stderr)
    with Signals(manager.interrupt) as signals:
        try:
            while signals.received is None:
                time.sleep(0.5)
                if _done(args, manager):
                    break
        finally:
            manager.shutdown(cancel_running=False)
    print(f"worker {manager.worker_id} stopped after {manager.started_runs} run(s)", file=sys.stderr)
    return signals.exit_code(0)


def _done(args, manager) -> bool:
    """Whether the worker has trained its ``--max-runs`` or idled ``--idle-exit`` seconds."""
    if args.max_runs is not None and manager.started_runs >= args.max_runs and not manager.busy():
        return True
    return args.idle_exit is not None and manager.idle_seconds() >= args.idle_exit
