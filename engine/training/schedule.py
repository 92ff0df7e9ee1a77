"""When a run evaluates, probes, records, reads its losses and checkpoints: one ``Schedule``.

A run's steps are numbered 1..``steps``; step 0 is its initial parameters. The loop
(``engine.training.loop.train``) and a cohort (``engine.training.cohort``) run steps in blocks
``first..last`` and ask the schedule, once per block, what is due:

- **eval** at every step that is a multiple of ``eval_every`` (step 0 included) and at the
  last step. An eval before the last step reads the interim validation batches
  (``RunConfig.effective_interim_val_batches``); the last step's reads every validation batch
  (``whole``) and the test split's, which evals before it read only with ``test_every_eval``.
- **probe** (the cosine of the sketched dW, ``engine.model.memory.make_dw_probe``) before every
  step that is a multiple of ``probe_every`` (0: never), when the run has sketched layers to
  probe (``probing``; an exact run probes the layers a sketched twin would sketch, its reference 1.0).
- **sample** the system metrics after every step that is a multiple of ``probe_every``, probed or not.
- **record** after a block whose first step probes or whose last step evaluates or samples.
- **read** the train losses (one device sync, which checks them finite) after a block that
  probes or evaluates.
- **checkpoint** at the last step; before it, every ``checkpoint_every`` steps, or without
  it by time: at the first eval step ``checkpoint_seconds`` after the last checkpoint, or at
  any step 1.5 times that after it (a checkpoint holds the partial loss window, so any step
  is exact).

Blocks end where something is due (``block_end``), so no rule is ever skipped. The schedule
is pure arithmetic on the run config (no JAX): the time estimate (``engine.training.timing``)
counts the evals and probes it will run from it. What changes while a run trains (the step
and clock of its last checkpoint) stays with the caller and is passed in.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.config import CHECKPOINT_SECONDS, TIME_CHECKPOINT_SLACK, RunConfig


@dataclass(frozen=True)
class Schedule:
    """The rules of one run (module docstring). ``limit`` is the most steps one compiled block
    runs (``engine.training.loop.block_limit``), a power of two."""

    steps: int
    eval_every: int
    probe_every: int
    probing: bool
    checkpoint_every: int | None
    test_every_eval: bool
    limit: int = 1
    checkpoint_seconds: float = CHECKPOINT_SECONDS

    @classmethod
    def of(cls, config: RunConfig, limit: int = 1) -> "Schedule":
        """The schedule of ``config`` in blocks of at most ``limit`` steps. It probes when the
        model has layers to probe: ``GPTConfig.sketched_kernel_paths``, the layers whose dW the
        probe measures (none for ``sketched_layers="none"``)."""
        probing = bool(config.model_config(backend="").sketched_kernel_paths())
        return cls(steps=config.steps, eval_every=config.effective_eval_interval, probe_every=config.probe_interval,
                   probing=probing, checkpoint_every=config.checkpoint_interval,
                   test_every_eval=config.test_every_eval, limit=limit)

    # ------------------------------------------------------------------ what is due at a step

    def is_last(self, step: int) -> bool:
        return step == self.steps

    def evaluates(self, step: int) -> bool:
        """Validate after ``step``: a multiple of ``eval_every`` (0 included) or the last step."""
        return step % self.eval_every == 0 or self.is_last(step)

    def whole(self, step: int) -> bool:
        """The eval at ``step`` reads every validation (and test) batch: the last step; the
        others read the interim batches."""
        return self.is_last(step)

    def tests(self, step: int) -> bool:
        """The eval at ``step`` also evaluates the test split: the last step, or every eval
        with ``test_every_eval`` (when the run has a test split)."""
        return self.whole(step) or self.test_every_eval

    def probes(self, first: int) -> bool:
        """Probe dW on the parameters before step ``first``: a multiple of ``probe_every``
        (never when it is 0 or nothing is probed)."""
        return self.probing and self.samples(first)

    def samples(self, step: int) -> bool:
        """Record the system metrics after ``step``: a multiple of ``probe_every`` (none when 0)."""
        return bool(self.probe_every) and step % self.probe_every == 0

    def records(self, first: int, last: int) -> bool:
        """The block ``first..last`` ends in a record: it probes, evaluates or samples."""
        return self.probes(first) or self.evaluates(last) or self.samples(last)

    def reads(self, first: int, last: int) -> bool:
        """The block's train losses come to the host (one sync that checks them) after it:
        it probes or evaluates."""
        return self.probes(first) or self.evaluates(last)

    def checkpoint_due(self, step: int, last_saved: int, seconds_since: float) -> bool:
        """A checkpoint at ``step`` (not the last, which always saves), the last one at step
        ``last_saved``, ``seconds_since`` ago: ``checkpoint_every`` steps after it, or without
        it ``checkpoint_seconds`` after it at an eval step and ``TIME_CHECKPOINT_SLACK`` times
        that at any step."""
        if self.checkpoint_every is not None:
            return step - last_saved >= self.checkpoint_every
        slack = 1.0 if self.evaluates(step) else TIME_CHECKPOINT_SLACK
        return seconds_since >= self.checkpoint_seconds * slack

    # ------------------------------------------------------------------ blocks

    def block_end(self, first: int, last_saved: int | None = None, until: int | None = None) -> int:
        """The last step of the block that starts at ``first``. A block ends at the next eval
        step, the last step and the next sampling step; a probe step is a block of its own (the
        probe reads the parameters before its step, its record follows it), so a probing block
        ends the step before the next probe; with checkpoints by steps and ``last_saved`` (None:
        the run keeps no checkpoints) it ends ``checkpoint_every`` steps after ``last_saved``;
        it never passes ``until``. It holds at most ``limit`` steps, a power of two (so a few
        compiled programs serve every run): the longest such block within those ends."""
        if self.probes(first):
            return first
        last = min(self.steps, first + self.limit - 1, _next_multiple(first, self.eval_every))
        if self.probe_every:
            next_probe = _next_multiple(first + 1, self.probe_every)
            last = min(last, next_probe - 1 if self.probing else _next_multiple(first, self.probe_every))
        if self.checkpoint_every is not None and last_saved is not None:
            last = min(last, max(first, last_saved + self.checkpoint_every))
        if until is not None:
            last = min(last, until)
        n = last - first + 1
        return first + (1 << (n.bit_length() - 1)) - 1

    # ------------------------------------------------------------------ counts

    def eval_steps(self) -> list[int]:
        """Every step that evaluates, step 0 and the last step included, in order."""
        return sorted(set(range(0, self.steps + 1, self.eval_every)) | {self.steps})

    def probe_steps(self) -> list[int]:
        """Every step probed before it runs, in order."""
        if not (self.probing and self.probe_every):
            return []
        return list(range(self.probe_every, self.steps + 1, self.probe_every))


def _next_multiple(step: int, every: int) -> int:
    """The least multiple of ``every`` at or after ``step``."""
    return -(-step // every) * every
