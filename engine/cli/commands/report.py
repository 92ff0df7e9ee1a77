"""``report``: build, store and write the report of a sweep, tagged runs or a list of runs."""

from __future__ import annotations

import sys

from engine.cli import arguments
from engine.cli.arguments import CliError
from engine.cli.output import table_text
from engine.core.choices import EQUIVALENCE_MARGIN as MARGIN


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "report", parents=[arguments.db_parent()],
        help="a report of a sweep, tagged runs or a list of runs: HTML or Markdown",
        description="Build the report of a set of runs from the database (setup, Table 3 with paired Δ, 95% CI and "
                    "verdicts, the claims table, figures, diagnoses), store it with them and write it: .html is one "
                    "self-contained file with interactive figures (no network), .md is Markdown with SVG figures in "
                    "a folder beside it. Building a selection again replaces its stored report.")
    chosen = p.add_mutually_exclusive_group()
    chosen.add_argument("--sweep", metavar="ID", help="the runs of one sweep (`python -m engine list` shows sweep ids)")
    chosen.add_argument("--tags", metavar="LIST", help="the runs carrying every one of these tags (comma list)")
    chosen.add_argument("--runs", nargs="+", metavar="RUN", help="run ids or names")
    chosen.add_argument("--id", type=int, help="a stored report (`--list` shows them): write it as it was built")
    arguments.add_at_step(p, "read every run at this step (default: per config, the latest step all its runs reached)")
    arguments.add_margin(p, f"equivalence margin δ of Table 3 and claim (c) (default: {MARGIN:g}; a stored "
                            "report rebuilt with --rebuild keeps its own)", default=None)
    arguments.add_no_adjust(p)
    p.add_argument("--out", help="file to write: report.html or report.md")
    arguments.add_force(p)
    p.add_argument("--rebuild", action="store_true", help="with --id: build that report again from the database")
    p.add_argument("--list", action="store_true", help="list the stored reports instead")


def run(args) -> int:
    from engine.reads import reports

    store = arguments.open_store(args.db, create=False)
    if args.list:
        return _list(store)
    if args.out:
        reports.format_of(args.out)  # a bad suffix fails before anything is built
    margin = None if args.margin is None else arguments.margin(args.margin)

    def checked(report):
        """``report`` once ``--out`` may be written (its figure folder too): else nothing is stored."""
        if args.out:
            reports.check_output(report, args.out, force=args.force)
        return report

    if args.id is not None:
        report_id, built = _stored(args, store, margin, checked)
    else:
        report_id, built = _build(args, store, margin, checked)
    for v in built.verdicts:
        print(f"({v.key}) {v.verdict}: {v.sentence}" + (f"\n    to decide it: {v.power}" if v.power else ""),
              file=sys.stderr)
    if args.out:
        written = reports.write(built, args.out, force=args.force)
        extra = f" and {len(written) - 1} figure(s) in {written[1].parent}" if len(written) > 1 else ""
        print(f"wrote {written[0]}{extra}")
    elif args.id is None or args.rebuild:
        print(f"write it with `python -m engine report --id {report_id} --out report.html` (or .md)")
    return 0


def _list(store) -> int:
    """Print the stored reports."""
    import pandas as pd

    listed = store.reports.list_reports()
    if not listed:
        print("no reports yet: build one with `python -m engine report --sweep ID --out report.html`")
        return 0
    frame = pd.DataFrame([{"id": r.id, "title": r.title, "runs": len(r.run_ids), "at step": "latest" if r.at_step is None else str(int(r.at_step)),
                           "built (UTC)": r.created_at.strftime("%Y-%m-%d %H:%M:%S") if r.created_at else None}
                          for r in listed])
    print(table_text(frame))
    return 0


def _stored(args, store, margin, checked):
    """``--id``: the stored report as it was built, or with ``--rebuild`` built again."""
    from engine.reads import reports

    if args.at_step is not None:
        raise CliError("--at-step builds a new report; with --id the stored report keeps its own step")
    if margin is not None:
        raise CliError("--margin builds a new report; with --id the stored report keeps its own margin")
    if not args.rebuild:
        return args.id, checked(reports.load(store, args.id))
    report_id, built = reports.rebuild(store, args.id, check=checked)
    print(f"rebuilt report {report_id} from the database", file=sys.stderr)
    return report_id, built


def _build(args, store, margin, checked):
    """A new report of the selection ``--sweep``, ``--tags`` or ``--runs`` names, stored."""
    from engine.reads import reports

    if args.rebuild:
        raise CliError("--rebuild needs --id (a stored report); building a selection always reads the database")
    runs = store.runs.resolve_runs(args.runs) if args.runs else None
    tags = [t for t in (args.tags or "").split(",") if t.strip()] or None
    selection = reports.selection_of(sweep=args.sweep, tags=tags, runs=runs, at_step=args.at_step, margin=margin,
                                     adjust=not args.no_adjust)
    built = checked(reports.build(store, selection))
    report_id = reports.save(store, built)
    print(f"stored as report {report_id}: {built.title} ({len(built.run_ids)} runs)", file=sys.stderr)
    return report_id, built
