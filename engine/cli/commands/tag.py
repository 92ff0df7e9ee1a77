"""``tag``: add or remove runs' tags, after launch too; with neither, print them."""

from __future__ import annotations

from engine.cli import arguments


def register(subparsers) -> None:
    p = subparsers.add_parser("tag", parents=[arguments.db_parent()], help="add or remove runs' tags (after launch too)",
                              description="Add or remove the tags of runs; with neither, print them. Every run is "
                                          "checked before any is changed.")
    p.add_argument("runs", nargs="+", metavar="run", help="run ids or names")
    p.add_argument("--add", action="append", metavar="LIST", help="comma list of tags to add")
    p.add_argument("--remove", action="append", metavar="LIST", help="comma list of tags to remove")


def run(args) -> int:
    from engine.runner.tags import tag_runs

    store = arguments.open_store(args.db, create=False)
    if args.add or args.remove:
        tags = tag_runs(store, args.runs, add=args.add or (), remove=args.remove or ())
    else:
        tags = {run_id: store.runs.get_run(run_id).tags for run_id in store.runs.resolve_runs(args.runs)}
    for run_id, now in tags.items():
        print(f"run {run_id}: tags {', '.join(now) or '-'}")
    return 0
