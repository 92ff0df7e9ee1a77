"""``logs``: a run's log, what its training process warned and logged, and how it ended."""

from __future__ import annotations

from engine.cli import arguments


def register(subparsers) -> None:
    p = subparsers.add_parser("logs", parents=[arguments.db_parent()],
                              help="a run's log: what it warned and logged, and how it ended")
    p.add_argument("run", help="run id or name")
    p.add_argument("--level", choices=("info", "warning", "error"), default="info",
                   help="the least severe level shown (default: info, every line)")


def run(args) -> int:
    from storage import LOG_LEVELS

    store = arguments.open_store(args.db, create=False)
    run_id = store.resolve_runs([args.run])[0]
    lines = store.run_logs(run_id, levels=LOG_LEVELS[LOG_LEVELS.index(args.level):])
    for line in lines:
        print(f"{line.time:%Y-%m-%d %H:%M:%S}  {line.level:<7}  {line.text}")
    if not lines:
        print(f"run {run_id}: no log lines" + ("" if args.level == "info" else f" at {args.level} or above"))
    return 0
