"""The tuning protocol: every method of a grid at its own best value of some float fields,
each method under the same budget, then compared on seeds and data nobody tuned on.

A ``TuneSpec`` holds

* the methods: a ``Sweep``'s grid without its seeds (estimators × ranks × λs, exact once);
* the fields tuned (``Range``: a float trajectory field of ``RunConfig``, ``TUNABLE``, drawn
  log-uniformly from [low, high]; by default a decade either side of the schema's default,
  clipped to the field's bounds);
* ``trials`` per method, trained on every ``tune_seeds`` seed, and the ``eval_seeds`` of the
  comparison (disjoint from the tuning seeds: an overlap is refused);
* ``pruner``: none, or Optuna's successive-halving (``halving``) or Hyperband (``hyperband``)
  pruner, which stops a trial at an eval whose loss falls behind its rung (a pruned trial's
  steps count in its method's budget; ``engine.analysis.pruning``);
* the trial points: the first ``trials`` points Optuna's ``QMCSampler`` (scrambled Sobol,
  seeded by ``sampler_seed``) asks for over the log ranges, drawn once and stored with the
  campaign, the same points for every method: each method is tried at the same values.

Every method's budget is trials × tuning seeds × steps training steps. Selection (by
``engine.analysis.tuning``) is by the mean validation loss at the last step over the tuning
seeds; the comparison then runs each method at its chosen values (and, with ``untuned``, at
the base values too) on the evaluation seeds, and Table 3 reads it on the held-out test split.
Plain data: no JAX; Optuna is imported only to draw the points.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from engine.config.fields import ConfigError
from engine.config.run import DEFAULTS, TRAJECTORY, RunConfig, kinds
from engine.config.sweep import Sweep

PRUNERS = ("none", "halving", "hyperband")  # engine.analysis.pruning: Optuna's pruners by these names
TUNE_TAG = "tuned"  # the comparison's runs (a report is built when the last one ends)
TRIAL_TAG = "tune-trial"  # the trials' runs
MAX_TRIALS = 1000
SPAN = 10.0  # the default range: default ÷ SPAN to default × SPAN
SPEC_VERSION = 1


def tunable() -> tuple[str, ...]:
    """The fields a campaign may tune: ``RunConfig``'s float fields that change the trajectory."""
    return tuple(name for name, (kind, _) in kinds(RunConfig).items()
                 if kind is float and RunConfig.__dataclass_fields__[name].metadata["spec"].affects == TRAJECTORY)


@dataclass(frozen=True)
class Range:
    """A tuned field drawn log-uniformly from [low, high] (0 < low < high, inside the field's bounds)."""

    field: str
    low: float
    high: float

    def __post_init__(self):
        names = tunable()
        if self.field not in names:
            raise ConfigError(f"--tune {self.field!r}: only float fields of a run can be tuned ({', '.join(names)})",
                              field="tune")
        low, high = float(self.low), float(self.high)
        if not (math.isfinite(low) and math.isfinite(high) and 0 < low < high):
            raise ConfigError(f"--tune {self.field}={self.low}:{self.high}: a range is LOW:HIGH with 0 < LOW < HIGH "
                              "(drawn log-uniformly), e.g. lr=0.001:0.1", field="tune")
        bound = RunConfig.__dataclass_fields__[self.field].metadata["spec"].high
        if bound is not None and high > bound:
            raise ConfigError(f"--tune {self.field}={low:g}:{high:g}: {self.field} is at most {bound:g}; fix by "
                              f"lowering HIGH to {bound:g} or less", field="tune")
        object.__setattr__(self, "low", low)
        object.__setattr__(self, "high", high)

    @classmethod
    def around(cls, name: str, centre: float | None = None) -> "Range":
        """A decade either side of ``centre`` (default: the schema's default), clipped to the field's bounds."""
        centre = DEFAULTS.get(name) if centre is None else centre
        if not isinstance(centre, float) or centre <= 0:
            raise ConfigError(f"--tune {name}: its default is {centre!r}, which has no decade around it; fix by "
                              f"giving a range, e.g. --tune {name}=0.001:0.1", field="tune")
        bound = RunConfig.__dataclass_fields__[name].metadata["spec"].high if name in tunable() else None
        high = centre * SPAN if bound is None else min(centre * SPAN, bound)
        return cls(name, centre / SPAN, high)

    def text(self) -> str:
        return f"{self.field} log-uniform on [{self.low:g}, {self.high:g}]"


def parse_ranges(text: str | Iterable[str], base: RunConfig | None = None) -> tuple[Range, ...]:
    """``"lr"`` or ``"lr=0.001:0.1, momentum=0.5:0.99"`` → the ranges; a bare field takes a decade
    either side of the base run's value (``base``, else the schema's default)."""
    tokens = [t.strip() for t in (text.replace(";", ",").split(",") if isinstance(text, str) else text) if t.strip()]
    if not tokens:
        raise ConfigError("--tune: name at least one field to tune, e.g. lr or lr=0.001:0.1", field="tune")
    ranges = []
    for token in tokens:
        name, sep, span = (part.strip() for part in token.partition("="))
        if not sep:
            ranges.append(Range.around(name, getattr(base, name, None) if base is not None else None)
                          if name in tunable() else Range(name, 1.0, 2.0))
            continue
        low, colon, high = span.partition(":")
        try:
            bounds = (float(low), float(high)) if colon else None
        except ValueError:
            bounds = None
        if bounds is None:
            raise ConfigError(f"--tune {token!r}: a range is FIELD=LOW:HIGH, e.g. lr=0.001:0.1", field="tune")
        ranges.append(Range(name, *bounds))
    names = [r.field for r in ranges]
    if len(set(names)) < len(names):
        raise ConfigError(f"--tune: each field once (got {', '.join(names)})", field="tune")
    return tuple(ranges)


def qmc_points(ranges: tuple[Range, ...], n: int, seed: int) -> list[dict[str, float]]:
    """The first ``n`` points Optuna's ``QMCSampler`` (scrambled Sobol, ``seed``) asks for over the
    log-uniform ``ranges`` (ask-and-tell, every trial told complete; its first point is the
    sampler's independent draw, as Optuna's QMC sampler does)."""
    import optuna
    from optuna.distributions import BaseDistribution, FloatDistribution

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        sampler = optuna.samplers.QMCSampler(qmc_type="sobol", scramble=True, seed=seed,
                                             warn_independent_sampling=False)
    study = optuna.create_study(sampler=sampler)
    space: dict[str, BaseDistribution] = {r.field: FloatDistribution(r.low, r.high, log=True) for r in ranges}
    points = []
    for _ in range(n):
        trial = study.ask(space)
        points.append({name: float(trial.params[name]) for name in space})
        study.tell(trial, 0.0)
    return points


@dataclass(frozen=True)
class TuneSpec:
    """A tuning campaign's protocol (see the module). ``grid``'s seeds are ignored: the trials
    train on ``tune_seeds``, the comparison on ``eval_seeds``."""

    grid: Sweep
    ranges: tuple[Range, ...]
    trials: int
    tune_seeds: tuple[int, ...]
    eval_seeds: tuple[int, ...]
    sampler_seed: int = 0
    untuned: bool = True
    margin: float | None = None
    pruner: str = "none"
    points: tuple[dict, ...] = field(default=(), compare=False)

    def __post_init__(self):
        if isinstance(self.trials, bool) or not isinstance(self.trials, int) or not 1 <= self.trials <= MAX_TRIALS:
            raise ConfigError(f"--trials must be an integer in [1, {MAX_TRIALS}] (got {self.trials!r})", field="trials")
        if isinstance(self.sampler_seed, bool) or not isinstance(self.sampler_seed, int) or \
                not 0 <= self.sampler_seed < 2**32:
            raise ConfigError(f"--sampler-seed must be an integer in [0, 2**32) (got {self.sampler_seed!r})",
                              field="sampler_seed")
        if self.pruner not in PRUNERS:
            raise ConfigError(f"--pruner {self.pruner!r}: choose one of {', '.join(PRUNERS)}", field="pruner")
        object.__setattr__(self, "ranges", tuple(self.ranges))
        if not self.ranges:
            raise ConfigError("--tune: name at least one field to tune, e.g. lr", field="tune")
        for name in ("tune_seeds", "eval_seeds"):
            seeds = tuple(dict.fromkeys(int(s) for s in getattr(self, name)))
            if not seeds:
                raise ConfigError(f"--{name.replace('_', '-')}: give at least one seed", field=name)
            object.__setattr__(self, name, seeds)
        object.__setattr__(self, "grid", dataclasses.replace(self.grid, seeds=self.tune_seeds))
        overlap = sorted(set(self.tune_seeds) & set(self.eval_seeds))
        if overlap:
            raise ConfigError(f"tuning and evaluation seeds overlap ({', '.join(map(str, overlap))}): a method would be "
                              "judged on seeds it was tuned on; fix by choosing disjoint --tune-seeds and --seeds",
                              field="seed")
        if "lam" in self.fields and self.grid.exact and len(self.fields) == 1:
            raise ConfigError("--tune lam: exact backprop has no λ, so its trials would all be one run; tune lam on a "
                              "grid without exact, or tune lr as well", field="tune")
        if "lam" in self.fields and len(self.grid.lams) > 1:
            raise ConfigError("--tune lam with several --lams: λ is tuned, so give one λ (the base)", field="tune")
        if not self.points:
            object.__setattr__(self, "points", tuple(qmc_points(self.ranges, self.trials, self.sampler_seed)))
        elif len(self.points) != self.trials:
            raise ConfigError(f"a stored campaign holds {len(self.points)} points for {self.trials} trials")

    def base_value(self, name: str) -> float:
        """A tuned field's untuned value: the grid's λ for ``lam`` (one λ when λ is tuned), else the base run's."""
        return float(self.grid.lams[0] if name == "lam" else getattr(self.grid.base, name))

    def at_base(self, config: RunConfig) -> RunConfig:
        """``config`` (a trial or comparison run) with its tuned fields at their untuned values and the
        first tuning seed, no name: equal for the runs of one method."""
        return config.replace(**{f: self.base_value(f) for f in self.fields if self.applies(config, f)},
                              seed=self.tune_seeds[0], name=None)

    @property
    def fields(self) -> tuple[str, ...]:
        return tuple(r.field for r in self.ranges)

    def methods(self) -> list[RunConfig]:
        """One config per method of the grid (at the first tuning seed, the base values of the tuned fields)."""
        grid = Sweep(self.grid.base.replace(name=None), self.grid.estimators, self.grid.ranks, self.grid.lams,
                     (self.tune_seeds[0],), self.grid.with_exact)
        return grid.expand()

    def applies(self, config: RunConfig, name: str) -> bool:
        """Whether tuned field ``name`` means something for ``config`` (exact backprop has no λ)."""
        return not (name == "lam" and config.is_exact)

    def at(self, config: RunConfig, values: Mapping[str, float]) -> RunConfig:
        """``config`` with the tuned ``values`` that apply to it."""
        return config.replace(**{k: float(v) for k, v in values.items() if self.applies(config, k)})

    def trial_configs(self) -> list[tuple[str, int, RunConfig]]:
        """(method, trial index, config) of every trial: each method at each point on each tuning seed."""
        out = []
        for method in self.methods():
            for i, point in enumerate(self.points):
                for seed in self.tune_seeds:
                    config = self.at(method, point).replace(seed=seed)
                    out.append((method.method(), i, config.replace(name=f"trial {i + 1} · {config.label()}")))
        return out

    def eval_configs(self, chosen: Mapping[str, Mapping[str, float]]) -> list[RunConfig]:
        """The comparison: each method at its ``chosen`` values (method label → field → value) on
        every evaluation seed, and with ``untuned`` at the base values too (once, where equal)."""
        out: dict[RunConfig, None] = {}
        for method in self.methods():
            for seed in self.eval_seeds:
                tuned = self.at(method, chosen[method.method()]).replace(seed=seed)
                out[tuned.replace(name=f"tuned · {tuned.label()}")] = None
                if self.untuned:
                    base = method.replace(seed=seed)
                    if base.replace(name=None) != tuned.replace(name=None):
                        out[base.replace(name=f"untuned · {base.label()}")] = None
        return list(out)

    def budget_steps(self) -> int:
        """Each method's training budget: trials × tuning seeds × steps."""
        return self.trials * len(self.tune_seeds) * self.grid.base.steps

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": SPEC_VERSION, "base": self.grid.base.to_dict(), "estimators": list(self.grid.estimators),
            "ranks": list(self.grid.ranks), "lams": list(self.grid.lams), "with_exact": self.grid.with_exact,
            "ranges": [{"field": r.field, "low": r.low, "high": r.high} for r in self.ranges],
            "trials": self.trials, "tune_seeds": list(self.tune_seeds), "eval_seeds": list(self.eval_seeds),
            "sampler_seed": self.sampler_seed, "untuned": self.untuned, "margin": self.margin,
            "points": [dict(p) for p in self.points], "sampler": "optuna QMCSampler (scrambled Sobol)",
            "pruner": self.pruner,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "TuneSpec":
        grid = Sweep(RunConfig.from_dict(d["base"]), tuple(d["estimators"]), tuple(d["ranks"]), tuple(d["lams"]),
                     tuple(d["tune_seeds"]), bool(d["with_exact"]))
        return cls(grid, tuple(Range(**r) for r in d["ranges"]), int(d["trials"]), tuple(d["tune_seeds"]),
                   tuple(d["eval_seeds"]), int(d["sampler_seed"]), bool(d["untuned"]), d.get("margin"),
                   str(d.get("pruner", "none")), tuple(dict(p) for p in d["points"]))
