"""``export``: every metric value of the runs as CSV, or as TensorBoard event files."""

from __future__ import annotations

from engine.cli import arguments


def register(subparsers) -> None:
    p = subparsers.add_parser("export", parents=[arguments.db_parent(), arguments.where_parent()],
                              help="metric histories as CSV or TensorBoard event files",
                              description="Every metric value of the runs as CSV, with each run's status, sweep, tags, "
                                          "notes and effective B, T, R; the README's column dictionary says what "
                                          "each column holds. With --format tensorboard, a folder per run in the "
                                          "directory OUT: `tensorboard --logdir OUT` charts the metrics and lists "
                                          "each run's config and method in its HParams view.")
    p.add_argument("out_path", nargs="?", metavar="OUT",
                   help="the CSV file, or with --format tensorboard the directory (or give it as --out)")
    p.add_argument("--out", help="the CSV file, or with --format tensorboard the directory (new or empty)")
    p.add_argument("--runs", nargs="*", help="run ids or names (default: all)")
    p.add_argument("--format", default="long", choices=("long", "wide", "tensorboard"),
                   help="long: a CSV row per metric value (default); wide: a CSV row per run and step; tensorboard: "
                        "event files, a folder <id>-<name> per run")
    arguments.add_force(p)


def _out(args) -> str:
    """The output the command was given, as OUT or as --out (not both)."""
    if args.out_path is not None and args.out is not None and args.out_path != args.out:
        raise arguments.CliError(f"two outputs given ({args.out_path!r} and --out {args.out!r}); give one")
    out = args.out if args.out is not None else args.out_path
    if out is None:
        raise arguments.CliError("no output given; name it, as in `export --format tensorboard DIR` or "
                                 "`export --out runs.csv` (a path after --runs is read as a run: put it first)")
    return out


def run(args) -> int:
    out = _out(args)
    store = arguments.open_store(args.db, create=False)
    ids = arguments.where_ids(store, args.where, store.runs.resolve_runs(args.runs) if args.runs else None)
    if args.format == "tensorboard":
        from engine.runner.tensorboard import export_tensorboard

        folders = export_tensorboard(store, ids, out, force=args.force)
        n = len(folders)
        print(f"wrote {n} run folder{'s' if n != 1 else ''} to {out}; `tensorboard --logdir {out}` shows "
              f"{'it' if n == 1 else 'them'}")
        return 0
    from engine.config import shape_columns
    from storage import export_csv

    n = export_csv(store, out, ids, fmt=args.format, force=args.force, shape=shape_columns)
    print(f"wrote {n} rows to {out} ({args.format})")
    return 0
