"""Launching and showing tuning campaigns from the command line (``tune``, ``reproduce --tune``).

Before anything is written: the protocol is checked (ranges, seeds, grid: one line each), the
evaluation seeds are chosen (``--seeds``, or by the power rule at the spread the lab expects),
and the plan is printed: runs, each method's budget and the estimated time, with ``sweep``'s
confirmation rule above ``LARGE_LAUNCH`` runs."""

from __future__ import annotations

import sys
from typing import Any

import pandas as pd

from engine.cli.arguments import CliError, at_least, margin, open_store
from engine.config import ConfigError, Sweep, parse_seeds
from engine.config.tuning import TuneSpec, parse_ranges
from engine.reads.tuning_plan import AUTO, auto_seeds, plan_lines


def spec_from_args(args, grid: Sweep, open_db) -> tuple[TuneSpec, str, Any]:
    """The protocol the flags describe (``grid``'s seeds are replaced), a line on its seeds, and
    the store: every flag is checked before ``open_db()`` opens (or creates) the database, which
    the power rule's evaluation seeds read."""
    at_least(args.trials, "--trials", 1)
    delta = margin(args.margin)
    try:
        tune_seeds = tuple(parse_seeds(args.tune_seeds))
        ranges = parse_ranges(args.tune, grid.base.replace(lam=grid.lams[0]))
        auto = str(args.seeds).strip().lower() == AUTO
        eval_seeds = (next(s for s in range(len(tune_seeds) + 1) if s not in tune_seeds),) if auto \
            else tuple(parse_seeds(args.seeds))

        def spec(seeds: tuple[int, ...]) -> TuneSpec:
            return TuneSpec(grid, ranges, args.trials, tune_seeds, seeds, args.sampler_seed,
                            untuned=not args.no_untuned, margin=delta, pruner=args.pruner)

        checked = spec(eval_seeds)  # every check, before anything is opened or written
        store = open_db()
        if not auto:
            return checked, "evaluation seeds as given (--seeds)", store
        eval_seeds, why = auto_seeds(store, grid, delta, tune_seeds)
        return spec(eval_seeds), why, store
    except ConfigError as e:
        raise CliError(str(e)) from None


def launch(args, grid_of) -> int:
    """``tune`` (and ``reproduce --tune``): plan, confirm, store the campaign, train or queue it."""
    from engine.cli.foreground import train_here
    from engine.cli.launch import confirmed
    from engine.runner import campaigns
    from engine.runner.preflight import check_data

    at_least(args.concurrent, "--concurrent", 1)
    spec, why, store = spec_from_args(args, grid_of, lambda: open_store(args.db))
    trials, comparison, lines = plan_lines(spec, store, 1 if args.queue_only else args.concurrent,
                                           measure=not args.no_measure)
    print(f"note: {why}", file=sys.stderr)
    for line in lines:
        print(line, file=sys.stderr)
    confirmed(args, [*trials, *comparison], "fewer --trials/--seeds/--ranks")
    check_data([*trials, *comparison])
    if args.queue_only:
        cid, ids = campaigns.start(store, spec)
        print(f"campaign {cid}: queued {len(ids)} trial(s) for workers in {store.url}; the comparison is queued when "
              "the last trial ends; start workers with `python -m engine worker`")
        return 0
    state: dict = {}

    def start(manager):
        state["id"], ids = campaigns.start(store, spec, owner=manager.owner)
        manager.train(ids)
        print(f"campaign {state['id']}: {len(ids)} trial(s) queued in {store.url}", file=sys.stderr)
        return ids

    def then(manager):
        manager.train(campaigns.advance(store, state["id"], owner=manager.owner))  # if no trial's end did it
        return store.campaigns.runs_of(state["id"])[1]

    code = train_here(store, start, args.concurrent, then=then)
    if "id" in state:
        show(store, state["id"])
        if code == 1 and _ended_well(store, state["id"]):
            code = 0  # every run finished, or was a trial its pruner stopped
    return code


def _ended_well(store, campaign_id: int) -> bool:
    """Whether every run of the campaign finished or is a trial its pruner stopped."""
    from engine.analysis.pruning import PRUNED

    trials, comparison = store.campaigns.runs_of(campaign_id)
    runs = [store.runs.get_run(i) for i in [*trials, *comparison]]
    return bool(comparison) and all(r.status == "finished" or (r.status == "cancelled" and (r.error or "").startswith(
        PRUNED)) for r in runs)


def _frame_text(frame: pd.DataFrame) -> str:
    return frame.to_string(index=False) if len(frame) else "(none)"


def show(store, campaign_id: int | None) -> int:
    """Print the stored campaigns (``campaign_id`` None), or one campaign's protocol, choices,
    trials and, once its comparison has read, its tuned and untuned Table 3."""
    from engine.analysis import tuning
    from engine.reads import campaigns

    if campaign_id is None:
        rows = [{"id": c.id, "name": c.name, "stage": c.stage, "trials sweep": c.tune_sweep_id,
                 "comparison sweep": c.eval_sweep_id or "—"} for c in store.campaigns.list()]
        print(_frame_text(pd.DataFrame(rows)))
        return 0
    campaign = store.campaigns.get(campaign_id)
    spec = campaigns.spec_of(campaign)
    frame = campaigns.trials(store, campaign)
    choices = tuning.choose(spec, frame)
    print(f"campaign {campaign.id} {campaign.name}: {campaign.stage}")
    for what, how in tuning.protocol(spec, choices):
        print(f"  {what}: {how}")
    print("\nchosen per method:\n" + _frame_text(tuning.choice_table(choices)))
    print("\ntrials:\n" + _frame_text(frame.drop(columns=["diverged"])))
    for title, table in campaigns.comparison_tables(store, campaign):
        from engine.analysis.summary import render

        print(f"\n{title}:\n" + render(table))
    return 0
