"""The run schema: ``RunConfig``, its field metadata, and ``Sweep``.

Every field of a run is declared once, here, with a ``FieldSpec``: help text, the
group it belongs to (``GROUPS``), a unit, and its allowed values (choices, or
bounds for numbers). Everything else derives from that declaration:

- validation (``RunConfig.__post_init__`` runs one check per kind of value:
  choice, integer, real, flag, mapping; messages name the field, the allowed
  values and the fix),
- the CLI's ``run`` and ``sweep`` flags (``engine.cli``: ``--field-name``),
- the dashboard's Launch widgets (``app.form``), one per field, in its group.

``RunConfig`` is frozen and hashable (data-source options are a ``FrozenMap``),
so a config is its own identity key. ``comparable()``, ``seed_group()``,
``is_exact`` and ``label()`` say what two runs must share to be compared, which
runs differ only by seed, and what a run is called.

A ``Sweep`` is a base config times estimators × ranks × λs × seeds (exact backprop
once per seed). ``Sweep.expand()`` clips every rank to the number of sketched rows
B·T (a sketch cannot have more rows than its input), so two ranks that clip to the
same effective R are one run, and ``Sweep.clipped()`` says which ranks clipped.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import jax

from engine import checks, data
from engine.attention import ATTENTION_CHOICES
from engine.basis import ESTIMATORS
from engine.model import DTYPES, PRESETS, REMAT_POLICIES, SKETCHED_LAYER_CHOICES, GPTConfig
from engine.steps import OPTIMIZERS

GROUPS = {  # group → what the Launch page and --help call it
    "method": "Method",
    "model": "Model",
    "training": "Training",
    "data": "Data",
    "memory": "Memory",
    "checkpoints": "Checkpoints",
}
MIN_EVAL_TOKENS = 16_384  # the default validation set holds at least this many tokens
CHECKPOINT_SECONDS = 60.0
FUSED_CHUNK = 256  # default fused-head chunk on a CPU (bench/throughput.py: fastest at every preset)  # default checkpoint period: at most this much training is lost


class ConfigError(ValueError):
    """A run configuration value is out of range; the message names the field and the fix."""


@dataclass(frozen=True)
class FieldSpec:
    """What the schema knows about one run field.

    ``choices`` is a tuple or a zero-argument callable returning one; ``low``/``high``
    bound numbers (``low_open``/``high_open`` exclude the end); ``none`` says what
    None means (a field that may be None); ``swept``: the field is one axis of a
    ``Sweep`` (``estimator``, ``rank``, ``lam``, ``seed``), set per run by the sweep;
    ``aliases`` are extra CLI flags; ``label``/``step``/``fmt`` dress its widget.
    """

    help: str
    group: str
    label: str
    unit: str = ""
    choices: tuple | Callable[[], tuple] | None = None
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = True
    none: str | None = None
    swept: bool = False
    aliases: tuple[str, ...] = ()
    step: float | None = None
    fmt: str | None = None

    def allowed(self) -> tuple | None:
        return self.choices() if callable(self.choices) else self.choices


def spec(help: str, group: str, label: str, **kw) -> dict:
    """``dataclasses.field`` metadata holding a ``FieldSpec``."""
    if group not in GROUPS:
        raise ValueError(f"unknown field group {group!r}; one of {', '.join(GROUPS)}")
    return {"spec": FieldSpec(help, group, label, **kw)}


class FrozenMap(Mapping):
    """An immutable, hashable mapping (a run's data-source options)."""

    __slots__ = ("_items",)

    def __init__(self, values: Mapping | None = None, **kw):
        merged = dict(values or {}, **kw)
        object.__setattr__(self, "_items", tuple(sorted(merged.items())))

    def __getitem__(self, key):
        for k, v in self._items:
            if k == key:
                return v
        raise KeyError(key)

    def __iter__(self) -> Iterator:
        return (k for k, _ in self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(self._items)

    def __eq__(self, other) -> bool:
        return isinstance(other, Mapping) and dict(self._items) == dict(other)

    def __repr__(self) -> str:
        return f"FrozenMap({dict(self._items)!r})"

    def __setattr__(self, *_):
        raise AttributeError("FrozenMap is immutable")


@dataclass(frozen=True)
class DataOption:
    """One option of a data source (``RunConfig.dataset_options``), shown as a flag and a widget."""

    name: str
    kind: type
    sources: tuple[str, ...]
    help: str
    label: str
    default: Any = None
    flag: str | None = None  # the CLI flag when not --name-with-dashes

    @property
    def cli_flag(self) -> str:
        return self.flag or "--" + self.name.replace("_", "-")


DATA_OPTIONS = (
    DataOption("path", str, ("files",), "a .txt/.jsonl/.parquet path or glob of your own corpus", "Path or glob",
               flag="--data-path"),
    DataOption("text_field", str, ("files",), "the text column of .jsonl/.parquet files (default text)", "Text field"),
    DataOption("data_files", str, ("fineweb-edu",), "a local mirror (path or glob of parquet files) instead of the Hub",
               "Local copy (optional)"),
    DataOption("max_documents", int, ("fineweb-edu",), "number of documents to stream", "Documents", 20_000),
)


@dataclass(frozen=True)
class RunConfig:
    """Everything that defines a run; see each field's ``FieldSpec`` (``schema()``)."""

    estimator: str = field(default="basis", metadata=spec(
        "the dW estimator; exact is plain backprop", "method", "Estimator", choices=ESTIMATORS, swept=True))
    rank: int = field(default=32, metadata=spec(
        "sketch rank R: rows of the sketched activations kept for dW (clipped to B·T)", "method", "Rank R",
        unit="rows", low=1, swept=True))
    lam: float = field(default=0.0, metadata=spec(
        "shrink λ: both sketches scaled by (1 − λ), dW by (1 − λ)²; the paper's code used 0.01", "method", "Shrink λ",
        low=0.0, high=1.0, swept=True, step=0.01, fmt="%.3f"))
    seed: int = field(default=0, metadata=spec(
        "seed of the initial parameters, the batches and the sketches", "method", "Seed", low=0, high=2**32,
        swept=True))
    sketched_layers: str = field(default="mlp+head", metadata=spec(
        "which dense layers are sketched (mlp+head: the paper's code)", "method", "Sketched layers",
        choices=SKETCHED_LAYER_CHOICES, aliases=("--layers",)))
    preset: str = field(default="paper", metadata=spec(
        "the model shape and batch size", "model", "Model preset", choices=lambda: tuple(PRESETS)))
    batch_size: int | None = field(default=None, metadata=spec(
        "sequences per step", "model", "Batch size", unit="sequences", low=1, none="the preset's"))
    seq_len: int | None = field(default=None, metadata=spec(
        "tokens per sequence T", "model", "Sequence length", unit="tokens", low=1, none="the preset's"))
    dtype: str = field(default="float32", metadata=spec(
        "parameter and activation dtype", "model", "dtype", choices=tuple(DTYPES)))
    optimizer: str = field(default="sgd", metadata=spec(
        "the optax optimizer", "training", "Optimizer", choices=OPTIMIZERS))
    lr: float = field(default=0.01, metadata=spec(
        "learning rate", "training", "Learning rate", low=0.0, low_open=True, step=0.001, fmt="%.4f"))
    momentum: float = field(default=0.9, metadata=spec(
        "SGD momentum", "training", "Momentum", low=0.0, high=1.0, step=0.05, fmt="%.2f"))
    weight_decay: float = field(default=0.0, metadata=spec(
        "AdamW weight decay", "training", "Weight decay", low=0.0, step=0.01, fmt="%.3f"))
    steps: int = field(default=2000, metadata=spec(
        "training steps", "training", "Steps", unit="steps", low=1, step=100))
    eval_interval: int = field(default=200, metadata=spec(
        "steps between validations (validation loss, train loss, tokens/s)", "training", "Eval interval",
        unit="steps", low=1, step=10))
    probe_interval: int = field(default=100, metadata=spec(
        "steps between probes of the cosine of sketched dW to exact dW (0 = never)", "training",
        "Probe interval", unit="steps", low=0, step=10))
    dataset: str = field(default="classics", metadata=spec(
        "classics: Shakespeare and the King James Bible, offline; fineweb-edu: the paper's data (network or a "
        "local copy); files: your own .txt/.jsonl/.parquet", "data", "Dataset", choices=data.SOURCES))
    dataset_options: FrozenMap = field(default_factory=FrozenMap, metadata=spec(
        "options of the data source (see DATA_OPTIONS)", "data", "Data options"))
    val_tokens: int = field(default=65536, metadata=spec(
        "held-out validation tokens split off the corpus", "data", "Validation tokens", unit="tokens", low=1,
        step=4096))
    val_batches: int | None = field(default=None, metadata=spec(
        "validation batches evaluated at every eval", "data", "Validation batches", unit="batches", low=1,
        none=f"enough for {MIN_EVAL_TOKENS:,} tokens"))
    head_chunk: int | None = field(default=None, metadata=spec(
        "fuse the LM head with the loss in chunks of this many rows, so the B·T×V logits are never stored "
        "(0 = unfused)", "memory", "Fused head chunk", unit="rows", low=0, step=64,
        none=f"min(B·T, {FUSED_CHUNK}) on a CPU, where it is faster; 0 on a GPU, where it is not"))
    attention: str = field(default="recompute", metadata=spec(
        "recompute: keep Q, K, V and the row log-sum-exp, not the probabilities; xla: jax.nn.dot_product_attention",
        "memory", "Attention", choices=ATTENTION_CHOICES))
    recompute_activations: bool = field(default=True, metadata=spec(
        "LayerNorm and GELU keep only their inputs and recompute the rest in the backward pass", "memory",
        "Recompute activations"))
    remat: str = field(default="none", metadata=spec(
        "jax.checkpoint around every block (none, dots_saveable, full)", "memory", "Block remat",
        choices=tuple(REMAT_POLICIES)))
    checkpoint_interval: int | None = field(default=None, metadata=spec(
        "steps between checkpoints; a run also checkpoints when it is stopped, cancelled or interrupted, and at its "
        "last step", "checkpoints", "Checkpoint interval", unit="steps", low=1,
        none=f"at the first eval boundary {CHECKPOINT_SECONDS:.0f} s after the last checkpoint, at most "
        f"{1.5 * CHECKPOINT_SECONDS:.0f} s"))
    checkpoint_keep: int = field(default=3, metadata=spec(
        "checkpoints kept per run (the last step's is always kept as well)", "checkpoints", "Checkpoints kept",
        low=1))
    name: str | None = field(default=None, metadata=spec(
        "a name for the run (in a sweep: a prefix of every run's name)", "training", "Name", none="e.g. basis R=8 s0"))

    def __post_init__(self):
        if not isinstance(self.dataset_options, FrozenMap):
            if not isinstance(self.dataset_options, Mapping):
                raise ConfigError(f"dataset_options must be a mapping (got {self.dataset_options!r})")
            object.__setattr__(self, "dataset_options", FrozenMap(self.dataset_options))
        for f in dataclasses.fields(self):
            _validate(f, *kinds(type(self))[f.name], getattr(self, f.name))
        try:
            self.model_config()
        except ValueError as e:
            raise ConfigError(str(e)) from None

    # ------------------------------------------------------------------ derived

    @property
    def is_exact(self) -> bool:
        """Exact backprop: the exact estimator, or no sketched layer."""
        return self.estimator == "exact" or self.sketched_layers == "none"

    @property
    def effective_batch_size(self) -> int:
        return self.batch_size or PRESETS[self.preset].batch_size

    @property
    def effective_seq_len(self) -> int:
        return self.seq_len or PRESETS[self.preset].model.seq_len

    @property
    def rows(self) -> int:
        """B·T: the rows every sketched layer sketches, the largest useful rank."""
        return self.effective_batch_size * self.effective_seq_len

    @property
    def effective_rank(self) -> int:
        return min(self.rank, self.rows)

    @property
    def effective_val_batches(self) -> int:
        """``val_batches``, or the fewest batches holding ``MIN_EVAL_TOKENS`` tokens."""
        return self.val_batches or math.ceil(MIN_EVAL_TOKENS / self.rows)

    @property
    def effective_head_chunk(self) -> int:
        """``head_chunk``, or by default the faster head on this machine's backend."""
        if self.head_chunk is not None:
            return self.head_chunk
        return min(self.rows, FUSED_CHUNK) if jax.default_backend() == "cpu" else 0

    def model_config(self) -> GPTConfig:
        return PRESETS[self.preset].model.replace(
            seq_len=self.effective_seq_len, sketched_layers=self.sketched_layers, estimator=self.estimator,
            rank=self.rank, lam=self.lam, dtype=self.dtype, head_chunk=self.effective_head_chunk,
            attention=self.attention,
            recompute_activations=self.recompute_activations, remat=self.remat,
        )

    def replace(self, **changes) -> "RunConfig":
        return dataclasses.replace(self, **changes)

    def exact_baseline(self) -> "RunConfig":
        """The same run with exact backprop: the reference for memory and loss."""
        return self.replace(estimator="exact", name=None)

    def comparable(self) -> "RunConfig":
        """What two runs must share to be compared: the config less estimator, rank, λ, seed and name."""
        return self.replace(estimator="exact", rank=_DEFAULT["rank"], lam=0.0, seed=0, name=None)

    def seed_group(self) -> "RunConfig":
        """Runs with equal seed groups differ only by seed (and name); exact runs also ignore rank and λ."""
        if self.is_exact:
            return self.replace(estimator="exact", rank=_DEFAULT["rank"], lam=0.0, seed=0, name=None)
        return self.replace(seed=0, name=None)

    def method(self) -> str:
        """``exact``, ``basis R=8``, ``basis R=8 λ=0.01``."""
        return "exact" if self.is_exact else method_label(self.estimator, self.effective_rank, self.lam)

    def label(self) -> str:
        """The run's name: ``name`` if set, else ``exact s0``, ``basis R=8 λ=0.01 s0``."""
        return self.name or f"{self.method()} s{self.seed}"

    def fingerprint(self) -> str:
        """A short stable digest of every field (for tables and file names)."""
        return _fingerprint(self.to_dict())

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["dataset_options"] = dict(self.dataset_options)
        return out

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> "RunConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"unknown run config field(s) {unknown}; known: {sorted(known)}")
        return cls(**values)


_DEFAULT = {f.name: f.default for f in dataclasses.fields(RunConfig) if f.default is not dataclasses.MISSING}


def method_label(estimator: str | None, rank, lam) -> str:
    """``exact``, ``basis R=8``, ``basis R=8 λ=0.01``: the one way a method is named."""
    if estimator in (None, "exact") or rank is None or (isinstance(rank, float) and math.isnan(rank)):
        return "exact"
    lam_text = f" λ={lam:g}" if lam else ""
    return f"{estimator} R={int(rank)}{lam_text}"


def stored(config: Mapping[str, Any]) -> RunConfig | None:
    """The ``RunConfig`` of a stored config dict, or None when it is not one (a run
    written by hand or by a version of BASIS Lab with other fields)."""
    try:
        return RunConfig.from_dict(config)
    except (ConfigError, TypeError):
        return None


def comparable_key(config: Mapping[str, Any]) -> str:
    """The fingerprint of ``RunConfig.comparable()`` of a stored config: equal for runs
    that may be compared (a string, so tables can group by it)."""
    run = stored(config)
    return run.comparable().fingerprint() if run else _fingerprint(config, {*_SWEPT_NAMES, "name"})


def seed_group_key(config: Mapping[str, Any]) -> str:
    """The fingerprint of ``RunConfig.seed_group()`` of a stored config: equal for runs
    that differ only by seed."""
    run = stored(config)
    if run:
        return run.seed_group().fingerprint()
    exact = config.get("estimator") == "exact" or config.get("sketched_layers") == "none"
    return _fingerprint(config, {"seed", "name", *(("rank", "lam") if exact else ())})


def differing_fields(configs) -> list[str]:
    """The config fields, other than estimator, rank, λ, seed and name, whose values differ
    among the stored ``configs`` (what tells setups apart in a table or a legend)."""
    configs = list(configs)
    keys = sorted({k for c in configs for k in c} - {*_SWEPT_NAMES, "name"})
    return [k for k in keys if len({json.dumps(c.get(k), sort_keys=True, default=str) for c in configs}) > 1]


def _fingerprint(values: Mapping[str, Any], ignore: set = frozenset()) -> str:
    text = json.dumps({k: v for k, v in values.items() if k not in ignore}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


_SWEPT_NAMES = ("estimator", "rank", "lam", "seed")


# --------------------------------------------------------------------- schema access


def schema(cls: type = RunConfig) -> list[tuple[dataclasses.Field, FieldSpec, Any]]:
    """(field, spec, resolved type) of every field of ``cls``, in declaration order."""
    hints = typing.get_type_hints(cls)
    return [(f, f.metadata["spec"], hints[f.name]) for f in dataclasses.fields(cls)]


def base_type(tp: Any) -> tuple[type, bool]:
    """(the type, whether None is allowed) of an annotation such as ``int | None``."""
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if args and len(args) < len(typing.get_args(tp)):
        return args[0], True
    return tp, False


def default_of(f: dataclasses.Field) -> Any:
    return f.default_factory() if f.default is dataclasses.MISSING else f.default


def _validate(f: dataclasses.Field, kind: type, optional: bool, value: Any) -> None:
    """The one check of a field's kind, generated from its spec and annotation."""
    s: FieldSpec = f.metadata["spec"]
    if value is None and optional:
        return
    name = f.name
    if s.allowed() is not None:
        checks.choice(name, value, s.allowed(), error=ConfigError)
    elif kind is bool:
        checks.flag(name, value, error=ConfigError)
    elif kind is int:
        note = f" (or None for {s.none})" if optional else (" (0 = never)" if s.low == 0 and "never" in s.help else "")
        checks.whole(name, value, int(s.low if s.low is not None else -(2**63)), note=note, error=ConfigError)
        if s.high is not None and value >= s.high:
            raise ConfigError(f"{name} must be an integer in [{int(s.low)}, {int(s.high)}) (got {value!r})")
    elif kind is float:
        checks.real(name, value, -math.inf if s.low is None else s.low, math.inf if s.high is None else s.high,
                    low_open=s.low_open, high_open=s.high_open, error=ConfigError)
    elif kind is str:
        if not isinstance(value, str) or not value.strip():
            raise ConfigError(f"{name} must be a non-empty text (got {value!r})")


@functools.cache
def kinds(cls: type) -> dict[str, tuple[type, bool]]:
    """Field name → (base type, None allowed) of a schema class."""
    return {f.name: base_type(t) for f, _, t in schema(cls)}


# --------------------------------------------------------------------- sweeps


def parse_ranks(text: str) -> tuple[bool, list[int]]:
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
            raise ConfigError(f"ranks: {token!r} is neither 'exact' nor an integer >= 1 (e.g. exact, 1, 8, 32)") from None
        if rank < 1:
            raise ConfigError(f"ranks: {rank} is not an integer >= 1 (e.g. exact, 1, 8, 32)")
        if rank not in ranks:
            ranks.append(rank)
    if not with_exact and not ranks:
        raise ConfigError("ranks: give at least one rank or 'exact' (e.g. exact, 1, 8, 32)")
    return with_exact, ranks


def parse_seeds(text: str) -> list[int]:
    """``"0"`` → [0]; ``"0,1,2"``, ``"0 1 2"`` and ``"0-2"`` → [0, 1, 2]; order kept,
    duplicates dropped."""
    seeds: list[int] = []
    tokens = _tokens(text)
    if not tokens:
        raise ConfigError("seeds: give at least one seed, e.g. 0 or 0,1,2 or 0-4")
    for token in tokens:
        lo, sep, hi = token.partition("-")
        try:
            span = range(int(lo), int(hi) + 1) if sep else [int(token)]
        except ValueError:
            raise ConfigError(f"seeds: {token!r} is not a seed (integers >= 0: 0,1,2 or 0-4)") from None
        if sep and int(hi) < int(lo):
            raise ConfigError(f"seeds: range {token!r} is empty; write low-high, e.g. 0-4")
        if len(span) > 10_000:
            raise ConfigError(f"seeds: range {token!r} holds {len(span):,} seeds; at most 10,000")
        for seed in span:
            _validate_field("seed", seed)
            if seed not in seeds:
                seeds.append(seed)
    return seeds


def parse_lams(text: str) -> list[float]:
    """``"0, 0.01"`` → [0.0, 0.01]: every λ in [0, 1), order kept, duplicates dropped."""
    lams: list[float] = []
    for token in _tokens(text):
        try:
            lam = float(token)
        except ValueError:
            raise ConfigError(f"lams: {token!r} is not a number in [0, 1) (e.g. 0, 0.01)") from None
        _validate_field("lam", lam)
        if lam not in lams:
            lams.append(lam)
    if not lams:
        raise ConfigError("lams: give at least one λ in [0, 1), e.g. 0 or 0, 0.01")
    return lams


def parse_estimators(text: str) -> list[str]:
    """``"exact, basis"`` → ["exact", "basis"], each one of ``ESTIMATORS``."""
    out = []
    for token in _tokens(text):
        if token not in ESTIMATORS:
            raise ConfigError(f"unknown estimator {token!r}; choose from {', '.join(ESTIMATORS)}")
        if token not in out:
            out.append(token)
    if not out:
        raise ConfigError(f"estimators: choose at least one of {', '.join(ESTIMATORS)}")
    return out


def _tokens(text) -> list[str]:
    if not isinstance(text, str):
        text = ",".join(map(str, text))
    return [t for t in text.replace(",", " ").split() if t]


def _validate_field(name: str, value: Any) -> None:
    f = next(f for f in dataclasses.fields(RunConfig) if f.name == name)
    _validate(f, *kinds(RunConfig)[name], value)


@dataclass(frozen=True)
class Clip:
    """A requested rank that the sweep's B·T rows clip to ``effective``."""

    requested: int
    effective: int
    rows: int

    def __str__(self) -> str:
        return f"R={self.requested} clips to R={self.effective} (B·T = {self.rows} rows)"


@dataclass(frozen=True)
class Sweep:
    """``base`` × estimators × ranks × λs × seeds; exact backprop once per seed when
    ``with_exact`` (or ``exact`` is among the estimators). An axis left None is the
    base's own value; the base keeps defaults in the swept fields, so equal sweeps
    compare equal. ``tags`` label every run."""

    base: RunConfig
    estimators: tuple[str, ...] | None = None
    ranks: tuple[int, ...] | None = None
    lams: tuple[float, ...] | None = None
    seeds: tuple[int, ...] | None = None
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
        object.__setattr__(self, "base", self.base.replace(**{n: _DEFAULT[n] for n in _SWEPT_NAMES}))
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
        """The requested ranks larger than B·T, and what they clip to."""
        rows = self.base.rows
        return [Clip(r, rows, rows) for r in self.ranks if r > rows] if self.sketched else []

    def expand(self) -> list[RunConfig]:
        """One validated config per (seed, estimator, effective rank, λ), exact once per
        seed (λ = 0); a rank above B·T becomes B·T, and duplicates are dropped."""
        configs: list[RunConfig] = []
        for seed in self.seeds:
            if self.exact:
                configs.append(self.base.replace(estimator="exact", lam=0.0, seed=seed, name=None))
            for estimator in self.sketched:
                for rank in self.ranks:
                    for lam in self.lams:
                        configs.append(self.base.replace(
                            estimator=estimator, rank=min(rank, self.base.rows), lam=lam, seed=seed, name=None))
        configs = list(dict.fromkeys(configs))
        if self.base.name:
            if len(configs) == 1:
                return [configs[0].replace(name=self.base.name)]
            configs = [c.replace(name=f"{self.base.name} · {c.label()}") for c in configs]
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


def to_flat(config: RunConfig) -> dict[str, Any]:
    """The inverse of ``from_flat``: every field, and each data option (its default when unset)."""
    flat = config.to_dict()
    options = flat.pop("dataset_options")
    for opt in DATA_OPTIONS:
        flat[opt.name] = options.get(opt.name, opt.default)
    return flat
