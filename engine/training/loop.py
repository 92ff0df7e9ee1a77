"""The training loop.

Randomness of a run with seed s comes from three independent streams, so runs
of the same seed differ only by their estimator:

- parameters: ``init_params(cfg, fold_in(key(s), 0))`` (never depends on the estimator),
- batches: ``BatchSampler(train, B, T, seed=s)`` (a seeded NumPy generator),
- sketches: ``fold_in(fold_in(key(s), 1), step)``, used only by sketched layers; on
  several devices (``RunConfig.devices``, ``engine.training.parallel``) device d folds
  in d as well, and the dW probe measures device 0's sketch of its own rows.

``train(config)`` is a generator of ``Record``s: one at step 0 (validation loss
of the initial parameters and the memory figures), one at every eval and probe
interval and one at the last step. Every record carries the system metrics of its
moment (``engine.training.system``), sampled outside the timed steps: a run with no
sketched layer to probe still records them at every probe interval. It checks
``should_stop`` before every step.
"""

from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from engine import data
from engine.config import CHECKPOINT_SECONDS, RunConfig
from engine.model.gpt import init_params
from engine.model.memory import make_dw_probe, memory_breakdown
from engine.training import parallel
from engine.training.build import model_config, optimizer_for, run_keys, sketch_key
from engine.training.compiled import compiled_stats
from engine.training.inputs import load_data
from engine.training.steps import init_state, make_eval_step, make_optimizer, make_train_block, make_train_step
from engine.training.system import SystemSampler


class TrainingDiverged(RuntimeError):
    """The training loss became NaN or infinite at ``step`` (the step the run reached: the
    steps after it, run before their losses were read, do not count)."""

    def __init__(self, message: str, step: int):
        super().__init__(message)
        self.step = step


@dataclass(frozen=True)
class Record:
    """Metrics measured at one step; ``wall_time`` is seconds since the run started."""

    step: int
    wall_time: float
    values: dict[str, float]


def memory_figures(config: RunConfig, params, batch, compiled_step, key) -> dict[str, float]:
    """Saved-activation bytes of this run's step and of its exact baseline, in total
    and per category (``engine.model.memory.CATEGORIES``), and the compiled step's XLA
    temp bytes."""
    cfg = model_config(config)
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


class Checkpointer(Protocol):
    """Where a run's checkpoints live (``engine.training.checkpoints.RunCheckpoints``). ``save`` may
    raise to end the run without writing (the runner's checkpointer does when the run's
    lease was taken by another claim: ``storage.LeaseLostError``); ``train`` lets it through."""

    def latest_step(self) -> int | None: ...

    def save(self, step: int, state, extra: dict, *, final: bool = False) -> None: ...

    def restore_latest_valid(self, target) -> tuple[int, object, dict, list[str]]: ...


@dataclass
class _Window:
    """The train losses since the last eval, still on the device, and their step time."""

    losses: list = field(default_factory=list)  # (first step, device array of the block's losses)
    checked: list = field(default_factory=list)  # host floats already checked finite
    seconds: float = 0.0

    def read(self, lr: float) -> None:
        """Bring the pending losses to the host (one sync) and stop at the first non-finite one."""
        if not self.losses:
            return
        values = np.asarray(jax.device_get(jnp.concatenate([v for _, v in self.losses])), dtype=np.float64)
        steps = [first + i for first, v in self.losses for i in range(v.shape[0])]
        for step, value in zip(steps, values):
            if not math.isfinite(value):
                raise TrainingDiverged(f"training loss became {value} at step {step}; lower lr (now {lr})", step)
        self.checked.extend(values.tolist())
        self.losses = []

    def state(self) -> dict:
        """The window as a checkpoint keeps it: every loss since the last eval. Call
        ``read`` first; a pending loss would be missing from it."""
        if self.losses:
            raise RuntimeError("the loss window has unread losses; read() it before saving its state")
        return {"losses": list(self.checked), "seconds": self.seconds}


def train(
    config: RunConfig,
    *,
    should_stop: Callable[[], bool] = lambda: False,
    on_step: Callable[[int, float | None], None] | None = None,
    checkpoints: Checkpointer | None = None,
    resume: bool = False,
    on_resume: Callable[[int, list[str]], None] | None = None,
    max_block: int | None = None,
) -> Iterator[Record]:
    """Train ``config`` and yield its ``Record``s; raises ``TrainingDiverged`` on a
    non-finite loss (after yielding everything measured before it).

    Losses stay on the device between reads: they are read (one sync) before any
    record is yielded, so a non-finite loss is caught before anything after it is
    recorded. ``on_step(step, loss)`` is called every step, with the loss only at
    reads (None otherwise). With ``checkpoints``, the run saves its state (parameters,
    optimizer state, the batch sampler's generator, the loss window and wall time)
    every ``checkpoint_interval`` steps (by default: at the first eval boundary a
    minute of training after the last), when ``should_stop`` ends it, and at its
    last step; with ``resume`` it continues from the latest checkpoint exactly as an
    uninterrupted run would (no step-0 record then). ``on_resume(step, notes)`` is
    called before the first record with the step it continues from (0: from the
    start) and why newer checkpoints were skipped, so the caller can drop the
    records it already holds past that step.

    Steps between two records run as compiled blocks of up to ``max_block`` steps
    (default ``block_limit`` of the backend: 1 on a CPU), one dispatch per block; a
    block computes what its steps one by one compute (same batches, same sketch keys),
    and ``should_stop`` is checked before every block. On several devices
    (``RunConfig.devices`` > 1) every step is a block of one: the sharded step runs
    step by step.
    """
    cfg = model_config(config)
    layout = parallel.make_layout(config)  # None: one device, the plain step
    param_key, sketch_root = run_keys(config.seed)
    train_tokens, val = load_data(config)
    sampler = data.BatchSampler(train_tokens, config.effective_batch_size, config.effective_seq_len, config.seed)
    optimizer = optimizer_for(config)
    probe_names, probe = make_dw_probe(cfg)
    state = init_state(init_params(cfg, param_key), optimizer)
    tokens_per_step = config.effective_batch_size * config.effective_seq_len
    shape = (config.effective_batch_size, config.effective_seq_len + 1)

    start = time.perf_counter()
    system = SystemSampler(jax.local_devices()[:1] if layout is None else layout.mesh.local_devices)
    example = np.zeros(shape, np.int32)  # shapes alone decide the compiled step and the memory figures
    key0 = sketch_key(sketch_root, 0)
    if layout is None:
        eval_fn, val = make_eval_step(cfg), jnp.asarray(val)
        put_batch, put_key, local_rows, stop_now = jnp.asarray, (lambda k: k), (lambda b: b), should_stop
        step_fn = make_train_step(cfg, optimizer).lower(state, put_batch(example), key0).compile()
    else:
        eval_fn, val = parallel.make_eval_step(cfg, layout), layout.put(val, layout.rows(1))
        put_batch, put_key = (lambda b: layout.put(b, layout.rows())), layout.put_key
        local_rows, stop_now = layout.local_rows_of, (lambda: parallel.agree(should_stop()))
        state = layout.put_state(state)
        step_fn = parallel.make_train_step(cfg, optimizer, layout, state, config.dw_comm)
        step_fn = step_fn.lower(state, put_batch(example), put_key(key0)).compile()
    window, done, offset = _Window(), 0, 0.0
    extra, notes = None, []
    if checkpoints is not None and resume and checkpoints.latest_step() is not None:
        try:
            _, state, extra, notes = checkpoints.restore_latest_valid(state)
        except ValueError as e:  # CheckpointError: none is readable
            notes = [str(e)]
    if on_resume is not None and resume:
        on_resume(int(extra["step"]) if extra else 0, notes)
    if extra is not None:
        sampler.set_state(extra["sampler"])
        window.checked, window.seconds = list(extra["window"]["losses"]), float(extra["window"]["seconds"])
        done, offset = int(extra["step"]), float(extra["wall_time"])
    else:
        loss, se = eval_fn(state.params, val)
        first = {"val_loss": float(loss), "val_loss_se": float(se)}
        first.update(memory_figures(config, state.params, jnp.asarray(local_rows(example)), step_fn, key0))
        first.update(system.sample())
        yield Record(0, time.perf_counter() - start, first)
    last_saved, last_saved_at = done, time.perf_counter()

    def wall() -> float:
        return offset + time.perf_counter() - start

    # several processes must checkpoint at the same steps: process 0's wall clock decides
    _due = (lambda due: due) if layout is None else parallel.agree

    def save(step: int, *, final: bool = False) -> None:
        nonlocal last_saved, last_saved_at
        if checkpoints is None or (step == last_saved and not final):
            return
        window.read(config.lr)  # the losses still on the device belong to the saved window too
        extra = {"step": step, "sampler": sampler.state(), "window": window.state(), "wall_time": wall(),
                 "config": config.to_dict()}
        checkpoints.save(step, state, extra, final=final)
        last_saved, last_saved_at = step, time.perf_counter()

    # Step time is wall time between syncs, less probes, evals, writes and checkpoints.
    segment = time.perf_counter()

    def lap() -> None:
        jax.block_until_ready(state)
        window.seconds += time.perf_counter() - segment

    # a scanned block runs one device's steps; on several devices (a layout) each step is its own dispatch
    if layout is not None:
        limit = 1
    else:
        limit = max_block if max_block is not None else block_limit(jax.default_backend())
    step = done
    while step < config.steps:
        if stop_now():
            window.read(config.lr)
            save(step)
            return
        first = step + 1
        last = _block_end(config, first, bool(probe_names), limit, last_saved if checkpoints is not None else None)
        batches = np.stack([sampler.next() for _ in range(first, last + 1)])
        probe_now = bool(probe_names) and config.probe_interval and first % config.probe_interval == 0
        eval_now = last % config.effective_eval_interval == 0 or last == config.steps
        sample_now = bool(config.probe_interval) and last % config.probe_interval == 0
        values: dict[str, float] = {}
        if probe_now:
            lap()
            # on several devices: device 0's rows and sketch, as its step draws them
            probe_batch, probe_key = jnp.asarray(batches[0]), sketch_key(sketch_root, first)
            if layout is not None:
                probe_batch = layout.put(local_rows(batches[0]), layout.replicated)
                probe_key = jax.random.wrap_key_data(layout.put_key(jax.random.fold_in(probe_key, 0)))
            cos, rel = (np.asarray(a) for a in probe(state.params, probe_batch, probe_key))
            values.update({f"cos/{n}": float(c) for n, c in zip(probe_names, cos)})
            values.update({f"rel_err/{n}": float(r) for n, r in zip(probe_names, rel)})
            values.update(cos_mean=float(cos.mean()), rel_err_mean=float(rel.mean()))
            segment = time.perf_counter()
        if last == first:
            state, loss = step_fn(state, put_batch(batches[0]), put_key(sketch_key(sketch_root, first)))
            losses = loss[None]
        else:
            block = _train_block(cfg, config.optimizer, config.lr, config.momentum, config.weight_decay)
            state, losses = block(state, jnp.asarray(batches), sketch_root, jnp.int32(first))
        window.losses.append((first, losses))
        if probe_now or eval_now:
            window.read(config.lr)
        if on_step:
            for s in range(first, last + 1):
                on_step(s, window.checked[-1] if s == last and (probe_now or eval_now) else None)
        step = last
        if eval_now:
            lap()
            val_loss, val_se = eval_fn(state.params, val)
            values.update(
                train_loss=float(np.mean(window.checked)),
                val_loss=float(val_loss),
                val_loss_se=float(val_se),
                tokens_per_s=len(window.checked) * tokens_per_step / window.seconds,
            )
            if step == config.steps and (peak := compiled_stats(step_fn).get("device_peak_bytes")) is not None:
                values["mem_peak_bytes"] = float(peak)
            window = _Window()
        if values or sample_now:
            if not eval_now:
                lap()
            values.update(system.sample())
            yield Record(step, wall(), values)
        if step == config.steps:
            save(step, final=True)
        elif _due(_checkpoint_due(config, step, eval_now, last_saved, time.perf_counter() - last_saved_at)):
            lap()
            save(step)
        if values or step == last_saved:
            segment = time.perf_counter()


BLOCK_STEPS = {"cpu": 1}  # most steps per compiled block, per backend; others: BLOCK_STEPS_DEFAULT
BLOCK_STEPS_DEFAULT = 64


def block_limit(backend: str) -> int:
    """Most steps one compiled block runs on ``backend``. A CPU step (tens of ms on the
    2-core machine) dwarfs its dispatch, so a CPU runs step by step and stops between
    any two steps; on a GPU a paper-preset step is under a millisecond, about what
    dispatching it costs, so steps run in blocks of up to 64 (power-of-two sizes: a
    few compiled programs serve every run)."""
    return BLOCK_STEPS.get(backend, BLOCK_STEPS_DEFAULT)


@functools.lru_cache(maxsize=16)
def _train_block(cfg, optimizer: str, lr: float, momentum: float, weight_decay: float) -> Callable:
    """``make_train_block`` shared by every run of one model and optimizer (the seeds of
    a sweep), so each block size compiles once per process."""
    return make_train_block(cfg, make_optimizer(optimizer, lr, momentum=momentum, weight_decay=weight_decay))


def _block_end(config: RunConfig, first: int, probing: bool, limit: int, last_saved: int | None) -> int:
    """The last step of the block that starts at ``first``: it stops at the next eval
    step, the last step, the step before the next probe (a probe reads the parameters
    before its step and is recorded after it, so a probe step is a block of its own; a
    run that does not probe still stops at every probe interval, where it samples its
    system metrics) and ``checkpoint_interval`` steps after the last checkpoint, and holds at most
    ``limit`` steps, a power of two."""
    last = min(config.steps, first + limit - 1, -(-first // config.effective_eval_interval) * config.effective_eval_interval)
    if probing and config.probe_interval:
        if first % config.probe_interval == 0:  # its record follows this one step
            return first
        next_probe = -(-(first + 1) // config.probe_interval) * config.probe_interval
        last = min(last, next_probe - 1)
    elif config.probe_interval:
        last = min(last, -(-first // config.probe_interval) * config.probe_interval)
    if config.checkpoint_interval is not None and last_saved is not None:
        last = min(last, max(first, last_saved + config.checkpoint_interval))
    n = last - first + 1
    return first + (1 << (n.bit_length() - 1)) - 1


def _checkpoint_due(config: RunConfig, step: int, eval_now: bool, last_saved: int, seconds_since: float) -> bool:
    """Every ``checkpoint_interval`` steps; by default at the first eval boundary
    ``CHECKPOINT_SECONDS`` after the last checkpoint, or at any step 1.5 times that
    after it (the checkpoint holds the partial loss window, so any step is exact)."""
    if config.checkpoint_interval is not None:
        return step - last_saved >= config.checkpoint_interval
    return seconds_since >= CHECKPOINT_SECONDS * (1.0 if eval_now else 1.5)
