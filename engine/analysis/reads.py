"""Where a comparison is read, and why there: the one decision that Table 3, claim (c),
Compare, the report and ``engine summary`` all print.

A comparable group (``engine.config.comparable_key``: the runs that differ only by method and
seed) is read at one step S, chosen by ``read_group``:

* ``at_step`` when the user names one;
* else the latest step every *live* run of the group has a validation loss at. A live run is
  one that is not failed or cancelled: a run still training (or interrupted, to be resumed)
  holds the read back to its latest validation; a run that has not validated at all (queued)
  holds nothing back and its seed is missing at S.
* Failed and cancelled runs leave the choice of S. They are out of the comparison: a failed
  run whose error says its training loss became non-finite (``DIVERGED_ERROR``) is a
  *diverged* seed of its method (``diverged``), which Table 3 counts against the method.

S = 0 is "not trained yet": every method of a seed starts from the same parameters, so Δ is
exactly 0 there and says nothing; no Δ and no verdict are read at step 0.

A step before a run's last is validated on its *interim* batches, the first
``effective_interim_val_batches`` of the validation set (``engine.training.loop``); the read
says so (``Read.interim``), since its batch noise is that of fewer batches. The last step
always reads every batch.

``read_text`` says it in one sentence: the step, why it is not the furthest step any run
validated at (which runs held it back, at which step, in which state), and which runs were
left out (diverged, failed, cancelled, not yet validated).
"""

from __future__ import annotations

from typing import NamedTuple

from engine.config.identity import stored
from engine.core.choices import DIVERGED_ERROR

LEFT_STATUSES = ("failed", "cancelled")  # runs out of the comparison: they never hold its step back
NOT_TRAINED = "not trained yet"  # Table 3's word for a group read at step 0
SHOWN_RUNS = 8  # runs named per list in a read's sentence before "and N more"


def diverged(record) -> bool:
    """Whether the run failed because its training loss became NaN or infinite."""
    return record.status == "failed" and (record.error or "").startswith(DIVERGED_ERROR)


class Read(NamedTuple):
    """Where one comparable group is read (module docstring).

    ``step``: the step read (None: no live run has validated); ``furthest``: the furthest
    step any run of the group validated at; ``asked``: whether ``step`` was the user's;
    ``held``: (run id, its last validated step, status) of the live runs that have not
    validated at ``furthest``; ``left``: (run id, seed, why) of the runs out of the
    comparison, why being "diverged", "failed" or "cancelled"; ``waiting``: ids of live runs
    with no validation yet; ``interim``: (interim batches, validation batches) when ``step``
    is before the last step of a live run, so it was validated on the interim batches only
    (None otherwise)."""

    step: int | None
    furthest: int | None
    asked: bool
    held: tuple[tuple[int, int, str], ...]
    left: tuple[tuple[int, int | None, str], ...]
    waiting: tuple[int, ...]
    interim: tuple[int, int] | None = None

    @property
    def whole(self) -> bool:
        """Whether nothing is missing from the read: trained, at the furthest step, no run held
        it back, left it or waits."""
        return self.trained and self.step == self.furthest and not (self.held or self.left or self.waiting)

    @property
    def trained(self) -> bool:
        """Whether the read step is past step 0 (the only steps a verdict is read at)."""
        return self.step is not None and self.step > 0


def _why_left(record) -> str:
    return "diverged" if diverged(record) else record.status


def read_group(members, val_steps: dict[int, set[int]], at_step: int | None = None) -> Read:
    """The ``Read`` of the group of run records ``members`` whose validation steps are
    ``val_steps`` (run id → steps; a run without validations may be absent)."""
    members = sorted(members, key=lambda r: r.id)
    live = [r for r in members if r.status not in LEFT_STATUSES]
    left = tuple((r.id, r.seed, _why_left(r)) for r in members if r.status in LEFT_STATUSES)
    validated = {r.id: val_steps[r.id] for r in live if val_steps.get(r.id)}
    waiting = tuple(r.id for r in live if r.id not in validated)
    every = [s for r in members for s in val_steps.get(r.id, ())]
    furthest = max(every) if every else None
    if at_step is not None:
        step: int | None = int(at_step)
    else:
        shared = set.intersection(*validated.values()) if validated else set()
        step = max(shared) if shared else None
    status = {r.id: r.status for r in live}
    held = tuple((i, max(s), status[i]) for i, s in validated.items()
                 if furthest is not None and furthest not in s and (step is None or max(s) < furthest))
    return Read(step, furthest, at_step is not None, held, left, waiting, _interim(live, step))


def _interim(live, step: int | None) -> tuple[int, int] | None:
    """(fewest interim batches, their validation batches) of the live runs that read ``step``
    before their last step on fewer batches than at it; None when none did."""
    if not step:
        return None
    sizes = []
    for r in live:
        values = getattr(r, "config", None)
        config = stored(values) if values else None
        if config is not None and step < config.steps:
            interim, whole = config.effective_interim_val_batches, config.effective_val_batches
            if interim < whole:
                sizes.append((interim, whole))
    return min(sizes) if sizes else None


def _runs(items: list[str]) -> str:
    shown = ", ".join(items[:SHOWN_RUNS])
    return shown + (f" and {len(items) - SHOWN_RUNS} more" if len(items) > SHOWN_RUNS else "")


def _where(read: Read) -> str:
    if read.step is None:
        return "Nothing to read: no run still in the comparison has validated yet"
    if read.asked:
        return f"Read at step {read.step:,} (asked for)"
    if read.step == 0:
        return ("Not trained yet: read at step 0, where every method of a seed holds the same parameters, so no Δ "
                "and no verdict")
    if read.step == read.furthest:
        return f"Read at step {read.step:,}, the furthest any run validated at"
    return f"Read at step {read.step:,}, not {read.furthest:,}"


def read_text(read: Read) -> str:
    """``read`` in one sentence (module docstring)."""
    parts = [_where(read)]
    if read.held and not read.asked:
        parts.append("held back by " + _runs([f"#{i} ({status}, validated to step {s:,})" for i, s, status in read.held]))
    if read.left:
        parts.append("left out: " + _runs([f"#{i} {why}" + ("" if seed is None else f" (seed {seed})")
                                          for i, seed, why in read.left]))
    if read.waiting:
        parts.append("not validated yet (their seeds are missing): " + _runs([f"#{i}" for i in read.waiting]))
    if read.interim:
        parts.append(f"validated there on the interim batches ({read.interim[0]:,} of {read.interim[1]:,}; "
                     "a run's last step reads them all)")
    return "; ".join(parts) + "."
