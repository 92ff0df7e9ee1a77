"""``export``: every metric value of the runs as CSV."""

from __future__ import annotations

from engine.cli import arguments


def register(subparsers) -> None:
    p = subparsers.add_parser("export", parents=[arguments.db_parent(), arguments.where_parent()],
                              help="metric histories as CSV",
                              description="Every metric value of the runs as CSV, with each run's status, sweep, tags, "
                                          "notes and effective B, T, R; the README's column dictionary says what "
                                          "each column holds.")
    p.add_argument("--out", required=True, help="CSV file to write")
    p.add_argument("--runs", nargs="*", help="run ids or names (default: all)")
    p.add_argument("--format", default="long", choices=("long", "wide"))
    arguments.add_force(p)


def run(args) -> int:
    from engine.config import shape_columns
    from storage import export_csv

    store = arguments.open_store(args.db, create=False)
    ids = arguments.where_ids(store, args.where, store.resolve_runs(args.runs) if args.runs else None)
    n = export_csv(store, args.out, ids, fmt=args.format, force=args.force, shape=shape_columns)
    print(f"wrote {n} rows to {args.out} ({args.format})")
    return 0
