"""``tag``: add or remove a run's tags, after launch too; with neither, print them."""

from __future__ import annotations

from engine.cli import arguments


def register(subparsers) -> None:
    p = subparsers.add_parser("tag", parents=[arguments.db_parent()], help="add or remove a run's tags (after launch too)",
                              description="Add or remove a run's tags; with neither, print them.")
    p.add_argument("run", help="run id or name")
    p.add_argument("--add", action="append", metavar="LIST", help="comma list of tags to add")
    p.add_argument("--remove", action="append", metavar="LIST", help="comma list of tags to remove")


def run(args) -> int:
    from engine.runner.tags import edit_tags

    store = arguments.open_store(args.db, create=False)
    run_id = store.resolve_runs([args.run])[0]
    if args.add or args.remove:
        tags = edit_tags(store, run_id, add=args.add or (), remove=args.remove or ())
    else:
        tags = store.get_run(run_id).tags
    print(f"run {run_id}: tags {', '.join(tags) or '-'}")
    return 0
