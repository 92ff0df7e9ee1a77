"""``list``: every run (or those ``--where`` matches), newest first, one line each;
100 columns wide unless ``--wide`` (``engine.cli.listing``)."""

from __future__ import annotations

from engine.cli import arguments


def register(subparsers) -> None:
    p = subparsers.add_parser("list", parents=[arguments.db_parent(), arguments.where_parent()],
                              help="all runs (or those --where matches), newest first")
    p.add_argument("--wide", action="store_true", help="every column, nothing cut (default: fits 100 columns)")


def run(args) -> int:
    from engine.cli.listing import list_text

    store = arguments.open_store(args.db, create=False)
    frame = store.frames.runs_frame()
    if frame.empty:
        print("no runs yet: start one with `python -m engine run` or `python -m engine sweep`")
        return 0
    ids = arguments.where_ids(store, args.where)  # None: no filter (none given, or only white space)
    if ids is not None:
        frame = frame[frame["id"].isin(ids)]
    print(list_text(frame, wide=args.wide))
    return 0
