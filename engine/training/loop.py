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
interval and one at the last step; what is due at which step (evals, probes, records,
checkpoints, where compiled blocks end) is its ``Schedule`` (``engine.training.schedule``). Every record carries the system metrics of its
moment (``engine.training.system``), sampled outside the timed steps: a run with no
sketched layer to probe still records them at every probe interval. The records at
step 0 and at every eval also carry the per-batch validation losses behind ``val_loss``
(``Record.batch_losses``); the record of the last step (and with ``test_every_eval`` those
of step 0 and every eval) also the held-out test split's ``test_loss`` and its per-batch
losses, unless the run has no test split (``test_tokens`` 0). It checks ``should_stop``
before every step. It enables the persistent compilation cache before it compiles anything
(``engine.training.compile_cache``: each program once per machine and shape) and counts where
its time goes (``engine.training.phases``).
"""

from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Protocol, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from engine import data
from engine.config import RunConfig
from engine.core.choices import DIVERGED_ERROR
from engine.errors import BasisLabError
from engine.model.gpt import init_params
from engine.model.memory import make_dw_probe, memory_breakdown
from engine.training import breakdown_cache, compile_cache
from engine.training.build import model_config, optimizer_for, run_keys, sketch_key
from engine.training.compiled import compiled_stats
from engine.training.devices import DeviceLayout, device_layout
from engine.training.inputs import load_data
from engine.training.phases import Phases
from engine.training.schedule import Schedule
from engine.training.steps import init_state, make_optimizer, make_train_block
from engine.training.system import SystemSampler


class TrainingDiverged(BasisLabError, RuntimeError):
    """The training loss became NaN or infinite at ``step`` (the step the run reached: the
    steps after it, run before their losses were read, do not count)."""

    def __init__(self, message: str, step: int):
        super().__init__(message)
        self.step = step


@dataclass(frozen=True)
class Record:
    """Metrics measured at one step; ``wall_time`` is seconds since the run started.
    ``batch_losses`` holds, at step 0 and at every eval, the per-batch mean losses of each
    split evaluated (``"val"``: float32, one per validation batch, in batch order; their
    mean is ``values["val_loss"]``; ``"test"`` likewise for ``values["test_loss"]``, where
    the test split was evaluated); it is empty in the other records."""

    step: int
    wall_time: float
    values: dict[str, float]
    batch_losses: dict[str, np.ndarray] = field(default_factory=dict)


def val_summary(losses: np.ndarray, name: str = "val_loss") -> dict[str, float]:
    """``val_loss``, the mean of the n per-batch validation losses ℓ_i, and ``val_loss_se``,
    its standard error sd(ℓ) / √n (ddof 1: the sampling error of the validation loss
    itself; NaN for one batch), computed in float64 on the host from the float32 losses.
    ``name`` names them (``test_loss`` and ``test_loss_se`` for the test split)."""
    x = np.asarray(losses, dtype=np.float64)
    se = float(np.std(x, ddof=1) / np.sqrt(x.size)) if x.size > 1 else math.nan
    return {name: float(x.mean()), f"{name}_se": se}


def held_out_chunks(put: Callable[[np.ndarray], jax.Array], batches: np.ndarray, size: int) -> list[jax.Array]:
    """``batches`` placed by ``put`` in chunks of ``size`` batches (the last may hold fewer).
    With ``size`` the interim validation's batches, the interim validation is the first chunk
    and every eval, interim or whole, runs one compiled program (of one chunk's shape)."""
    return [put(batches[i:i + size]) for i in range(0, len(batches), size)]


def held_out(val: list[jax.Array], test: list[jax.Array] | None,
             whole: bool) -> tuple[list[jax.Array], list[jax.Array] | None]:
    """The chunks (``held_out_chunks``) an eval reads: every one of each split when ``whole``,
    else the interim validation's, the first of each."""
    return (val, test) if whole else (val[:1], test and test[:1])


def _losses(eval_fn: Callable, params, chunks: Sequence[jax.Array]) -> np.ndarray:
    """The per-batch losses of every chunk, in order: all dispatched, then one transfer."""
    return np.concatenate([np.asarray(x, dtype=np.float32) for x in jax.device_get([eval_fn(params, c) for c in chunks])])


def validation(eval_fn: Callable, params, val: Sequence[jax.Array],
               test: Sequence[jax.Array] | None) -> tuple[dict[str, float], dict[str, np.ndarray]]:
    """(``val_summary`` of the batches in the chunks ``val`` and, unless ``test`` is None, of
    those in ``test`` as ``test_loss``; their per-batch losses by split) of ``params``,
    evaluated by ``eval_fn`` (``held_out_chunks``)."""
    losses = _losses(eval_fn, params, val)
    values, batch_losses = val_summary(losses), {"val": losses}
    if test is not None:
        batch_losses["test"] = losses = _losses(eval_fn, params, test)
        values.update(val_summary(losses, "test_loss"))
    return values, batch_losses


def restore(checkpoints: "Checkpointer | None", state, phases: Phases) -> tuple[object, dict | None, list[str]]:
    """(state, extra, notes) of the newest valid checkpoint of ``checkpoints`` (``state``, None
    and why, when there is none or none is readable); its reading is ``checkpoint`` time."""
    if checkpoints is None or checkpoints.latest_step() is None:
        return state, None, []
    try:
        with phases.timed("checkpoint"):
            _, state, extra, notes = checkpoints.restore_latest_valid(state)
    except ValueError as e:  # CheckpointError: none is readable
        return state, None, [str(e)]
    return state, extra, notes


def memory_figures(config: RunConfig, params, batch, compiled_step, key) -> dict[str, float]:
    """Saved-activation bytes of this run's step and of its exact baseline, in total
    and per category (``engine.model.memory.CATEGORIES``), and the compiled step's XLA
    temp bytes."""
    mine, exact = _breakdowns(model_config(config), params, batch, key)
    out = {f"mem_bytes/{c}": float(v) for c, v in mine.items()}
    out.update({f"mem_bytes_exact/{c}": float(v) for c, v in exact.items()})
    saved, saved_exact = sum(mine.values()), sum(exact.values())
    out.update(mem_saved_bytes=float(saved), mem_saved_bytes_exact=float(saved_exact), mem_saved_ratio=saved / saved_exact)
    stats = compiled_stats(compiled_step)
    if "temp_bytes" in stats:
        out["mem_temp_bytes"] = float(stats["temp_bytes"])
    return out


_BREAKDOWNS: dict[tuple, tuple[dict[str, int], dict[str, int]]] = {}


def _breakdowns(cfg, params, batch, key) -> tuple[dict[str, int], dict[str, int]]:
    """(this model's, exact backprop's) ``memory_breakdown``. The saved residuals are
    listed by shape alone, so they are listed once per process for a model and batch shape,
    and once per machine while the code is unchanged (``breakdown_cache``)."""
    memo = (cfg, batch.shape, str(batch.dtype), key is None)
    if memo not in _BREAKDOWNS:
        exact = cfg.replace(estimator="exact")
        shape = f"{batch.shape} {batch.dtype}"
        _BREAKDOWNS[memo] = (
            breakdown_cache.cached(f"{cfg!r} {shape} keyed={key is not None}",
                                   lambda: memory_breakdown(cfg, params, batch, key)),
            breakdown_cache.cached(f"{exact!r} {shape} keyed=False",
                                   lambda: memory_breakdown(exact, params, batch, None)))
    return _BREAKDOWNS[memo]


class Checkpointer(Protocol):
    """What ``train`` asks of a run's checkpoints (``engine.training.checkpoints.RunCheckpoints``).
    ``save`` may raise to end the run without writing (the runner's ``guard`` does when the
    run's lease was taken by another claim: ``storage.LeaseLostError``); ``train`` lets it through."""

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
                raise TrainingDiverged(f"{DIVERGED_ERROR} {value} at step {step}; lower lr (now {lr})", step)
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
    phases: Phases | None = None,
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
    called before the first record with the step it continues from (0: the start)
    and why newer checkpoints were skipped (the caller drops its records past it).

    Steps between two records run as compiled blocks of up to ``max_block`` steps
    (default ``block_limit`` of the backend: 1 on a CPU; on several devices, always 1),
    one dispatch per block; a block computes what its steps one by one compute (same
    batches, same sketch keys), and ``should_stop`` is checked before every block.
    ``phases`` (default: a new one) counts where its time goes (``engine.training.phases``).
    """
    training = _Training(config, device_layout(config), checkpoints, max_block, phases or Phases())
    if not (resume and training.resume(on_resume)):
        yield from training.hand_over(training.initial_record())
    training.begin()
    step = training.done
    while step < config.steps:
        if training.devices.agree(should_stop()):
            training.stop(step)
            return
        first = step + 1
        last = training.block_end(first)
        batches = training.batches(first, last)
        schedule = training.schedule
        eval_now, record_now = schedule.evaluates(last), schedule.records(first, last)
        values = training.probe(first, batches[0]) if schedule.probes(first) else {}
        training.step(first, last, batches)
        training.tell(first, last, schedule.reads(first, last), on_step)
        step = last
        if eval_now:
            values.update(training.evaluate(step))
        if record_now:
            if not eval_now:
                training.lap()
            values.update(training.system.sample())
            yield from training.hand_over(Record(step, training.wall(), values, training.batch_losses if eval_now else {}))
        training.checkpoint(step)
        if record_now or step == training.last_saved:
            training.segment = time.perf_counter()


class _Training:
    """One training of a run: what its loop holds between steps, and the steps it takes.

    ``state`` is the ``TrainState`` on the devices; ``window`` the train losses since the
    last eval; ``done`` the step it starts from (a checkpoint's, else 0) and ``offset``
    the wall time before it; ``last_saved`` / ``last_saved_at`` the step and clock of the
    newest checkpoint; ``segment`` the clock since which step time accrues (wall time
    between syncs, less probes, evals, writes and checkpoints); ``batch_losses`` the per-batch
    losses of the newest evaluation (``validate``), by split; ``test`` the test batches on the
    devices (None: the run has no test split); ``phases`` the seconds of each phase so far."""

    def __init__(self, config: RunConfig, devices: DeviceLayout, checkpoints: Checkpointer | None,
                 max_block: int | None, phases: Phases):
        self.phases = phases
        compile_cache.enable()
        self.config, self.devices, self.checkpoints = config, devices, checkpoints
        self.cfg = cfg = model_config(config)
        param_key, self.sketch_root = run_keys(config.seed)
        train_tokens, val, test = load_data(config)
        self.sampler = data.BatchSampler(train_tokens, config.effective_batch_size, config.effective_seq_len,
                                         config.seed)
        optimizer = optimizer_for(config)
        self.probe_names, self.probe_fn = make_dw_probe(cfg)
        state = init_state(init_params(cfg, param_key), optimizer)
        self.tokens_per_step = config.effective_batch_size * config.effective_seq_len
        self.start = time.perf_counter()
        self.system = SystemSampler(devices.local_devices())
        # shapes alone decide the compiled step and the memory figures
        self.example = np.zeros((config.effective_batch_size, config.effective_seq_len + 1), np.int32)
        self.key0 = sketch_key(self.sketch_root, 0)
        interim = config.effective_interim_val_batches
        self.eval_fn = devices.eval_step(cfg)
        self.val = held_out_chunks(devices.put_val, val, interim)
        self.test = None if test is None else held_out_chunks(devices.put_val, test, interim)
        self.batch_losses: dict[str, np.ndarray] = {}
        self.state = devices.put_state(state)
        step = devices.train_step(cfg, optimizer, self.state, config.dw_comm)
        self.step_fn = step.lower(self.state, devices.put_batch(self.example), devices.put_key(self.key0)).compile()
        limit = devices.block_limit(max_block if max_block is not None else block_limit(jax.default_backend()))
        self.schedule = Schedule.of(config, limit)
        self.window, self.done, self.offset = _Window(), 0, 0.0
        self.last_saved, self.last_saved_at, self.segment = 0, self.start, self.start
        phases.close("setup")

    # ------------------------------------------------------------------ start

    def resume(self, on_resume: Callable[[int, list[str]], None] | None) -> bool:
        """Continue from the newest valid checkpoint, if any; whether one was restored.
        ``on_resume`` hears the step it continues from (0: none) and why newer ones were skipped."""
        self.state, extra, notes = restore(self.checkpoints, self.state, self.phases)
        if on_resume is not None:
            on_resume(int(extra["step"]) if extra else 0, notes)
        if extra is None:
            return False
        self.sampler.set_state(extra["sampler"])
        self.window.checked, self.window.seconds = list(extra["window"]["losses"]), float(extra["window"]["seconds"])
        self.done, self.offset = int(extra["step"]), float(extra["wall_time"])
        return True

    def hand_over(self, record: Record) -> Iterator[Record]:
        """Yield ``record``; the time its caller keeps it (storing it) is ``write`` time."""
        with self.phases.timed("write"):
            yield record

    def initial_record(self) -> Record:
        """Step 0: the validation loss of the initial parameters on the interim batches (and,
        with ``test_every_eval``, the test loss) and the memory figures."""
        values = self.validate(self.schedule.tests(0), whole=self.schedule.whole(0))
        rows = jnp.asarray(self.devices.local_rows(self.example))
        with self.phases.timed("compile"):  # the saved residuals are listed by tracing two programs
            values.update(memory_figures(self.config, self.state.params, rows, self.step_fn, self.key0))
        values.update(self.system.sample())
        return Record(0, time.perf_counter() - self.start, values, self.batch_losses)

    def begin(self) -> None:
        """Start the clocks of checkpoints and step time at ``done``."""
        self.last_saved, self.last_saved_at = self.done, time.perf_counter()
        self.segment = time.perf_counter()

    # ------------------------------------------------------------------ steps

    def block_end(self, first: int) -> int:
        """The last step of the block that starts at ``first`` (``Schedule.block_end``)."""
        return self.schedule.block_end(first, self.last_saved if self.checkpoints is not None else None)

    def probe(self, first: int, batch: np.ndarray) -> dict[str, float]:
        """The dW probe of step ``first``, before it runs (on several devices: device 0's
        rows and sketch, as its step draws them); its time is not step time."""
        self.lap()
        with self.phases.timed("probe"):
            rows, key = self.devices.probe_inputs(batch, sketch_key(self.sketch_root, first))
            cos, rel = (np.asarray(a) for a in self.probe_fn(self.state.params, rows, key))
        cos = np.clip(cos, -1.0, 1.0)  # float32 rounding takes the exact estimator's 1 to 1.0000001
        values = {f"cos/{n}": float(c) for n, c in zip(self.probe_names, cos)}
        values.update({f"rel_err/{n}": float(r) for n, r in zip(self.probe_names, rel)})
        values.update(cos_mean=float(cos.mean()), rel_err_mean=float(rel.mean()))
        self.segment = time.perf_counter()
        return values

    def batches(self, first: int, last: int) -> np.ndarray:
        """The sampler's next batches, one per step ``first..last``."""
        return np.stack([self.sampler.next() for _ in range(first, last + 1)])

    def step(self, first: int, last: int, batches: np.ndarray) -> None:
        """Steps ``first..last``: one step, or one compiled block of them; their losses
        stay on the device, in the window."""
        if last == first:
            key = self.devices.put_key(sketch_key(self.sketch_root, first))
            self.state, loss = self.step_fn(self.state, self.devices.put_batch(batches[0]), key)
            losses = loss[None]
        else:
            c = self.config
            block = _train_block(self.cfg, c.optimizer, c.lr, c.momentum, c.weight_decay)
            self.state, losses = block(self.state, jnp.asarray(batches), self.sketch_root, jnp.int32(first))
        self.window.losses.append((first, losses))

    def tell(self, first: int, last: int, read: bool, on_step: Callable[[int, float | None], None] | None) -> None:
        """After steps ``first..last``: with ``read``, read the window's losses (one sync,
        which checks them); then ``on_step`` hears each step, the last with its loss if read."""
        if read:
            self.window.read(self.config.lr)
        if on_step:
            for s in range(first, last + 1):
                on_step(s, self.window.checked[-1] if s == last and read else None)

    def evaluate(self, step: int) -> dict[str, float]:
        """The eval record's values at ``step``: the window's mean train loss and throughput,
        the validation loss (on every validation batch at the last step, where comparisons
        read, and on the interim ones before it), at the last step the test loss and the
        compiled step's peak memory (with ``test_every_eval``, the test loss at every eval,
        interim before the last step); the window starts afresh."""
        self.lap()
        checked = self.window.checked
        final = self.schedule.whole(step)
        values = dict(train_loss=float(np.mean(checked)), **self.validate(self.schedule.tests(step), final),
                      tokens_per_s=len(checked) * self.tokens_per_step / self.window.seconds)
        if final and (peak := compiled_stats(self.step_fn).get("device_peak_bytes")) is not None:
            values["mem_peak_bytes"] = float(peak)
        self.window = _Window()
        return values

    def validate(self, test: bool = False, whole: bool = False) -> dict[str, float]:
        """``val_loss`` and ``val_loss_se`` of the current parameters (``val_summary``), and
        with ``test`` (when the run has a test split) ``test_loss`` and ``test_loss_se``, the
        same of the test batches; their per-batch losses become ``batch_losses["val"]`` (and
        ``["test"]``), for the record that carries them. ``whole``: every validation (and test)
        batch, as at the last step; else the interim ones (``effective_interim_val_batches``)."""
        val, tested = held_out(self.val, self.test, whole)
        with self.phases.timed("eval"):
            values, self.batch_losses = validation(self.eval_fn, self.state.params, val, tested if test else None)
        return values

    # ------------------------------------------------------------------ time and checkpoints

    def wall(self) -> float:
        return self.offset + time.perf_counter() - self.start

    def lap(self) -> None:
        """Close the current segment of step time (after the device has finished it); the
        phases count what ran since their last boundary as training."""
        jax.block_until_ready(self.state)
        self.window.seconds += time.perf_counter() - self.segment
        self.phases.close("train")

    def checkpoint(self, step: int) -> None:
        """Save at the last step (final), and whenever ``Schedule.checkpoint_due`` says so (on
        several processes: as process 0's clock says)."""
        if self.schedule.is_last(step):
            self.save(step, final=True)
        elif self.devices.agree(self.schedule.checkpoint_due(step, self.last_saved,
                                                             time.perf_counter() - self.last_saved_at)):
            self.lap()
            self.save(step)

    def stop(self, step: int) -> None:
        """End at ``step`` (asked to stop): its losses are checked, its state saved."""
        self.window.read(self.config.lr)
        self.save(step)

    def save(self, step: int, *, final: bool = False) -> None:
        """Checkpoint ``step`` (unless it is saved already): the state, the sampler, the loss
        window (read first: the losses still on the device belong to it) and the wall time."""
        if self.checkpoints is None or (step == self.last_saved and not final):
            return
        self.window.read(self.config.lr)
        extra = {"step": step, "sampler": self.sampler.state(), "window": self.window.state(), "wall_time": self.wall(),
                 "config": self.config.to_dict()}
        with self.phases.timed("checkpoint"):
            self.checkpoints.save(step, self.state, extra, final=final)
        self.last_saved, self.last_saved_at = step, time.perf_counter()


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
