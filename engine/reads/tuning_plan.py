"""The plan of a tuning campaign before anything is written, as the CLI and the Launch form say it:
the evaluation seeds the power rule asks for, and the runs, budget and estimated time."""

from __future__ import annotations

from engine.config import Sweep
from engine.config.tuning import TuneSpec

AUTO = "auto"
AUTO_SEEDS_MAX = 10  # the power rule's evaluation seeds are capped here (--seeds gives more)


def auto_seeds(store, grid: Sweep, delta: float, tune_seeds: tuple[int, ...]) -> tuple[tuple[int, ...], str]:
    """The evaluation seeds the power rule asks for (TOST at ``delta``, power ``POWER``) at each
    sketched method's expected Δ spread (``expected_delta_sd``), at most ``AUTO_SEEDS_MAX``, the
    first that are not tuning seeds; and why, in words."""
    from engine.core.stats import POWER, seeds_needed
    from engine.reads.queries import expected_delta_sd

    configs = grid.expand()
    spreads = expected_delta_sd(store, configs)
    needs = [seeds_needed(sd, delta) for sd, _ in spreads.values()]
    n = AUTO_SEEDS_MAX if any(k is None for k in needs) else max([2, *[k for k in needs if k is not None]])
    n = min(n, AUTO_SEEDS_MAX)
    seeds: list[int] = []
    s = 0
    while len(seeds) < n:
        if s not in tune_seeds:
            seeds.append(s)
        s += 1
    sds = ", ".join(f"{sd:.3f} ({source})" for sd, source in dict.fromkeys(spreads.values()))
    why = (f"{n} evaluation seeds: the power rule's count for TOST at ±{delta:g} with power {POWER:.0%} at the "
           f"expected Δ SD {sds or '—'}" + (f", capped at {AUTO_SEEDS_MAX}" if n == AUTO_SEEDS_MAX else ""))
    return tuple(seeds), why


def plan_lines(spec: TuneSpec, store, concurrent: int, measure: bool = False) -> tuple[list, list, list[str]]:
    """(trial configs, the comparison's configs (at the base values: as many runs as it will train, for
    the launch rule and the estimate), the plan in lines); ``measure``
    times a step of each model the lab has no finished run of (``grid_estimate``)."""
    from engine.core import units
    from engine.reads.estimates import grid_estimate

    trials = [c for _, _, c in spec.trial_configs()]
    base = {m.method(): {f: spec.base_value(f) for f in spec.fields} for m in spec.methods()}
    comparison = spec.eval_configs(base) * (2 if spec.untuned else 1)  # at the chosen and at the untuned values
    tuned_runs = len(spec.methods()) * len(spec.eval_seeds) * (2 if spec.untuned else 1)
    estimate = grid_estimate(store, [*trials, *comparison], concurrent, measure=measure)
    lines = [
        f"tuning {', '.join(r.text() for r in spec.ranges)}: {len(spec.methods())} methods × {spec.trials} trials × "
        f"{len(spec.tune_seeds)} tuning seed(s) = {len(trials)} trial runs; budget {spec.budget_steps():,} steps per "
        "method",
        f"then the comparison: up to {tuned_runs} runs (each method at its chosen value"
        + (" and at its untuned one" if spec.untuned else "") + f") on seeds {', '.join(map(str, spec.eval_seeds))}",
        "estimated time: " + (units.format_seconds(estimate.seconds) if estimate.known else "unknown")
        + f" ({concurrent} at a time)",
    ]
    return trials, comparison, lines
