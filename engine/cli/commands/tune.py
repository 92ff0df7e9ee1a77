"""``tune``: every method of a grid at its own best learning rate (or other float fields) under one
budget, then compared, paired, on fresh seeds and the held-out test split."""

from __future__ import annotations

from engine.cli import arguments
from engine.cli.config_flags import add_config_flags
from engine.config.tuning import PRUNERS
from engine.core.choices import EQUIVALENCE_MARGIN as MARGIN
from engine.reads.tuning_plan import AUTO, AUTO_SEEDS_MAX

TRIALS = 8
TUNE_SEEDS = "1000"


def add_tuning_flags(p, *, tune_default: str | None = "lr") -> None:
    """The protocol's flags (``tune`` and ``reproduce --tune`` share them)."""
    g = p.add_argument_group("tuning options")
    g.add_argument("--tune", default=tune_default, metavar="FIELDS",
                   help="float fields to tune, each FIELD (a decade either side of its value) or FIELD=LOW:HIGH, "
                        "drawn log-uniformly, e.g. lr or lr=0.001:0.1,momentum=0.5:0.99"
                        + (f" (default: {tune_default})" if tune_default else " (default: no tuning)"))
    g.add_argument("--trials", type=int, default=TRIALS,
                   help=f"trials per method: the same points for every method (default: {TRIALS})")
    g.add_argument("--tune-seeds", default=TUNE_SEEDS, metavar="LIST",
                   help=f"seeds the trials train on; disjoint from the evaluation seeds (default: {TUNE_SEEDS})")
    g.add_argument("--sampler-seed", type=int, default=0,
                   help="seed of Optuna's QMC sampler that draws the trial points (default: 0)")
    g.add_argument("--pruner", choices=PRUNERS, default="none",
                   help="stop trials early at an eval whose validation loss falls behind: Optuna's successive-halving "
                        "(halving) or Hyperband pruner; a pruned trial's steps count in its method's budget "
                        "(default: none)")
    g.add_argument("--no-untuned", action="store_true",
                   help="do not also train each method at its untuned values on the evaluation seeds")


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "tune", parents=[arguments.db_parent()],
        help="tune each method's learning rate under one budget, then compare them on fresh seeds and test data",
        description="A tuning campaign: every method of the grid (estimators × ranks × λs, exact once) trains --trials "
                    "trials of the tuned fields, drawn by Optuna's QMC sampler (the same points for every method) on "
                    "--tune-seeds, under the same budget (trials × tuning seeds × steps). Each method's value with "
                    "the lowest mean validation loss at the last step is chosen; then every method trains at its "
                    "chosen value (and at its untuned one) on the evaluation seeds (--seeds; by default as many as "
                    "the power rule asks for), and Table 3 reads the held-out test split. Interrupted, `python -m "
                    "engine resume --all` continues it; the comparison is queued once, whoever ends the last trial.")
    add_config_flags(p, sweep=True)
    for action in p._actions:
        if action.dest == "seeds":
            action.default = AUTO
            action.help = ("comma list or range of evaluation seeds (default: auto, as many as the power rule asks "
                           f"for at the expected spread, at most {AUTO_SEEDS_MAX}, from 0)")
    add_tuning_flags(p)
    arguments.add_concurrent(p)
    arguments.add_queue_only(p)
    arguments.add_yes(p)
    arguments.add_margin(p, f"equivalence margin δ the comparison is planned and judged at (default: {MARGIN:g})")
    p.add_argument("--no-measure", action="store_true",
                   help="do not compile and time a step of models the lab has no finished run of (the estimate is "
                        "then unknown)")
    p.add_argument("--list", action="store_true", help="list the stored campaigns and exit")
    p.add_argument("--show", type=int, metavar="ID", help="print a campaign's protocol, trials and choices, and exit")


def run(args) -> int:
    from engine.cli import tuning

    if args.list or args.show is not None:
        store = arguments.open_store(args.db, create=False)
        return tuning.show(store, args.show)
    import argparse

    from engine.cli.arguments import CliError
    from engine.cli.config_flags import sweep_from_args
    from engine.config import ConfigError

    try:  # the grid's methods; its seeds are the protocol's, never these
        grid = sweep_from_args(argparse.Namespace(**{**vars(args), "seeds": args.tune_seeds}), sweep=True)
    except ConfigError as e:
        raise CliError(str(e)) from None
    return tuning.launch(args, grid)
