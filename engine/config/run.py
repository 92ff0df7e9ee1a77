"""The run schema: ``RunConfig`` and its field metadata (sweeps over it: ``engine.config.sweep``).

Every field of a run is declared once, here, with a ``FieldSpec`` (``engine.config.fields``):
help text, the group it belongs to (``GROUPS``), a unit, and its allowed values (choices, or
bounds for numbers). Everything else derives from that declaration:

- validation (``RunConfig.__post_init__`` runs one check per kind of value:
  choice, integer, real, flag, mapping; messages name the field, the allowed
  values and the fix),
- the CLI's ``run`` and ``sweep`` flags (``engine.cli.config_flags``: ``--field-name``),
- the dashboard's Launch widgets (``app.form``), one per field, in its group.

``RunConfig`` is frozen and hashable (data-source options are a ``FrozenMap``),
so a config is its own identity key. Each field declares what it ``affects``: the
trajectory (the parameters trained to), the measurement only (validation batches,
memory options), or neither (bookkeeping: steps, eval/probe intervals, checkpoints,
name). ``comparable()`` and ``seed_group()`` keep trajectory and measurement only:
they say what two runs must share to be compared and which runs differ only by
seed; ``is_exact`` and ``label()`` what a run is and is called.

A ``Sweep`` (``engine.config.sweep``) is a base config times estimators × ranks × λs × seeds (exact backprop
once per seed). ``Sweep.expand()`` clips every rank to the rows each device sketches,
B·T / devices (a sketch cannot have more rows than its input, and a device sketches
only its own rows), so two ranks that clip to the same effective R are one run, and
``Sweep.clipped()`` says which ranks clipped.
"""


from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import typing
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any

from engine.config.fields import BOOKKEEPING, MEASUREMENT, TRAJECTORY, ConfigError, FieldSpec, FrozenMap, spec
from engine.core import checks
from engine.core.choices import (
    ATTENTION_CHOICES,
    DTYPES,
    DW_COMMS,
    ESTIMATORS,
    OPTIMIZERS,
    REMAT_POLICIES,
    SKETCHED_LAYER_CHOICES,
    SOURCES,
)
from engine.core.estimators import described, is_exact
from engine.core.presets import PRESETS, GPTConfig
from storage.limits import INT_MAX, NAME_MAX, check_text

EVALS_PER_RUN = 10  # the default eval interval validates this many times a run (and at step 0)
MIN_EVAL_TOKENS = 16_384  # the default validation set holds at least this many tokens
MIN_INTERIM_EVAL_TOKENS = 2_048  # the default interim validation reads at least this many of them
# The default eval interval trains at least this many tokens per token an interim validation
# reads. Measured (2-core CPU, paper preset): a validation batch's forward costs 0.28 of a
# train step on as many tokens, so at 3 interim validation costs under a tenth of training.
TRAIN_TOKENS_PER_INTERIM_TOKEN = 3
CHECKPOINT_SECONDS = 60.0  # default checkpoint period: at most this much training is lost
COHORT_DATA = ("seed", "name", "lr")  # what the members of one cohort may differ in (RunConfig.cohort)
TIME_CHECKPOINT_SLACK = 1.5  # off an eval step, a time checkpoint waits this many periods (engine.training.schedule)
# Seeds are 32-bit: 0 <= seed < SEED_END. ``jax.random.key(seed)`` (with 64-bit mode off, as
# here) keeps only the low 32 bits of a larger seed, so seed 2**32 + 5 would train exactly
# seed 5's run while being stored (BIGINT) and shown as another seed.
SEED_END = 2**32
# default fused-head chunk (rows) per backend: on the 2-core CPU the fastest at every
# preset (bench/throughput.py). On an H200 (bench/gpu.py --explore, B·T 16384, d 256):
# the head's value+grad at chunks 1024/2048/4096/8192 takes, against logits then
# cross-entropy (13.4 ms, 6.3 GB temporaries), exact ×1.26/1.17/1.10/1.09, basis
# R=32 ×0.96/0.89/0.80/0.79, with 0.7/1.3/2.4/4.8 GB: 4096 is within 2 % of the
# fastest at half the memory of 8192
FUSED_CHUNK = {"cpu": 256, "gpu": 4096}


@dataclass(frozen=True)
class RunConfig:
    """Everything that defines a run; see each field's ``FieldSpec`` (``schema()``)."""

    estimator: str = field(default="basis", metadata=spec(
        f"the dW estimator. {described()}", "method", "Estimator", affects=TRAJECTORY, choices=ESTIMATORS, swept=True))
    rank: int = field(default=32, metadata=spec(
        "sketch rank R: rows of the sketched activations kept for dW (clipped to the rows on each device, "
        "B·T / devices)", "method", "Rank R", affects=TRAJECTORY,
        unit="rows", low=1, swept=True))
    lam: float = field(default=0.0, metadata=spec(
        "shrink λ: both sketches scaled by (1 − λ), dW by (1 − λ)²; the paper's code used 0.01", "method", "Shrink λ", affects=TRAJECTORY,
        low=0.0, high=1.0, swept=True, step=0.01, fmt="%.3f"))
    seed: int = field(default=0, metadata=spec(
        "seed of the initial parameters, the batches and the sketches", "method", "Seed", affects=TRAJECTORY, low=0, high=SEED_END,
        swept=True))
    sketched_layers: str = field(default="mlp+head", metadata=spec(
        "which dense layers are sketched (mlp+head: the paper's code)", "method", "Sketched layers", affects=TRAJECTORY,
        choices=SKETCHED_LAYER_CHOICES, aliases=("--layers",)))
    preset: str = field(default="paper", metadata=spec(
        "the model shape and batch size", "model", "Model preset", affects=TRAJECTORY, choices=lambda: tuple(PRESETS)))
    batch_size: int | None = field(default=None, metadata=spec(
        "sequences per step", "model", "Batch size", affects=TRAJECTORY, unit="sequences", low=1, none="the preset's"))
    seq_len: int | None = field(default=None, metadata=spec(
        "tokens per sequence T", "model", "Sequence length", affects=TRAJECTORY, unit="tokens", low=1, none="the preset's"))
    dtype: str = field(default="float32", metadata=spec(
        "parameter and activation dtype", "model", "dtype", affects=TRAJECTORY, choices=DTYPES))
    optimizer: str = field(default="sgd", metadata=spec(
        "the optax optimizer", "training", "Optimizer", affects=TRAJECTORY, choices=OPTIMIZERS))
    lr: float = field(default=0.01, metadata=spec(
        "learning rate", "training", "Learning rate", affects=TRAJECTORY, low=0.0, low_open=True, step=0.001, fmt="%.4f"))
    momentum: float = field(default=0.9, metadata=spec(
        "SGD momentum", "training", "Momentum", affects=TRAJECTORY, low=0.0, high=1.0, step=0.05, fmt="%.2f"))
    weight_decay: float = field(default=0.0, metadata=spec(
        "AdamW weight decay", "training", "Weight decay", affects=TRAJECTORY, low=0.0, step=0.01, fmt="%.3f"))
    steps: int = field(default=2000, metadata=spec(
        "training steps", "training", "Steps", affects=BOOKKEEPING, unit="steps", low=1, step=100))
    eval_interval: int | None = field(default=None, metadata=spec(
        "steps between validations (validation loss, train loss, tokens/s)", "training", "Eval interval", affects=BOOKKEEPING,
        unit="steps", low=1, step=10, none=f"steps ÷ {EVALS_PER_RUN} ({EVALS_PER_RUN} validations a run), fewer where an interval would train fewer "
        f"than {TRAIN_TOKENS_PER_INTERIM_TOKEN}× the interim validation's tokens (validating costs under a tenth of training)"))
    probe_interval: int = field(default=100, metadata=spec(
        "steps between probes of the cosine of sketched dW to exact dW (0 = never)", "training",
        "Probe interval", affects=BOOKKEEPING, unit="steps", low=0, step=10))
    dataset: str = field(default="classics", metadata=spec(
        "classics: Shakespeare and the King James Bible, offline; fineweb-edu: the paper's data (network or a "
        "local copy); files: your own .txt/.jsonl/.parquet", "data", "Dataset", affects=TRAJECTORY, choices=SOURCES))
    dataset_options: FrozenMap = field(default_factory=FrozenMap, metadata=spec(
        "options of the data source (see DATA_OPTIONS)", "data", "Data options", affects=TRAJECTORY))
    val_tokens: int = field(default=65536, metadata=spec(
        "held-out validation tokens split off the corpus", "data", "Validation tokens", affects=TRAJECTORY, unit="tokens", low=1,
        step=4096))
    test_tokens: int | None = field(default=None, metadata=spec(
        "held-out test tokens split off the corpus after validation, read only by a tuned comparison's verdict; "
        "0 = no test split (runs of versions before it)", "data", "Test tokens", affects=TRAJECTORY, unit="tokens",
        low=0, step=4096, none="as many as val_tokens"))
    val_batches: int | None = field(default=None, metadata=spec(
        "validation batches evaluated at every eval", "data", "Validation batches", affects=MEASUREMENT, unit="batches", low=1,
        none=f"enough for {MIN_EVAL_TOKENS:,} tokens"))
    interim_val_batches: int | None = field(default=None, metadata=spec(
        "validation batches evaluated at the evals before the last step: the first ones of the validation set, "
        "the same at every eval (the last step always evaluates all of them)", "data", "Interim validation batches",
        affects=MEASUREMENT, unit="batches", low=1,
        none=f"enough for {MIN_INTERIM_EVAL_TOKENS:,} tokens, at most the validation batches"))
    test_every_eval: bool = field(default=False, metadata=spec(
        "evaluate the test split at every eval, not only at the last step", "data", "Test at every eval",
        affects=BOOKKEEPING))
    head_chunk: int | None = field(default=None, metadata=spec(
        "fuse the LM head with the loss in chunks of this many rows, so the B·T×V logits are never stored "
        "(0 = unfused)", "memory", "Fused head chunk", affects=MEASUREMENT, unit="rows", low=0, step=64,
        none="min(B·T, " + ", ".join(f"{c} on a {b.upper()}" for b, c in FUSED_CHUNK.items())
        + "): the fused head is faster and lighter on both"))
    attention: str = field(default="recompute", metadata=spec(
        "recompute: keep Q, K, V and the row log-sum-exp, not the probabilities; xla: jax.nn.dot_product_attention",
        "memory", "Attention", affects=MEASUREMENT, choices=ATTENTION_CHOICES))
    recompute_activations: bool = field(default=True, metadata=spec(
        "LayerNorm and GELU keep only their inputs and recompute the rest in the backward pass", "memory",
        "Recompute activations", affects=MEASUREMENT))
    remat: str = field(default="none", metadata=spec(
        "jax.checkpoint around every block (none, dots_saveable, full)", "memory", "Block remat", affects=MEASUREMENT,
        choices=REMAT_POLICIES))
    devices: int = field(default=1, metadata=spec(
        "devices one run spans (data parallel): each trains B / devices of the batch's sequences and sketches "
        "only its own rows with its own key; 0 = every device JAX sees (of every host under jax.distributed). "
        "The batch size must be a multiple of it", "devices", "Devices", affects=TRAJECTORY, unit="devices", low=0))
    shard_params: bool = field(default=False, metadata=spec(
        "shard parameters and optimizer state over the devices (FSDP-style) instead of a full copy on each",
        "devices", "Shard parameters", affects=MEASUREMENT))
    dw_comm: str = field(default="all-reduce", metadata=spec(
        "how the devices combine a sketched layer's dW: all-reduce the d_in×d_out dW, or all-gather each "
        "device's R×d_in and R×d_out sketches and form dW from them on every device (D·R·(d_in + d_out) floats)",
        "devices", "dW communication", affects=TRAJECTORY, choices=DW_COMMS))
    checkpoint_interval: int | None = field(default=None, metadata=spec(
        "steps between checkpoints; a run also checkpoints when it is stopped, cancelled or interrupted, and at its "
        "last step", "checkpoints", "Checkpoint interval", affects=BOOKKEEPING, unit="steps", low=1,
        none=f"at the first eval boundary {CHECKPOINT_SECONDS:.0f} s after the last checkpoint, at most "
        f"{TIME_CHECKPOINT_SLACK * CHECKPOINT_SECONDS:.0f} s"))
    checkpoint_keep: int = field(default=3, metadata=spec(
        "checkpoints kept per run (the last step's is always kept as well)", "checkpoints", "Checkpoints kept", affects=BOOKKEEPING,
        low=1))
    name: str | None = field(default=None, metadata=spec(
        f"a name for the run (in a sweep: a prefix of every run's name), at most {NAME_MAX} characters", "training",
        "Name", affects=BOOKKEEPING, max_len=NAME_MAX, none="e.g. basis R=8 s0"))

    def __post_init__(self):
        if not isinstance(self.dataset_options, FrozenMap):
            if not isinstance(self.dataset_options, Mapping):
                raise ConfigError(f"dataset_options must be a mapping (got {self.dataset_options!r})")
            object.__setattr__(self, "dataset_options", FrozenMap(self.dataset_options))
        schema_class: type = type(self)  # a subclass's schema holds its own fields
        for f in dataclasses.fields(self):
            validate(f, *kinds(schema_class)[f.name], getattr(self, f.name))
        try:
            self.model_config("cpu")
        except ValueError as e:
            raise ConfigError(str(e)) from None
        check_devices(self.effective_batch_size, self.devices)

    # ------------------------------------------------------------------ derived

    @property
    def is_exact(self) -> bool:
        """Exact backprop: the exact estimator, or no sketched layer."""
        return is_exact(self.estimator) or self.sketched_layers == "none"

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
    def local_rows(self) -> int:
        """B·T / devices: the rows each device sketches, the largest useful rank
        (B·T when ``devices`` is 0, every device, which is known only when the run
        starts; the model clips R to its own rows then)."""
        return self.rows // self.devices if self.devices else self.rows

    @property
    def effective_rank(self) -> int:
        return min(self.rank, self.local_rows)

    @property
    def effective_eval_interval(self) -> int:
        """``eval_interval``, or by default ``steps ÷ k``: k = ``EVALS_PER_RUN`` validations
        a run, fewer where an interval would train fewer than ``TRAIN_TOKENS_PER_INTERIM_TOKEN``
        × ``effective_interim_val_batches`` steps (a validation batch holds one step's rows);
        with k = 0 (a run that short) it validates at step 0 and its last step only. The one
        default of the CLI and the Launch form."""
        if self.eval_interval:
            return self.eval_interval
        k = min(EVALS_PER_RUN, self.steps // (TRAIN_TOKENS_PER_INTERIM_TOKEN * self.effective_interim_val_batches))
        return self.steps // k if k else self.steps

    @property
    def effective_val_batches(self) -> int:
        """``val_batches``, or the fewest batches holding ``MIN_EVAL_TOKENS`` tokens."""
        return self.val_batches or math.ceil(MIN_EVAL_TOKENS / self.rows)

    @property
    def effective_interim_val_batches(self) -> int:
        """The validation batches an eval before the last step reads: ``interim_val_batches``,
        or the fewest holding ``MIN_INTERIM_EVAL_TOKENS`` tokens; never more than
        ``effective_val_batches``. They are the first ones of the validation set, so two
        evals of a run (and two runs at one step) read the same text."""
        chosen = self.interim_val_batches or math.ceil(MIN_INTERIM_EVAL_TOKENS / self.rows)
        return min(chosen, self.effective_val_batches)

    @property
    def effective_test_tokens(self) -> int:
        """``test_tokens``, or by default ``val_tokens``: the test split holds at least this
        many tokens (0: the run has no test split and records no test loss)."""
        return self.val_tokens if self.test_tokens is None else self.test_tokens

    def effective_head_chunk(self, backend: str) -> int:
        """``head_chunk``, or by default the fused head in ``FUSED_CHUNK[backend]``-row
        chunks (``jax.default_backend()``; a backend not measured takes the GPU's)."""
        if self.head_chunk is not None:
            return self.head_chunk
        return min(self.rows, FUSED_CHUNK.get(backend, FUSED_CHUNK["gpu"]))

    def model_config(self, backend: str) -> GPTConfig:
        """The model this run trains on ``backend`` (``engine.training.build.model_config``
        passes the running one; defaults such as the head chunk depend on it)."""
        return PRESETS[self.preset].model.replace(
            seq_len=self.effective_seq_len, sketched_layers=self.sketched_layers, estimator=self.estimator,
            rank=self.rank, lam=self.lam, dtype=self.dtype, head_chunk=self.effective_head_chunk(backend),
            attention=self.attention,
            recompute_activations=self.recompute_activations, remat=self.remat,
        )

    def replace(self, **changes) -> "RunConfig":
        return dataclasses.replace(self, **changes)

    def comparable(self) -> "RunConfig":
        """What two runs must share to be compared: their trajectory and measurement
        fields less estimator, rank, λ and seed (those and every bookkeeping field at its default)."""
        return self.replace(**_BOOKKEEPING_DEFAULTS, estimator="exact", rank=DEFAULTS["rank"], lam=0.0, seed=0)

    def seed_group(self) -> "RunConfig":
        """Runs with equal seed groups differ only by seed and bookkeeping (steps, intervals,
        checkpoints, name); exact runs also ignore rank and λ."""
        if self.is_exact:
            return self.comparable()
        return self.replace(**_BOOKKEEPING_DEFAULTS, seed=0)

    def cohort(self) -> "RunConfig":
        """Runs with equal cohorts differ only in ``COHORT_DATA`` (seed, name, learning rate):
        they may train as one program, step for step on one schedule, each member's seed and
        learning rate data of it (``engine.training.cohort``)."""
        return self.replace(**{name: DEFAULTS[name] for name in COHORT_DATA})

    def method(self) -> str:
        """``exact``, ``basis R=8``, ``basis R=8 λ=0.01``."""
        return "exact" if self.is_exact else method_label(self.estimator, self.effective_rank, self.lam)

    def label(self) -> str:
        """The run's name: ``name`` if set, else ``exact s0``, ``basis R=8 λ=0.01 s0``."""
        return self.name or f"{self.method()} s{self.seed}"

    def fingerprint(self) -> str:
        """A short stable digest of every field (for tables and file names)."""
        return fingerprint_of(self.to_dict())

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


def check_devices(batch_size: int, devices: int) -> None:
    """Raise ``ConfigError`` unless ``devices`` (≥ 1) divides the batch: each device
    trains whole sequences, the same number on every device."""
    if devices and batch_size % devices:
        raise ConfigError(
            f"batch_size {batch_size} is not a multiple of devices {devices}: each device trains whole sequences, "
            f"B / devices of them; fix by setting --batch-size to a multiple of {devices} or --devices to a divisor "
            f"of {batch_size}"
        )


DEFAULTS = {f.name: f.default for f in dataclasses.fields(RunConfig) if f.default is not dataclasses.MISSING}
BOOKKEEPING_NAMES = tuple(f.name for f in dataclasses.fields(RunConfig) if f.metadata["spec"].affects == BOOKKEEPING)
_BOOKKEEPING_DEFAULTS = {n: DEFAULTS[n] for n in BOOKKEEPING_NAMES}


def affects(name: str) -> str:
    """What the run field ``name`` affects: ``trajectory``, ``measurement`` or ``bookkeeping``."""
    return RunConfig.__dataclass_fields__[name].metadata["spec"].affects


def method_label(estimator: str | None, rank, lam) -> str:
    """``exact``, ``basis R=8``, ``basis R=8 λ=0.01``: the one way a method is named."""
    if is_exact(estimator) or rank is None or (isinstance(rank, float) and math.isnan(rank)):
        return "exact"
    lam_text = f" λ={lam:g}" if lam else ""
    return f"{estimator} R={int(rank)}{lam_text}"


def fingerprint_of(values: Mapping[str, Any], ignore: AbstractSet[str] = frozenset()) -> str:
    text = json.dumps({k: v for k, v in values.items() if k not in ignore}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


SWEPT_NAMES = ("estimator", "rank", "lam", "seed")


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
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def validate(f: dataclasses.Field, kind: type, optional: bool, value: Any) -> None:
    """The one check of a field's kind, generated from its spec and annotation."""
    try:
        _check(f, kind, optional, value)
    except ConfigError as e:
        raise ConfigError(str(e), field=f.name) from None


def _check(f: dataclasses.Field, kind: type, optional: bool, value: Any) -> None:
    s: FieldSpec = f.metadata["spec"]
    if value is None and optional:
        return
    name = f.name
    allowed = s.allowed()
    if allowed is not None:
        checks.choice(name, value, allowed, error=ConfigError)
    elif kind is bool:
        checks.flag(name, value, error=ConfigError)
    elif kind is int:
        note = f" (or None for {s.none})" if optional else (" (0 = never)" if s.low == 0 and "never" in s.help else "")
        low = int(s.low if s.low is not None else -(2**63))
        checks.whole(name, value, low, note=note, error=ConfigError)
        high = INT_MAX + 1 if s.high is None else s.high
        if value >= high:
            raise ConfigError(f"{name} must be an integer in [{low}, {int(high)}) (got {value!r})")
    elif kind is float:
        checks.real(name, value, -math.inf if s.low is None else s.low, math.inf if s.high is None else s.high,
                    low_open=s.low_open, high_open=s.high_open, error=ConfigError)
    elif kind is str:
        if not isinstance(value, str) or not value.strip():
            raise ConfigError(f"{name} must be a non-empty text (got {value!r})")
        try:
            check_text(name, value, INT_MAX if s.max_len is None else s.max_len)
        except ValueError as e:
            raise ConfigError(str(e)) from None


@functools.cache
def kinds(cls: type) -> dict[str, tuple[type, bool]]:
    """Field name → (base type, None allowed) of a schema class."""
    return {f.name: base_type(t) for f, _, t in schema(cls)}
