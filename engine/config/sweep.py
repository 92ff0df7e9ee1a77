"""Sweeps: a base run times estimators × ranks × λs × seeds, the parsers of the swept
lists a user types, and the flat form of a config that CLI flags and form widgets use.

``Sweep.expand()`` clips every rank to the rows each device sketches, B·T / devices
(a sketch cannot have more rows than its input, and a device sketches only its own
rows), so two ranks that clip to the same effective R are one run, and
``Sweep.clipped()`` says which ranks clipped.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from engine.config.fields import DATA_OPTIONS, ConfigError
from engine.config.run import DEFAULTS, NAME_MAX, SWEPT_NAMES, RunConfig, default_of, kinds, validate
from engine.core.choices import ESTIMATORS


def parse_ranks(text: str | Iterable[object]) -> tuple[bool, list[int]]:
    """``"exact, 1, 8, 32"`` → (True, [1, 8, 32]): exactly the numbers typed, in order,
    duplicates dropped; ``exact`` adds an exact-backprop run per seed."""
    with_exact, ranks = False, []
    for token in _tokens(text):
        if token == "exact":
            with_exact = True
            continue
        try:
            rank = int(token)
        except ValueError:
            raise ConfigError(f"ranks: {token!r} is neither 'exact' nor an integer >= 1 (e.g. exact, 1, 8, 32)", field="rank") from None
        if rank < 1:
            raise ConfigError(f"ranks: {rank} is not an integer >= 1 (e.g. exact, 1, 8, 32)", field="rank")
        if rank not in ranks:
            ranks.append(rank)
    if not with_exact and not ranks:
        raise ConfigError("ranks: give at least one rank or 'exact' (e.g. exact, 1, 8, 32)", field="rank")
    return with_exact, ranks


def parse_seeds(text: str) -> list[int]:
    """``"0"`` → [0]; ``"0,1,2"``, ``"0 1 2"`` and ``"0-2"`` → [0, 1, 2]; order kept,
    duplicates dropped."""
    seeds: list[int] = []
    tokens = _tokens(text)
    if not tokens:
        raise ConfigError("seeds: give at least one seed, e.g. 0 or 0,1,2 or 0-4", field="seed")
    for token in tokens:
        lo, sep, hi = token.partition("-")
        try:
            span = range(int(lo), int(hi) + 1) if sep else [int(token)]
        except ValueError:
            raise ConfigError(f"seeds: {token!r} is not a seed (integers >= 0: 0,1,2 or 0-4)", field="seed") from None
        if sep and int(hi) < int(lo):
            raise ConfigError(f"seeds: range {token!r} is empty; write low-high, e.g. 0-4", field="seed")
        if len(span) > 10_000:
            raise ConfigError(f"seeds: range {token!r} holds {len(span):,} seeds; at most 10,000", field="seed")
        for seed in span:
            _validate_field("seed", seed)
            if seed not in seeds:
                seeds.append(seed)
    return seeds


def parse_lams(text: str | Iterable[object]) -> list[float]:
    """``"0, 0.01"`` → [0.0, 0.01]: every λ in [0, 1), order kept, duplicates dropped."""
    lams: list[float] = []
    for token in _tokens(text):
        try:
            lam = float(token)
        except ValueError:
            raise ConfigError(f"lams: {token!r} is not a number in [0, 1) (e.g. 0, 0.01)", field="lam") from None
        _validate_field("lam", lam)
        if lam not in lams:
            lams.append(lam)
    if not lams:
        raise ConfigError("lams: give at least one λ in [0, 1), e.g. 0 or 0, 0.01", field="lam")
    return lams


def parse_estimators(text: str | Iterable[object]) -> list[str]:
    """``"exact, basis"`` → ["exact", "basis"], each one of ``ESTIMATORS``."""
    out = []
    for token in _tokens(text):
        if token not in ESTIMATORS:
            raise ConfigError(f"unknown estimator {token!r}; choose from {', '.join(ESTIMATORS)}", field="estimator")
        if token not in out:
            out.append(token)
    if not out:
        raise ConfigError(f"estimators: choose at least one of {', '.join(ESTIMATORS)}", field="estimator")
    return out


def _tokens(text: str | Iterable[object]) -> list[str]:
    if not isinstance(text, str):
        text = ",".join(map(str, text))
    return [t for t in text.replace(",", " ").split() if t]


def _validate_field(name: str, value: Any) -> None:
    f = next(f for f in dataclasses.fields(RunConfig) if f.name == name)
    validate(f, *kinds(RunConfig)[name], value)


@dataclass(frozen=True)
class Clip:
    """A requested rank that the rows on each device (B·T / devices) clip to ``effective``."""

    requested: int
    effective: int
    rows: int  # B·T
    devices: int = 1

    def __str__(self) -> str:
        if self.devices <= 1:
            return f"R={self.requested} clips to R={self.effective} (B·T = {self.rows} rows)"
        return (f"R={self.requested} clips to R={self.effective} (the rows on each device: "
                f"B·T / devices = {self.rows} / {self.devices})")


_BASE_VALUE: Any = None  # a Sweep axis left None: the base's value

RUN_NAME_SEP = " · "  # between a sweep's name and each run's label: ``name · basis R=8 s0``


@dataclass(frozen=True)
class Sweep:
    """``base`` × estimators × ranks × λs × seeds; exact backprop once per seed when
    ``with_exact`` (or ``exact`` is among the estimators). An axis left None is the
    base's own value; the base keeps defaults in the swept fields, so equal sweeps
    compare equal. ``tags`` label every run."""

    base: RunConfig
    # Given as None (the default): the base's value.  Typed as what they hold once built.
    estimators: tuple[str, ...] = _BASE_VALUE
    ranks: tuple[int, ...] = _BASE_VALUE
    lams: tuple[float, ...] = _BASE_VALUE
    seeds: tuple[int, ...] = _BASE_VALUE
    with_exact: bool = False
    tags: tuple[str, ...] = ()

    def __post_init__(self):
        for name, plural in (("estimator", "estimators"), ("rank", "ranks"), ("lam", "lams"), ("seed", "seeds")):
            values = getattr(self, plural)
            values = (getattr(self.base, name),) if values is None else tuple(values)
            for v in values:
                _validate_field(name, v)
            object.__setattr__(self, plural, values)
        object.__setattr__(self, "tags", tuple(self.tags))
        object.__setattr__(self, "base", self.base.replace(**{n: DEFAULTS[n] for n in SWEPT_NAMES}))
        if not self.seeds:
            raise ConfigError("seeds: give at least one seed (e.g. 0,1,2)")
        if self.sketched and not self.ranks:
            raise ConfigError(f"ranks: estimators {list(self.sketched)} need at least one rank (e.g. 1, 8, 32)")
        if not self.sketched and not self.exact:
            raise ConfigError("the sweep is empty: choose at least one estimator with ranks, or exact")

    @property
    def sketched(self) -> tuple[str, ...]:
        return tuple(e for e in self.estimators if e != "exact")

    @property
    def exact(self) -> bool:
        return self.with_exact or "exact" in self.estimators

    def clipped(self) -> list[Clip]:
        """The requested ranks larger than the rows on each device, and what they clip to."""
        local, rows = self.base.local_rows, self.base.rows
        return [Clip(r, local, rows, self.base.devices) for r in self.ranks if r > local] if self.sketched else []

    def expand(self) -> list[RunConfig]:
        """One validated config per (seed, estimator, effective rank, λ), exact once per
        seed (λ = 0); a rank above the rows on each device (B·T / devices) becomes that
        number, and duplicates are dropped."""
        configs: list[RunConfig] = []
        for seed in self.seeds:
            if self.exact:
                configs.append(self.base.replace(estimator="exact", lam=0.0, seed=seed, name=None))
            for estimator in self.sketched:
                for rank in self.ranks:
                    for lam in self.lams:
                        configs.append(self.base.replace(
                            estimator=estimator, rank=min(rank, self.base.local_rows), lam=lam, seed=seed, name=None))
        configs = list(dict.fromkeys(configs))
        if self.base.name:
            if len(configs) == 1:
                return [configs[0].replace(name=self.base.name)]
            longest = max((c.label() for c in configs), key=len)
            room = NAME_MAX - len(RUN_NAME_SEP) - len(longest)
            if len(self.base.name) > room:
                raise ConfigError(
                    f"name: each run of this sweep is named '<name>{RUN_NAME_SEP}<run label>' (its longest label, "
                    f"{longest!r}, takes {len(RUN_NAME_SEP) + len(longest)} of the {NAME_MAX} characters), so the "
                    f"name you typed may have at most {max(room, 0):,} characters here; it has "
                    f"{len(self.base.name):,}: shorten it", field="name")
            configs = [c.replace(name=f"{self.base.name}{RUN_NAME_SEP}{c.label()}") for c in configs]
        return configs


SWEEP_AXES = {  # swept field → (plural name, parser of its text)
    "estimator": ("estimators", parse_estimators),
    "rank": ("ranks", parse_ranks),
    "lam": ("lams", parse_lams),
    "seed": ("seeds", parse_seeds),
}


def from_flat(values: Mapping[str, Any], cls: type = RunConfig) -> RunConfig:
    """A config from flat values (CLI flags, form widgets): schema fields by name, and
    the ``DATA_OPTIONS`` of the chosen dataset gathered into ``dataset_options``
    (empty text and None are left out). Fields not given take their defaults."""
    names = {f.name for f in dataclasses.fields(cls)}
    fields_ = {k: v for k, v in values.items() if k in names and k != "dataset_options"}
    dataset = fields_.get("dataset", default_of(next(f for f in dataclasses.fields(cls) if f.name == "dataset")))
    options = {}
    for opt in DATA_OPTIONS:
        value = values.get(opt.name)
        if isinstance(value, str):
            value = value.strip()
        if dataset in opt.sources and value not in (None, ""):
            options[opt.name] = value
    return cls(**fields_, dataset_options=options)


def sweep_from_flat(values: Mapping[str, Any], cls: type = RunConfig) -> Sweep:
    """The ``Sweep`` flat values describe (CLI flags, form widgets): the swept lists as
    typed, under their plural names (``SWEEP_AXES``; ``exact`` among the ranks adds exact
    backprop once per seed), and every other field through ``from_flat``. A sweep with
    no sketched estimator and no rank keeps the schema's default rank."""
    with_exact, ranks = parse_ranks(values.get("ranks") or "")
    estimators = parse_estimators(values.get("estimators") or "")
    if not [e for e in estimators if e != "exact"] and not ranks:
        ranks = [default_of(next(f for f in dataclasses.fields(cls) if f.name == "rank"))]
    base = from_flat({k: v for k, v in values.items() if k not in SWEPT_NAMES}, cls)
    return Sweep(base, estimators=tuple(estimators), ranks=tuple(ranks), lams=tuple(parse_lams(values.get("lams") or "")),
                 seeds=tuple(parse_seeds(values.get("seeds") or "")), with_exact=with_exact)


def to_flat(config: RunConfig) -> dict[str, Any]:
    """The inverse of ``from_flat``: every field, and each data option (its default when unset)."""
    flat = config.to_dict()
    options = flat.pop("dataset_options")
    for opt in DATA_OPTIONS:
        flat[opt.name] = options.get(opt.name, opt.default)
    return flat


LARGE_LAUNCH = 100  # a launch of more runs than this is confirmed first (form: a tick; CLI: --yes)


def needs_confirmation(n_runs: int) -> bool:
    """The one rule for every launch (``sweep``, ``reproduce``, the Launch form and its
    "Reproduce the paper"): more than ``LARGE_LAUNCH`` runs are launched only once confirmed."""
    return n_runs > LARGE_LAUNCH


@dataclass(frozen=True)
class LaunchWarning:
    """Something about a launch worth a second look: ``field`` is the run field it is
    about (shown beside that field), None for the launch as a whole."""

    field: str | None
    text: str


def launch_warnings(configs) -> list[LaunchWarning]:
    """What to check before launching ``configs``: more than ``LARGE_LAUNCH`` runs (a
    seed range such as 0-999 multiplies every method), an eval or probe interval longer
    than the run (it validates only at step 0 and its last step, or never probes)."""
    configs = list(configs)
    out = []
    if needs_confirmation(len(configs)):
        out.append(LaunchWarning(None, f"{len(configs):,} runs is more than {LARGE_LAUNCH} in one launch: check the seeds "
                                       "and ranks"))
    for name, what in (("eval_interval", "validates only at step 0 and at its last step"),
                       ("probe_interval", "never probes the cosine of dW")):
        long = sorted({(getattr(c, name), c.steps) for c in configs if getattr(c, name) and getattr(c, name) > c.steps})
        if long:
            interval, steps = long[0]
            out.append(LaunchWarning(name, f"{name} {interval:,} is more than the {steps:,} steps: the run {what}"))
    return out
