"""How long a run will take, before it is launched.

A run's wall time is modelled as

    startup + steps · step_s · (1 + eval_share + probe_share)

where ``step_s`` is the time of one compiled train step, ``startup`` covers data
loading and the compilations before step 1 (train step, eval, probe, memory
figures), ``eval_share`` is the validation passes (each batch a forward pass,
about a third of a train step) per step, and ``probe_share`` the dW probes (an
exact and a sketched backward pass, about two train steps) per step.

``step_s`` and ``startup`` come from finished runs with the same timing key when
the database has any (their ``tokens_per_s`` and the wall time of their step-0
record), else from :func:`measure_step`, which compiles and times the real train
step on random tokens (cached per timing key for the life of the process).

Only :func:`measure_step` needs JAX, and imports it when it first measures: the
estimate itself is arithmetic on the run config, so the Launch page shows it
without loading a framework.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Sequence

from engine.config import ConfigError, RunConfig
from engine.core import checks
from engine.training.schedule import Schedule

EVAL_COST = 1 / 3  # a validation batch (forward only) relative to a train step
PROBE_COST = 2.0  # a dW probe (two backward passes) relative to a train step
STARTUP_COMPILES = 4  # train step, eval, probe and the memory listing compile before step 1

_MEASURED: dict[tuple, "StepTiming"] = {}
_LOCK = threading.Lock()


@dataclass(frozen=True)
class StepTiming:
    """Seconds per train step and per run start-up, and where they came from."""

    step_s: float
    startup_s: float
    source: str  # "measured" or "history (n runs)"


def timing_key(config: RunConfig) -> tuple:
    """What a run's step time depends on: the model (less λ, and less the rank
    when exact), the effective batch size and the optimizer. The head chunk enters
    as the run asks for it (None: the backend's default), so the key needs no
    backend and hence no JAX."""
    model = config.model_config(backend="").replace(head_chunk=0)
    if config.is_exact:
        model = model.replace(estimator="exact", rank=1, lam=0.0)
    else:
        model = model.replace(lam=0.0)
    return (model, config.head_chunk, config.effective_batch_size, config.optimizer)


def measure_step(config: RunConfig, steps: int = 3) -> StepTiming:
    """Compile ``config``'s train step and time ``steps`` steps on random tokens
    after one warm-up step; start-up is ``STARTUP_COMPILES`` times the compile
    time. Cached per (:func:`timing_key`, ``steps``) for the life of the process."""
    checks.whole("steps", steps, 1, error=ConfigError)
    key = (timing_key(config), steps)
    with _LOCK:
        hit = _MEASURED.get(key)
    if hit is None:
        hit = _time_steps(config, steps)
        with _LOCK:
            _MEASURED[key] = hit
    return hit


def measured(config: RunConfig, steps: int = 3) -> StepTiming | None:
    """The result of an earlier :func:`measure_step` for ``config``'s timing key, or None."""
    with _LOCK:
        return _MEASURED.get((timing_key(config), steps))


def _time_steps(config: RunConfig, steps: int) -> StepTiming:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from engine.training.build import initial_params, model_config, optimizer_for, run_keys, sketch_key
    from engine.training.steps import init_state, make_train_step

    cfg = model_config(config)
    optimizer = optimizer_for(config)
    state = init_state(initial_params(config), optimizer)
    shape = (config.effective_batch_size, config.effective_seq_len + 1)
    batch = jnp.asarray(np.random.default_rng(0).integers(0, cfg.vocab_size, shape), jnp.int32)
    root = run_keys(config.seed)[1]
    t0 = time.perf_counter()
    step = make_train_step(cfg, optimizer).lower(state, batch, sketch_key(root, 0)).compile()
    compile_s = time.perf_counter() - t0
    state, loss = step(state, batch, sketch_key(root, 0))
    jax.block_until_ready(loss)
    t0 = time.perf_counter()
    for i in range(1, steps + 1):
        state, loss = step(state, batch, sketch_key(root, i))
        jax.block_until_ready(loss)
    step_s = (time.perf_counter() - t0) / steps
    return StepTiming(step_s=step_s, startup_s=STARTUP_COMPILES * compile_s, source="measured")


def run_seconds(config: RunConfig, timing: StepTiming) -> float:
    """Estimated wall time of one run of ``config`` (see the module docstring): its evals and
    probes are those its ``Schedule`` runs, the evals before the last step on the interim
    validation (and, with ``test_every_eval``, test) batches, the last on every batch."""
    schedule = Schedule.of(config)
    interim = [s for s in schedule.eval_steps() if not schedule.whole(s)]
    held_out = 2 if config.effective_test_tokens else 1  # the last step validates (and tests) on every batch
    batches = len(interim) * config.effective_interim_val_batches * (held_out if config.test_every_eval else 1)
    batches += held_out * config.effective_val_batches
    step_equivalents = config.steps + batches * EVAL_COST + len(schedule.probe_steps()) * PROBE_COST
    return timing.startup_s + step_equivalents * timing.step_s


def grid_seconds(configs: Sequence[RunConfig], timings: Sequence[StepTiming], concurrent: int = 1) -> float:
    """Estimated wall time of a grid trained ``concurrent`` runs at a time on a
    shared machine: the summed run times divided by ``concurrent`` (runs at once
    share the cores), never less than the longest run."""
    if len(configs) != len(timings):
        raise ValueError(f"{len(configs)} configs but {len(timings)} timings")
    if not configs:
        return 0.0
    each = [run_seconds(c, t) for c, t in zip(configs, timings)]
    return max(sum(each) / max(1, concurrent), max(each))


def describe_sources(timings) -> str:
    """Where the step times came from: ``timed by 2 earlier runs``, ``measured``, or
    ``timed by earlier runs for 1 model, measured for 2 models``."""
    timings = [t for t in timings if t is not None]
    measured = sum(t.source == "measured" for t in timings)
    history = len(timings) - measured

    def models(n: int) -> str:
        return f"{n} model{'s' if n != 1 else ''}"

    if not history:
        return "measured"
    if not measured:
        return "timed by earlier runs"
    return f"timed by earlier runs for {models(history)}, measured for {models(measured)}"
