"""Run configuration and the training loop.

Randomness of a run with seed s comes from three independent streams, so runs
of the same seed differ only by their estimator:

- parameters: ``init_params(cfg, fold_in(key(s), 0))`` (never depends on the estimator),
- batches: ``BatchSampler(train, B, T, seed=s)`` (a seeded NumPy generator),
- sketches: ``fold_in(fold_in(key(s), 1), step)``, used only by sketched layers.

``train(config)`` is a generator of ``Record``s: one at step 0 (validation loss
of the initial parameters and the memory figures), one at every eval interval
and one at the last step. It checks ``should_stop`` before every step.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import jax
import jax.numpy as jnp
import numpy as np

from engine import data
from engine.basis import ESTIMATORS
from engine.metrics import compiled_stats, make_dw_probe, memory_breakdown
from engine.model import DTYPES, PRESETS, SKETCHED_LAYER_CHOICES, GPTConfig, init_params
from engine.steps import OPTIMIZERS, init_state, make_eval_step, make_optimizer, make_train_step


class ConfigError(ValueError):
    """A run configuration value is out of range; the message names the field."""


class TrainingDiverged(RuntimeError):
    """The training loss became NaN or infinite."""


@dataclass(frozen=True)
class RunConfig:
    """Everything that defines a run. ``batch_size``/``seq_len`` None → the preset's."""

    preset: str = "paper"
    sketched_layers: str = "mlp+head"
    estimator: str = "basis"
    rank: int = 32
    lam: float = 0.0
    optimizer: str = "sgd"
    lr: float = 0.01
    momentum: float = 0.9
    weight_decay: float = 0.0
    steps: int = 2000
    batch_size: int | None = None
    seq_len: int | None = None
    dataset: str = "classics"
    dataset_options: dict = field(default_factory=dict)
    val_tokens: int = 65536
    eval_interval: int = 100
    val_batches: int = 8
    probe_interval: int = 100
    seed: int = 0
    dtype: str = "float32"
    head_chunk: int = 0
    name: str | None = None

    def __post_init__(self):
        _check_choice("preset", self.preset, tuple(PRESETS))
        _check_choice("sketched_layers", self.sketched_layers, SKETCHED_LAYER_CHOICES)
        _check_choice("estimator", self.estimator, ESTIMATORS)
        _check_choice("optimizer", self.optimizer, OPTIMIZERS)
        _check_choice("dataset", self.dataset, data.SOURCES)
        _check_choice("dtype", self.dtype, tuple(DTYPES))
        _check_int("rank", self.rank, 1)
        _check_int("steps", self.steps, 1)
        _check_int("eval_interval", self.eval_interval, 1)
        _check_int("val_batches", self.val_batches, 1)
        _check_int("val_tokens", self.val_tokens, 1)
        _check_int("probe_interval", self.probe_interval, 0, note=" (0 = never)")
        _check_int("seed", self.seed, 0)
        _check_int("head_chunk", self.head_chunk, 0, note=" (rows per chunk of the fused LM head; 0 = unfused)")
        for name in ("batch_size", "seq_len"):
            if getattr(self, name) is not None:
                _check_int(name, getattr(self, name), 1, note=" (or None for the preset's)")
        _check_real("lam", self.lam, 0.0, 1.0, "[0, 1)")
        _check_real("lr", self.lr, 0.0, math.inf, "(0, inf)", open_low=True)
        _check_real("momentum", self.momentum, 0.0, 1.0, "[0, 1)")
        _check_real("weight_decay", self.weight_decay, 0.0, math.inf, "[0, inf)")
        if not isinstance(self.dataset_options, dict):
            raise ConfigError(f"dataset_options must be a dict (got {self.dataset_options!r})")
        try:
            self.model_config()
        except ValueError as e:
            raise ConfigError(str(e)) from None

    @property
    def preset_model(self) -> GPTConfig:
        return PRESETS[self.preset].model

    @property
    def is_exact(self) -> bool:
        return self.estimator == "exact" or self.sketched_layers == "none"

    @property
    def effective_batch_size(self) -> int:
        return self.batch_size or PRESETS[self.preset].batch_size

    @property
    def effective_seq_len(self) -> int:
        return self.seq_len or self.preset_model.seq_len

    def model_config(self) -> GPTConfig:
        return self.preset_model.replace(
            seq_len=self.effective_seq_len,
            sketched_layers=self.sketched_layers,
            estimator=self.estimator,
            rank=self.rank,
            lam=self.lam,
            dtype=self.dtype,
            head_chunk=self.head_chunk,
        )

    def exact_baseline(self) -> "RunConfig":
        """The same run with exact backprop: the reference for memory and loss."""
        return dataclasses.replace(self, estimator="exact", name=None)

    def label(self) -> str:
        """A short human name: ``exact s0``, ``basis R=8 λ=0.01 s0``."""
        if self.name:
            return self.name
        if self.is_exact:
            return f"exact s{self.seed}"
        lam = f" λ={self.lam:g}" if self.lam else ""
        return f"{self.estimator} R={self.rank}{lam} s{self.seed}"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "RunConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"unknown run config field(s) {unknown}; known: {sorted(known)}")
        return cls(**values)


def _check_choice(name: str, value, choices: tuple) -> None:
    if value not in choices:
        raise ConfigError(f"{name} must be one of {', '.join(choices)} (got {value!r})")


def _check_int(name: str, value, minimum: int, note: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ConfigError(f"{name} must be an integer >= {minimum}{note} (got {value!r})")


def _check_real(name, value, low, high, shown, open_low=False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value > low if open_low else value >= low) and value < high
    if not ok:
        raise ConfigError(f"{name} must be in {shown} (got {value!r})")


@dataclass(frozen=True)
class Record:
    """Metrics measured at one step; ``wall_time`` is seconds since the run started."""

    step: int
    wall_time: float
    values: dict[str, float]


def run_keys(seed: int) -> tuple[jax.Array, jax.Array]:
    """(parameter key, root of the sketch-key stream) of a seed."""
    root = jax.random.key(seed)
    return jax.random.fold_in(root, 0), jax.random.fold_in(root, 1)


def sketch_key(sketch_root: jax.Array, step: int) -> jax.Array:
    return jax.random.fold_in(sketch_root, step)


def initial_params(config: RunConfig):
    """The parameters every method of ``config.seed`` starts from."""
    return init_params(config.model_config(), run_keys(config.seed)[0])


def optimizer_for(config: RunConfig):
    """The optax optimizer ``config`` names, with its lr, momentum and weight decay."""
    return make_optimizer(config.optimizer, config.lr, momentum=config.momentum, weight_decay=config.weight_decay)


def load_data(config: RunConfig) -> tuple[np.ndarray, np.ndarray]:
    """(train tokens, fixed validation batches) of ``config``."""
    train_tokens, val_tokens = data.load_splits(
        config.dataset, val_tokens=config.val_tokens, **config.dataset_options
    )
    val = data.validation_batches(
        val_tokens, config.effective_batch_size, config.effective_seq_len, config.val_batches
    )
    return train_tokens, val


def check_data(configs) -> None:
    """Load (and cache) every distinct dataset of ``configs``, so a missing file or
    a too-short corpus fails before any run is written."""
    seen = set()
    for c in configs:
        key = repr((c.dataset, c.dataset_options, c.val_tokens, c.effective_batch_size, c.effective_seq_len, c.val_batches))
        if key not in seen:
            seen.add(key)
            load_data(c)


def memory_figures(config: RunConfig, params, batch, compiled_step, key) -> dict[str, float]:
    """Saved-activation bytes of this run's step and of its exact baseline, in total
    and per category (``engine.metrics.CATEGORIES``), and the compiled step's XLA
    temp bytes."""
    cfg = config.model_config()
    mine = memory_breakdown(cfg, params, batch, key)
    exact = memory_breakdown(cfg.replace(estimator="exact"), params, batch, None)
    out = {f"mem_bytes/{c}": float(v) for c, v in mine.items()}
    out.update({f"mem_bytes_exact/{c}": float(v) for c, v in exact.items()})
    saved, saved_exact = sum(mine.values()), sum(exact.values())
    out.update(mem_saved_bytes=float(saved), mem_saved_bytes_exact=float(saved_exact), mem_saved_ratio=saved / saved_exact)
    stats = compiled_stats(compiled_step)
    if "temp_bytes" in stats:
        out["mem_temp_bytes"] = float(stats["temp_bytes"])
    return out


def train(
    config: RunConfig,
    *,
    should_stop: Callable[[], bool] = lambda: False,
    on_step: Callable[[int, float], None] | None = None,
) -> Iterator[Record]:
    """Train ``config`` and yield its ``Record``s; raises ``TrainingDiverged`` on a
    non-finite loss (after yielding everything measured before it)."""
    cfg = config.model_config()
    param_key, sketch_root = run_keys(config.seed)
    train_tokens, val = load_data(config)
    sampler = data.BatchSampler(train_tokens, config.effective_batch_size, config.effective_seq_len, config.seed)
    optimizer = optimizer_for(config)
    eval_fn = make_eval_step(cfg)
    probe_names, probe = make_dw_probe(cfg)
    state = init_state(init_params(cfg, param_key), optimizer)
    val = jnp.asarray(val)
    tokens_per_step = config.effective_batch_size * config.effective_seq_len

    start = time.perf_counter()
    batch = jnp.asarray(sampler.next())
    key0 = sketch_key(sketch_root, 0)
    step_fn = make_train_step(cfg, optimizer).lower(state, batch, key0).compile()
    first = {"val_loss": float(eval_fn(state.params, val))}
    first.update(memory_figures(config, state.params, batch, step_fn, key0))
    yield Record(0, time.perf_counter() - start, first)

    losses: list[float] = []
    step_seconds = 0.0
    for step in range(1, config.steps + 1):
        if should_stop():
            return
        key = sketch_key(sketch_root, step)
        probe_now = probe_names and config.probe_interval and step % config.probe_interval == 0
        if probe_now:
            cos, rel = probe(state.params, batch, key)
        t0 = time.perf_counter()
        state, loss = step_fn(state, batch, key)
        loss = float(loss)
        step_seconds += time.perf_counter() - t0
        if not math.isfinite(loss):
            raise TrainingDiverged(f"training loss became {loss} at step {step}; lower lr (now {config.lr})")
        losses.append(loss)
        if on_step:
            on_step(step, loss)
        values: dict[str, float] = {}
        if probe_now:
            cos, rel = np.asarray(cos), np.asarray(rel)
            values.update({f"cos/{n}": float(c) for n, c in zip(probe_names, cos)})
            values.update({f"rel_err/{n}": float(r) for n, r in zip(probe_names, rel)})
            values.update(cos_mean=float(cos.mean()), rel_err_mean=float(rel.mean()))
        if step % config.eval_interval == 0 or step == config.steps:
            values.update(
                train_loss=float(np.mean(losses)),
                val_loss=float(eval_fn(state.params, val)),
                tokens_per_s=len(losses) * tokens_per_step / step_seconds,
            )
            if step == config.steps and (peak := compiled_stats(step_fn).get("device_peak_bytes")) is not None:
                values["mem_peak_bytes"] = float(peak)
            losses, step_seconds = [], 0.0
        if values:
            yield Record(step, time.perf_counter() - start, values)
        if step < config.steps:
            batch = jnp.asarray(sampler.next())
