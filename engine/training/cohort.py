"""Cohorts: runs that differ only by seed and learning rate, trained as one compiled program
over a leading axis.

``train_cohort(configs)`` trains runs whose configs are equal but for seed, name and learning
rate (``RunConfig.cohort()``: the seeds of a setup, a tuning campaign's trials of one method)
together: their ``TrainState``s stacked, each step (or compiled block of steps,
``engine.training.loop.block_limit``) one ``jax.vmap`` of a run's own block over the members'
states, batches, sketch roots and learning rates (the optimizer takes its learning rate as
data: ``engine.training.steps.lr_train_block``). A member computes what its run alone computes
(``engine.training.loop.train``): the same initial parameters (``run_keys(seed)``), the same
batches (its own ``BatchSampler`` of its seed), the same sketch keys (``sketch_key(root, step)``),
the same update at its learning rate, so its losses and parameters equal its single run's to
rounding (the batched program may order float operations otherwise). Its records are its run's, the same steps and values (memory
figures of the run's own compiled step; ``tokens_per_s``: its tokens over the cohort's step time).

It yields ``(member, Record)`` as ``train`` yields a run's records, and one ``(member, Ended)``
when a member leaves. A member leaves alone: at its last step (``finished``), asked to stop
(its ``should_stop``: it saves, ``stopped``), on a non-finite loss (``failed``, with the
``TrainingDiverged``), when its checkpoint's save or restore raises (``failed``, with the error:
its lease lost, its disk full) or when ``drop``ped (its caller stopped listening: no save).
The others go on; the stacked state is rebuilt without it (recompiled for the smaller cohort).

Checkpoints: each member saves its own slice of the stacked state to its own checkpoints, the
same pytree as its single run's, so a run resumes alone or in a cohort alike; with ``resume``
each member restores its newest valid checkpoint. Members at different steps train in groups:
those at the lowest step step together until they reach the next ones, then join them.
"""

from __future__ import annotations

import functools
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from engine import data
from engine.config import ConfigError, RunConfig
from engine.errors import TASK_FAILURES
from engine.model.gpt import init_params
from engine.model.memory import make_dw_probe
from engine.training import compile_cache
from engine.training.build import model_config, optimizer_for, run_keys, sketch_key
from engine.training.compiled import compiled_stats
from engine.training.devices import SingleDevice
from engine.training.inputs import load_data
from engine.training.loop import (
    Checkpointer,
    Record,
    _Window,
    block_limit,
    held_out,
    held_out_chunks,
    memory_figures,
    restore,
    validation,
)
from engine.training.phases import Phases
from engine.training.schedule import Schedule
from engine.training.steps import init_state, lr_train_block
from engine.training.system import SystemSampler

FINISHED, STOPPED, FAILED, DROPPED = "finished", "stopped", "failed", "dropped"
# Backends on which a cohort trains its seeds faster than separate runs. Measured on the 2-core
# CPU (issue 41): 8 paper-preset seeds as one vmapped step are 1.30x (exact) to 1.85x (basis R=1)
# slower per seed than 8 separate steps, so the CPU trains runs one by one; on a GPU one
# paper-preset step (under a millisecond) leaves the device idle, where a cohort fills it.
COHORT_BACKENDS = ("gpu", "cuda", "rocm")


def cohorts_pay(backend: str | None = None) -> bool:
    """Whether a cohort pays on ``backend`` (default: the one JAX runs on): ``COHORT_BACKENDS``."""
    return (backend or jax.default_backend()) in COHORT_BACKENDS


@dataclass(frozen=True)
class Ended:
    """A member left the cohort at ``step`` (the last step its records and checkpoints reached):
    ``how`` is ``finished``, ``stopped``, ``failed`` (``error`` says why) or ``dropped``."""

    step: int
    how: str
    error: BaseException | None = None


@dataclass(eq=False)
class _Member:
    """One run of the cohort: what its own ``engine.training.loop._Training`` would hold.
    ``state`` is its ``TrainState`` while it is not in the stacked state (None inside)."""

    index: int
    config: RunConfig
    sampler: data.BatchSampler
    sketch_root: jax.Array
    state: Any
    checkpoints: Checkpointer | None
    should_stop: Callable[[], bool]
    on_step: Callable[[int, float | None], None] | None
    window: _Window = field(default_factory=_Window)
    done: int = 0
    offset: float = 0.0
    last_saved: int = 0
    last_saved_at: float = 0.0
    alive: bool = True
    ended: Ended | None = None  # why it left, when a checkpoint of it ended it
    dropped: threading.Event = field(default_factory=threading.Event)

    def batches(self, first: int, last: int) -> np.ndarray:
        return np.stack([self.sampler.next() for _ in range(first, last + 1)])


def check_cohort(configs: Sequence[RunConfig]) -> None:
    """``ConfigError`` unless ``configs`` can train as one cohort: one or more runs on one device
    each, equal but for seed, name and learning rate (``RunConfig.cohort()``), no two of the
    same seed and learning rate."""
    if not configs:
        raise ConfigError("a cohort needs at least one run")
    if any(c.cohort() != configs[0].cohort() for c in configs):
        raise ConfigError("the runs of a cohort differ only by seed, name and learning rate; group them by "
                          "RunConfig.cohort()")
    if configs[0].devices != 1:
        raise ConfigError(f"a cohort trains runs on one device each (devices is {configs[0].devices})")
    if len({(c.seed, c.lr) for c in configs}) != len(configs):
        raise ConfigError("the runs of a cohort differ in seed or learning rate")


@functools.lru_cache(maxsize=16)
def _cohort_block(cfg, optimizer: str, momentum: float, weight_decay: float) -> Callable:
    """``block(states[M], batches[M, n, B, T+1], sketch_roots[M], first, lrs[M]) -> (states, losses[M, n])``:
    ``lr_train_block`` over a leading member axis (``jax.vmap``), each member at its own
    learning rate, jitted, state donated; recompiled per cohort size and block length."""
    block = lr_train_block(cfg, optimizer, momentum=momentum, weight_decay=weight_decay)
    return jax.jit(jax.vmap(block, in_axes=(0, 0, 0, None, 0)), donate_argnums=0)


def _stack(trees: list) -> Any:
    return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def _slice(tree, k: int) -> Any:
    return jax.tree.map(lambda x: x[k], tree)


def train_cohort(
    configs: Sequence[RunConfig],
    *,
    should_stop_each: Sequence[Callable[[], bool]] | None = None,
    on_step_each: Sequence[Callable[[int, float | None], None] | None] | None = None,
    checkpoints_each: Sequence[Checkpointer | None] | None = None,
    resume: bool = False,
    on_resume_each: Sequence[Callable[[int, list[str]], None] | None] | None = None,
    max_block: int | None = None,
    phases: Phases | None = None,
) -> Iterator[tuple[int, Record | Ended]]:
    """Train ``configs`` as one cohort (``Cohort``) and yield ``(member, Record | Ended)``;
    member i is ``configs[i]``, with the i-th of each ``*_each`` (``train``'s ``should_stop``,
    ``on_step``, ``checkpoints`` and ``on_resume`` of its run)."""
    cohort = Cohort(configs, should_stop_each=should_stop_each, on_step_each=on_step_each,
                    checkpoints_each=checkpoints_each, max_block=max_block, phases=phases)
    yield from cohort.records(resume=resume, on_resume_each=on_resume_each)


class Cohort:
    """One training of a cohort; ``records`` trains it, ``drop(i)`` (from any thread) ends
    member i before its next block without a save."""

    def __init__(self, configs: Sequence[RunConfig], *, should_stop_each=None, on_step_each=None,
                 checkpoints_each=None, max_block: int | None = None, phases: Phases | None = None):
        check_cohort(configs)
        n = len(configs)
        self.phases = phases = phases or Phases()
        compile_cache.enable()
        self.config = config = configs[0]
        self.cfg = cfg = model_config(config)
        train_tokens, val, test = load_data(config)
        optimizer = optimizer_for(config)  # the runs' own step, for their memory figures
        self.probe_names, self.probe_fn = make_dw_probe(cfg)
        stops = should_stop_each or [lambda: False] * n
        steps_cb, saves = on_step_each or [None] * n, checkpoints_each or [None] * n
        self.members = [self._member(i, c, train_tokens, stops[i], steps_cb[i], saves[i]) for i, c in enumerate(configs)]
        self.tokens_per_step = config.effective_batch_size * config.effective_seq_len
        self.start = time.perf_counter()
        devices = SingleDevice()
        self.system = SystemSampler(devices.local_devices())
        self.example = np.zeros((config.effective_batch_size, config.effective_seq_len + 1), np.int32)
        interim = config.effective_interim_val_batches
        self.eval_fn = devices.eval_step(cfg)
        self.val = held_out_chunks(devices.put_val, val, interim)
        self.test = None if test is None else held_out_chunks(devices.put_val, test, interim)
        key0 = sketch_key(self.members[0].sketch_root, 0)
        step = devices.train_step(cfg, optimizer, self.members[0].state, config.dw_comm)
        # a member's memory figures are its run's: those of the run's own compiled step
        self.step_fn = step.lower(self.members[0].state, jnp.asarray(self.example), key0).compile()
        self.block_fn = _cohort_block(cfg, config.optimizer, config.momentum, config.weight_decay)
        # its members' configs differ only by seed and name: one schedule is every member's
        self.schedule = Schedule.of(config, max_block if max_block is not None else block_limit(jax.default_backend()))
        self.stacked: Any = None
        self.stacked_members: list[_Member] = []
        self.stacked_data: tuple[jax.Array, jax.Array] | None = None  # the stack's sketch roots and learning rates
        self.pending: list[tuple[int, list[_Member], jax.Array]] = []  # (first step, members, losses[M, n])
        self.segment = self.start
        phases.close("setup")

    def _member(self, i, config, train_tokens, should_stop, on_step, checkpoints) -> _Member:
        param_key, sketch_root = run_keys(config.seed)
        sampler = data.BatchSampler(train_tokens, config.effective_batch_size, config.effective_seq_len, config.seed)
        state = init_state(init_params(self.cfg, param_key), optimizer_for(config))
        return _Member(i, config, sampler, sketch_root, state, checkpoints, should_stop, on_step)

    def drop(self, index: int) -> None:
        """End member ``index`` before its next block, without a save (thread-safe)."""
        self.members[index].dropped.set()

    # ------------------------------------------------------------------ the loop

    def records(self, *, resume: bool = False, on_resume_each=None) -> Iterator[tuple[int, Record | Ended]]:
        """Train the cohort to its end; yield ``(member, Record)`` and ``(member, Ended)``."""
        hooks = on_resume_each or [None] * len(self.members)
        for m in self.members:
            if not resume:
                yield from self.hand_over(m, self.initial_record(m))
                continue
            restored = self.resume(m, hooks[m.index])
            if isinstance(restored, Ended):
                yield from self.end(m, restored)
            elif not restored:
                yield from self.hand_over(m, self.initial_record(m))
            elif m.done >= m.config.steps:
                yield from self.end(m, Ended(m.done, FINISHED))
        self.begin()
        while group := self.group():
            leaving = [m for m in self.members if m.alive and (m.dropped.is_set() or m.should_stop())]
            if not leaving:
                yield from self.advance(group)
            for m in leaving:
                yield from self.end(m, Ended(m.done, DROPPED) if m.dropped.is_set() else self.stop(m))

    def advance(self, group: list[_Member]) -> Iterator[tuple[int, Record | Ended]]:
        """One block of ``group``'s steps, then its records and checkpoints."""
        schedule = self.schedule
        first = group[0].done + 1
        last = self.block_end(group, first)
        batches = np.stack([m.batches(first, last) for m in group])
        eval_now, record_now = schedule.evaluates(last), schedule.records(first, last)
        values: dict[int, dict[str, float]] = {m.index: {} for m in group}
        if schedule.probes(first):
            values = self.probe(group, first, batches[:, 0])
        self.step(group, first, last, batches)
        yield from self.tell(group, first, last, schedule.reads(first, last))
        live = [m for m in group if m.alive]
        losses: dict[int, dict] = {}
        if eval_now and live:
            self.lap(live)
            for m in live:
                more, losses[m.index] = self.evaluate(m, last)
                values[m.index].update(more)
        if live and record_now:
            if not eval_now:
                self.lap(live)
            system = self.system.sample()
            for m in live:
                record = Record(last, self.wall(m), {**values[m.index], **system}, losses.get(m.index, {}))
                yield from self.hand_over(m, record)
        saved = False
        for m in live:
            saved = self.checkpoint(m, last) or saved
            if m.ended is not None:
                yield from self.end(m, m.ended)
            elif schedule.is_last(last):
                yield from self.end(m, Ended(last, FINISHED))
        if record_now or saved:
            self.segment = time.perf_counter()

    def hand_over(self, m: _Member, item: Record | Ended) -> Iterator[tuple[int, Record | Ended]]:
        """Yield ``(m.index, item)``; the time its caller keeps it is ``write`` time."""
        with self.phases.timed("write"):
            yield m.index, item

    def end(self, m: _Member, ended: Ended) -> Iterator[tuple[int, Record | Ended]]:
        """Member ``m`` leaves the cohort as ``ended`` says."""
        m.alive = False
        yield from self.hand_over(m, ended)

    # ------------------------------------------------------------------ start

    def initial_record(self, m: _Member) -> Record:
        """Step 0 of member ``m``, as its run records it (``_Training.initial_record``)."""
        c, schedule = m.config, self.schedule
        with self.phases.timed("eval"):
            val, test = held_out(self.val, self.test, schedule.whole(0))
            values, losses = validation(self.eval_fn, m.state.params, val, test if schedule.tests(0) else None)
        with self.phases.timed("compile"):
            key0 = sketch_key(m.sketch_root, 0)
            values.update(memory_figures(c, m.state.params, jnp.asarray(self.example), self.step_fn, key0))
        values.update(self.system.sample())
        return Record(0, time.perf_counter() - self.start, values, losses)

    def resume(self, m: _Member, on_resume) -> bool | Ended:
        """Continue member ``m`` from its newest valid checkpoint, if any (``_Training.resume``);
        whether one was restored, or ``Ended`` when reading it raised past the checkpoints' own errors."""
        try:
            m.state, extra, notes = restore(m.checkpoints, m.state, self.phases)
            if on_resume is not None:
                on_resume(int(extra["step"]) if extra else 0, notes)
            if extra is None:
                return False
            m.sampler.set_state(extra["sampler"])
        except TASK_FAILURES as e:
            return Ended(0, FAILED, e)
        m.window.checked, m.window.seconds = list(extra["window"]["losses"]), float(extra["window"]["seconds"])
        m.done, m.offset = int(extra["step"]), float(extra["wall_time"])
        return True

    def begin(self) -> None:
        now = time.perf_counter()
        for m in self.members:
            m.last_saved, m.last_saved_at = m.done, now
        self.segment = now

    # ------------------------------------------------------------------ the stacked state

    def group(self) -> list[_Member]:
        """The live members at the lowest step, the ones in the stacked state (rebuilt when they change)."""
        live = [m for m in self.members if m.alive]
        if not live:
            return []
        low = min(m.done for m in live)
        group = [m for m in live if m.done == low]
        if group != self.stacked_members:
            self.restack(group)
        return group

    def restack(self, group: list[_Member]) -> None:
        """Stack ``group``'s states; the live members leaving the stack keep their slices."""
        self.flush()
        for k, m in enumerate(self.stacked_members):
            if m.alive and m not in group:
                m.state = _slice(self.stacked, k)
        states = [self.state_of(m) for m in group]
        for m in group:
            m.state = None
        data = (jnp.stack([m.sketch_root for m in group]), jnp.asarray([m.config.lr for m in group], jnp.float32))
        self.stacked, self.stacked_members, self.stacked_data = _stack(states), group, data

    def state_of(self, m: _Member):
        """Member ``m``'s ``TrainState``: its own, or its slice of the stacked state."""
        if m.state is not None:
            return m.state
        return _slice(self.stacked, self.stacked_members.index(m))

    def block_end(self, group: list[_Member], first: int) -> int:
        """The last step of the block that starts at ``first``: where each member's run would end
        it (``Schedule.block_end``), and never past the step of a member waiting ahead."""
        ahead = [m.done for m in self.members if m.alive and m.done >= first]
        until = min(ahead) if ahead else None
        return min(self.schedule.block_end(first, m.last_saved if m.checkpoints is not None else None, until)
                   for m in group)

    # ------------------------------------------------------------------ steps

    def step(self, group: list[_Member], first: int, last: int, batches: np.ndarray) -> None:
        """Steps ``first..last`` of every member of ``group``, as one program; losses stay on the device."""
        assert group == self.stacked_members and self.stacked_data is not None
        roots, lrs = self.stacked_data  # made once per stack (``restack``), not once per block
        self.stacked, losses = self.block_fn(self.stacked, jnp.asarray(batches), roots, jnp.int32(first), lrs)
        self.pending.append((first, group, losses))
        for m in group:
            m.done = last

    def flush(self) -> None:
        """Hand the losses still on the device to their members' windows (one sync), unread."""
        if not self.pending:
            return
        host = jax.device_get([losses for _, _, losses in self.pending])
        for (first, members, _), values in zip(self.pending, host):
            for k, m in enumerate(members):
                m.window.losses.append((first, np.asarray(values[k])))
        self.pending = []

    def read(self, m: _Member) -> Ended | None:
        """Read (check) member ``m``'s losses; ``Ended`` when one is not finite (``TrainingDiverged``)."""
        self.flush()
        try:
            m.window.read(m.config.lr)
        except TASK_FAILURES as e:
            return Ended(getattr(e, "step", m.done), FAILED, e)
        return None

    def tell(self, group, first: int, last: int, read: bool) -> Iterator[tuple[int, Record | Ended]]:
        """After steps ``first..last``: with ``read``, read every member's losses (a member whose
        loss is not finite ends); then each member's ``on_step`` hears each step."""
        for m in group:
            ended = self.read(m) if read else None
            if ended is not None:
                yield from self.end(m, ended)
            elif m.on_step is not None:
                for s in range(first, last + 1):
                    m.on_step(s, m.window.checked[-1] if s == last and read else None)

    def probe(self, group: list[_Member], first: int, rows: np.ndarray) -> dict[int, dict[str, float]]:
        """Each member's dW probe of step ``first``, before it runs (``_Training.probe``)."""
        self.lap(group)
        out = {}
        with self.phases.timed("probe"):
            for k, m in enumerate(group):
                key = sketch_key(m.sketch_root, first)
                cos, rel = (np.asarray(a) for a in self.probe_fn(self.state_of(m).params, jnp.asarray(rows[k]), key))
                cos = np.clip(cos, -1.0, 1.0)
                values = {f"cos/{n}": float(c) for n, c in zip(self.probe_names, cos)}
                values.update({f"rel_err/{n}": float(r) for n, r in zip(self.probe_names, rel)})
                out[m.index] = dict(values, cos_mean=float(cos.mean()), rel_err_mean=float(rel.mean()))
        self.segment = time.perf_counter()
        return out

    def evaluate(self, m: _Member, step: int) -> tuple[dict[str, float], dict[str, np.ndarray]]:
        """Member ``m``'s eval values at ``step`` and per-batch losses (``_Training.evaluate``)."""
        final = self.schedule.whole(step)
        val, test = held_out(self.val, self.test, final)
        checked = m.window.checked
        with self.phases.timed("eval"):
            values, losses = validation(self.eval_fn, self.state_of(m).params, val,
                                        test if self.schedule.tests(step) else None)
        values = dict(train_loss=float(np.mean(checked)), **values,
                      tokens_per_s=len(checked) * self.tokens_per_step / m.window.seconds)
        if final and (peak := compiled_stats(self.step_fn).get("device_peak_bytes")) is not None:
            values["mem_peak_bytes"] = float(peak)
        m.window = _Window()
        return values, losses

    # ------------------------------------------------------------------ time and checkpoints

    def wall(self, m: _Member) -> float:
        return m.offset + time.perf_counter() - self.start

    def lap(self, group: list[_Member]) -> None:
        """Close the current segment of step time: every member of ``group`` trained through it."""
        jax.block_until_ready(self.stacked)
        seconds = time.perf_counter() - self.segment
        for m in group:
            m.window.seconds += seconds
        self.phases.close("train")
        self.segment = time.perf_counter()

    def checkpoint(self, m: _Member, step: int) -> bool:
        """Save member ``m`` at its last step and when ``Schedule.checkpoint_due``; whether it saved (a
        save that raised ends it: ``m.ended``)."""
        last = self.schedule.is_last(step)
        if not last:
            if not self.schedule.checkpoint_due(step, m.last_saved, time.perf_counter() - m.last_saved_at):
                return False
            self.lap([x for x in self.stacked_members if x.alive])
        ended = self.save(m, step, final=last)
        m.ended = ended
        return True

    def stop(self, m: _Member) -> Ended:
        """End member ``m`` at its step (asked to stop): its losses are checked, its state saved."""
        return self.read(m) or self.save(m, m.done) or Ended(m.done, STOPPED)

    def save(self, m: _Member, step: int, *, final: bool = False) -> Ended | None:
        """Checkpoint member ``m`` at ``step`` as its run would (``_Training.save``); ``Ended``
        when its losses are not finite or its save raised."""
        if m.checkpoints is None or (step == m.last_saved and not final):
            return None
        ended = self.read(m)
        if ended is not None:
            return ended
        extra = {"step": step, "sampler": m.sampler.state(), "window": m.window.state(), "wall_time": self.wall(m),
                 "config": m.config.to_dict()}
        try:
            with self.phases.timed("checkpoint"):
                m.checkpoints.save(step, self.state_of(m), extra, final=final)
        except TASK_FAILURES as e:
            return Ended(m.last_saved, FAILED, e)
        m.last_saved, m.last_saved_at = step, time.perf_counter()
        return None
