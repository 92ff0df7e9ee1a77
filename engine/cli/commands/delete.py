"""``delete``: delete runs with their metrics and checkpoints."""

from __future__ import annotations

import sys

from engine.cli import arguments


def register(subparsers) -> None:
    p = subparsers.add_parser("delete", parents=[arguments.db_parent()],
                              help="delete runs with their metrics and checkpoints")
    p.add_argument("runs", nargs="+", help="run ids or names (running runs must be cancelled first)")


def run(args) -> int:
    from engine.runner.jobs import delete_runs
    from engine.runner.liveness import check_stale

    store = arguments.open_store(args.db, create=False)
    check_stale(store)
    ids = store.runs.resolve_runs(args.runs)
    problems = delete_runs(store, ids)
    for p in problems:
        print(f"error: {p}", file=sys.stderr)
    print(f"deleted {len(ids) - len(problems)} run(s)")
    return arguments.EXIT_BAD_INPUT if problems else 0
