"""``summary``: the paper's Table 3, seeds paired at one step, Δ vs exact with a 95 % t-interval."""

from __future__ import annotations

import sys

from engine.cli import arguments
from engine.core.choices import EQUIVALENCE_MARGIN as MARGIN
from engine.core.choices import SUMMARY_FORMATS


def register(subparsers) -> None:
    p = subparsers.add_parser("summary", parents=[arguments.db_parent(), arguments.where_parent()],
                              help="the paper's Table 3: seeds paired at one trained step, Δ vs exact with its intervals and "
                                   "verdicts, and where and why it was read")
    p.add_argument("--runs", nargs="*", help="run ids or names (default: all)")
    arguments.add_at_step(p, "compare every run at this step (default: per config, the latest step all its runs reached)")
    p.add_argument("--format", default="table", choices=SUMMARY_FORMATS)
    arguments.add_margin(p, f"equivalence margin δ: a Δ val loss whose 90%% interval lies inside ±δ reads "
                            f"'equivalent' (default: {MARGIN:g})")
    arguments.add_no_adjust(p)
    p.add_argument("--out", help="file to write instead of stdout")
    arguments.add_force(p)


def run(args) -> int:
    from engine.reads.queries import run_table3, table3_text
    from storage.export import write_file

    arguments.at_least(args.at_step, "--at-step", 0)
    margin = arguments.margin(args.margin)
    store = arguments.open_store(args.db, create=False)
    ids = arguments.where_ids(store, args.where, store.runs.resolve_runs(args.runs) if args.runs else None)
    text = table3_text(run_table3(store, ids, at_step=args.at_step, margin=margin, adjust=not args.no_adjust), args.format)
    if args.out:
        write_file(store, args.out, text, force=args.force)
        print(f"wrote the summary to {args.out} ({args.format})", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0
