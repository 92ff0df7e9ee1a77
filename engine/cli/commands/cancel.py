"""``cancel``: stop queued or running runs, whichever process trains them."""

from __future__ import annotations

from engine.cli import arguments


def register(subparsers) -> None:
    p = subparsers.add_parser("cancel", parents=[arguments.db_parent()], help="stop queued or running runs (any process)")
    p.add_argument("runs", nargs="+", help="run ids or names")


def run(args) -> int:
    from engine.runner.control import cancel_runs

    store = arguments.open_store(args.db, create=False)
    for run_id, done in cancel_runs(store, args.runs).items():
        print(f"run {run_id}: {done}")
    return 0
