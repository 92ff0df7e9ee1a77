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
    from engine.cli.foreground import train_here

    if not args.all and not args.runs:
        raise arguments.CliError("name the runs to resume (ids or names), or pass --all")
    arguments.at_least(args.concurrent, "--concurrent", 1)
    store = arguments.open_store(args.db, create=False)
    if args.queue_only:
        return _queue(args, store)
    # then: what the runs' ends queued here meanwhile (a campaign's comparison), until nothing is left
    return train_here(store, lambda manager: _start(args, store, manager), args.concurrent,
                      then=lambda manager: sorted(manager.pending()))


def _queue(args, store) -> int:
    """``--queue-only``: the named runs (and with ``--all`` every interrupted one) queued again
    for any worker, and with ``--all`` the comparison of every campaign whose trials have ended."""
    from engine.runner import campaigns
    from engine.runner.liveness import check_stale

    check_stale(store)
    ids = store.resolve_runs(args.runs) if args.runs else []
    if args.all:
        ids += [r.id for r in store.list_runs(statuses=["interrupted"]) if r.id not in ids]
    moved = store.requeue(ids, owner=None) if ids else []
    new = campaigns.advance_all(store) if args.all else []
    print(f"queued {len(moved)} run(s) again for workers{': ' + ', '.join(map(str, moved)) if moved else ''}"
          + (f"; {len(new)} comparison run(s) of a campaign queued" if new else ""), file=sys.stderr)
    return 0


def _start(args, store, manager) -> list[int]:
    """Hand the named runs (and with ``--all`` every interrupted and orphaned one) to
    ``manager``; the ids it resumes. Each is announced without a step: the checkpoint its
    database records may be refused (damaged), and the line ``train_here`` prints once one is
    read names the step actually used."""
    from engine.runner.liveness import check_stale

    check_stale(store)
    ids = store.resolve_runs(args.runs) if args.runs else []
    if args.all:
        ids += [r.id for r in store.list_runs(statuses=["interrupted"]) if r.id not in ids]
    for run_id in ids:
        r = store.get_run(run_id)
        if r.status in ("running", "queued", "finished"):
            print(f"run {run_id}: {r.status}, nothing to resume", file=sys.stderr)
    moved = manager.resume(ids)
    if args.all:
        from engine.runner import campaigns

        campaigns.advance_all(store)  # for any process: this one adopts them next
        moved += manager.adopt_orphans()
    for run_id in moved:  # its step is named once a checkpoint is read (train_here): a damaged one is not it
        r = store.get_run(run_id)
        where = "from its newest readable checkpoint" if r.checkpoint_step else "from step 0 (no checkpoint)"
        print(f"run {run_id} {r.name}: resuming {where}", file=sys.stderr)
    if not moved:
        print("nothing to resume", file=sys.stderr)
    return moved
