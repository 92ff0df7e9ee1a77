"""``logs``: a run's log: what its training printed, warned and logged, its progress, and how it ended.

``--level`` shows a level and the more severe ones, ``--grep`` the lines whose text or source
holds a text (case-insensitive), ``--follow`` keeps printing new lines until the run has ended
(or Ctrl-C)."""

from __future__ import annotations

import time

from engine.cli import arguments

FOLLOW_S = 1.0  # seconds between two reads of a followed run's new lines
SETTLE_READS = 2  # reads without a new line, once the run has ended, before --follow stops


def register(subparsers) -> None:
    p = subparsers.add_parser("logs", parents=[arguments.db_parent()],
                              help="a run's log: what it printed, warned and logged, and how it ended")
    p.add_argument("run", help="run id or name")
    p.add_argument("--level", choices=("debug", "info", "warning", "error"), default="info",
                   help="the least severe level shown (default: info, every line but debug)")
    p.add_argument("--grep", metavar="TEXT", default=None,
                   help="only the lines whose text or source (stdout, stderr, warning, a logger) holds TEXT, any case")
    p.add_argument("--follow", "-f", action="store_true",
                   help="keep printing new lines while the run is queued or running (Ctrl-C stops)")


def _print(lines) -> None:
    for line in lines:
        print(f"{line.time:%Y-%m-%d %H:%M:%S}  {line.level:<7}  {line.shown}", flush=True)


def _follow(store, run_id: int, after_id: int, read) -> None:
    """Print the run's new lines every ``FOLLOW_S`` until it has ended and nothing more came."""
    from storage import ACTIVE_STATUSES

    quiet = 0
    while quiet < SETTLE_READS:
        time.sleep(FOLLOW_S)
        ended = store.runs.get_run(run_id).status not in ACTIVE_STATUSES  # read before the lines: none is missed
        lines = read(after_id)
        _print(lines)
        after_id = lines[-1].id if lines else after_id
        quiet = quiet + 1 if ended and not lines else 0


def run(args) -> int:
    from storage import LOG_LEVELS

    store = arguments.open_store(args.db, create=False)
    run_id = store.runs.resolve_runs([args.run])[0]
    levels = LOG_LEVELS[LOG_LEVELS.index(args.level):]

    def read(after_id: int):
        return store.logs.run_logs(run_id, after_id=after_id, levels=levels, search=args.grep)

    lines = read(0)
    _print(lines)
    if not lines:
        shown = ("" if args.level == "info" else f" at {args.level} or above") + \
                (f" holding {args.grep!r}" if args.grep else "")
        print(f"run {run_id}: no log lines{shown}" + (" yet" if args.follow else ""), flush=True)
    if args.follow:
        try:
            _follow(store, run_id, lines[-1].id if lines else 0, read)
        except KeyboardInterrupt:
            return 130
    return 0
