"""``cancel``: stop queued or running runs, whichever process trains them."""

from __future__ import annotations

from engine.cli import arguments


def register(subparsers) -> None:
    p = subparsers.add_parser("cancel", parents=[arguments.db_parent()], help="stop queued or running runs (any process)")
    p.add_argument("runs", nargs="+", help="run ids or names")


def run(args) -> int:
    from engine.runner.liveness import check_stale

    store = arguments.open_store(args.db, create=False)
    check_stale(store)
    for run_id in store.resolve_runs(args.runs):
        status = store.get_run(run_id).status
        if status not in ("queued", "running"):
            print(f"run {run_id}: not active ({status}); nothing to cancel")
            continue
        store.request_cancel(run_id)
        print(f"run {run_id}: {'cancelled' if status == 'queued' else 'cancel requested; it stops within a step'}")
    return 0
