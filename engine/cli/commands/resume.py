"""``resume``: continue interrupted runs under their own ids from their newest checkpoint."""

from __future__ import annotations

import sys

from engine.cli import arguments


def register(subparsers) -> None:
    p = subparsers.add_parser("resume", parents=[arguments.db_parent()],
                              help="continue interrupted runs from their last checkpoint",
                              description="Continue runs under their own ids from their newest checkpoint (from step 0 "
                                          "when they have none). Metrics past that step are replaced.")
    p.add_argument("runs", nargs="*", help="run ids or names")
    p.add_argument("--all", action="store_true",
                   help="every interrupted run, and every queued run no live process will train; a tuning campaign "
                        "whose trials have all ended gets its comparison queued")
    arguments.add_concurrent(p)
    p.add_argument("--queue-only", action="store_true",
                   help="hand the runs back to the queue for `python -m engine worker` processes instead of training "
                        "them here")


def run(args) -> int:
    from engine.cli.launch import check_resume, resume_here
    from engine.runner.control import requeue_for_workers

    check_resume(args.runs, args.all, args.concurrent)
    store = arguments.open_store(args.db, create=False)
    if args.queue_only:
        moved, new = requeue_for_workers(store, args.runs, args.all)
        print(f"queued {len(moved)} run(s) again for workers{': ' + ', '.join(map(str, moved)) if moved else ''}"
              + (f"; {len(new)} comparison run(s) of a campaign queued" if new else ""), file=sys.stderr)
        return 0
    # then: what the runs' ends queued here meanwhile (a campaign's comparison), until nothing is left
    return resume_here(store, args.runs, args.all, args.concurrent)[1]
