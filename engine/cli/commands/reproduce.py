"""``reproduce``: train (or queue) the paper's grid, its estimated time printed first."""

from __future__ import annotations

import sys

from engine.cli import arguments
from engine.config import PAPER_STEPS, REPRODUCE_SEEDS
from engine.core.choices import EQUIVALENCE_MARGIN as MARGIN

_SEEDS = ",".join(map(str, REPRODUCE_SEEDS))


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "reproduce", parents=[arguments.db_parent()],
        help="the paper's grid: exact and basis R=1,8,16,32,64 (λ 0.01), tagged reproduce",
        description="Train (or with --queue-only, queue) the paper's grid: the paper preset, exact backprop and basis "
                    "at R = 1, 8, 16, 32, 64 with λ = 0.01, over seeds, tagged 'reproduce'. The estimated time is "
                    "printed first. With --tune, each method is first tuned under one budget (as `python -m engine "
                    "tune`), then the grid trains at each method's chosen value on --seeds and is read on the test "
                    "split. When its last run ends, the sweep's report is built and stored (`python -m "
                    "engine report --sweep ID --out report.html` writes it).")
    p.add_argument("--steps", type=int, default=PAPER_STEPS, help=f"steps per run (default: {PAPER_STEPS:,}, the paper's)")
    p.add_argument("--seeds", default=_SEEDS, metavar="LIST", help=f"comma list or range of seeds (default: {_SEEDS})")
    arguments.add_concurrent(p)
    arguments.add_yes(p)
    arguments.add_queue_only(p)
    arguments.add_margin(p, f"equivalence margin δ of a Δ val loss vs exact (default: {MARGIN:g}): the seeds are "
                            "checked for the power to decide it before anything starts")
    from engine.cli.commands.tune import add_tuning_flags

    add_tuning_flags(p, tune_default=None)
    p.add_argument("--no-measure", action="store_true",
                   help="do not compile and time a step of models the lab has no finished run of (the estimate "
                        "is then unknown)")


def run(args) -> int:
    from engine.cli.foreground import train_here
    from engine.cli.launch import confirmed
    from engine.config import parse_seeds, reproduction_sweep
    from engine.runner.jobs import new_sweep_id, queue_runs
    from engine.runner.preflight import check_data

    arguments.at_least(args.steps, "--steps", 1)
    arguments.at_least(args.concurrent, "--concurrent", 1)
    margin = arguments.margin(args.margin)
    if args.tune:  # each method at its own best value first, then the paper's grid on the evaluation seeds
        from engine.cli import tuning

        return tuning.launch(args, reproduction_sweep(args.steps, parse_seeds(args.tune_seeds)))
    sweep = reproduction_sweep(args.steps, parse_seeds(args.seeds))
    configs = sweep.expand()
    confirmed(args, configs, "fewer --seeds")
    store = arguments.open_store(args.db)
    check_data(configs)
    _estimate(args, store, sweep, configs, margin)
    sweep_id = new_sweep_id()
    if args.queue_only:
        ids = queue_runs(store, configs, sweep_id=sweep_id, tags=sweep.tags)
        print(f"queued {len(ids)} run(s) for workers in {store.url}: sweep {sweep_id}, ids {ids}; start one with "
              "`python -m engine worker`; its report is stored when the last run ends")
        return 0

    def start(manager):
        ids = manager.submit(configs, sweep_id=sweep_id, tags=sweep.tags)
        print(f"queued {len(ids)} run(s) in {store.url}: sweep {sweep_id}, ids {ids}", file=sys.stderr)
        return ids

    code = train_here(store, start, args.concurrent)
    reports = store.reports.list_reports(sweep_id=sweep_id)
    if reports:
        print(f"report {reports[0].id} of sweep {sweep_id} stored; write it with `python -m engine report --sweep "
              f"{sweep_id} --out report.html` (or .md), or open the dashboard's Report page")
    return code


def _estimate(args, store, sweep, configs, margin: float) -> None:
    """Print the seed advice at ``margin``, what the grid is, and its estimated time."""
    from engine.reads.estimates import grid_estimate
    from engine.reads.queries import relaunch_warning, seed_plan

    if (plan := seed_plan(store, configs, margin)) is not None:
        print(f"warning: {plan} (--seeds)", file=sys.stderr)
    if (again := relaunch_warning(store, configs)) is not None:
        print(f"warning: {again}", file=sys.stderr)
    seeds = ", ".join(map(str, sweep.seeds))
    print(f"the paper's grid: {len(configs)} runs (exact and basis R={','.join(map(str, sweep.ranks))}, "
          f"λ={sweep.lams[0]:g}; seeds {seeds}), {args.steps:,} steps each, tagged {', '.join(sweep.tags)}",
          file=sys.stderr)
    if not args.no_measure:
        print("estimating: the step time of each model, from the lab's finished runs or measured now…", file=sys.stderr)
    estimate = grid_estimate(store, configs, 1 if args.queue_only else args.concurrent, measure=not args.no_measure)
    where = "by one worker" if args.queue_only else f"{args.concurrent} run{'s' if args.concurrent > 1 else ''} at a time"
    print(f"estimated time ({where}): {estimate.text()}", file=sys.stderr)
