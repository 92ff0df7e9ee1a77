"""Which evaluation split a comparable group of Table 3 is read on, and why.

Runs of this version also record the held-out TEST split (``test_loss`` at their last step,
at every evaluation when asked; per-batch losses under split "test"); runs of older
versions have validation only. The step of a group is chosen on validation
(``engine.analysis.reads.read_group``); then ``split_read`` decides what is read there:

* ``"val"``: validation, as before the test split existed;
* ``"test"`` or ``"auto"``: the test split when every counted run of the group (live, with a
  validation at the read step) recorded ``test_loss`` at that step; else validation, and the
  note says which runs lacked it and why: never silently. ``"auto"`` says nothing of a group
  none of whose runs ever recorded a test loss (a table of older runs reads as it always did).

``tuned_text`` names the values of the free run fields (``engine.config.identities.identity.comparable_key``'s
``free``: fields such as ``lr`` that are part of the method, each tuned on its own) a row's runs used.
"""

from __future__ import annotations

from typing import NamedTuple

from engine.analysis.reads import LEFT_STATUSES, SHOWN_RUNS, Read

SPLITS = ("val", "test", "auto")
VAL, TEST = "val", "test"


class SplitRead(NamedTuple):
    """The split a group is read on (``VAL`` or ``TEST``) and the note that says why ("" for none)."""

    split: str
    note: str


def check_split(split: str) -> str:
    """``split`` when it is one of ``SPLITS``; else ValueError naming them."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; use one of {', '.join(SPLITS)}")
    return split


def _runs_text(ids: list[int]) -> str:
    """``run #3`` / ``runs #3, #5`` (the first ``SHOWN_RUNS``, then ``and N more``)."""
    shown = ", ".join(f"#{i}" for i in ids[:SHOWN_RUNS])
    more = f" and {len(ids) - SHOWN_RUNS} more" if len(ids) > SHOWN_RUNS else ""
    return ("run " if len(ids) == 1 else "runs ") + shown + more


def _why_val(split: str, lacking: list, test_steps: dict[int, set[int]], step: int) -> str:
    """Why a group is read on validation: which counted runs have no test loss at ``step``."""
    older = [r.id for r in lacking if not test_steps.get(r.id) and r.status == "finished"]
    training = [r.id for r in lacking if not test_steps.get(r.id) and r.status != "finished"]
    elsewhere = [r.id for r in lacking if test_steps.get(r.id)]
    parts = []
    if older:
        parts.append(f"{_runs_text(older)} recorded no test loss (older version, or test_tokens=0)")
    if training:
        parts.append(f"{_runs_text(training)} not finished (a run evaluates the test split at its last step)")
    if elsewhere:
        parts.append(f"{_runs_text(elsewhere)} recorded it at other steps, not at step {step:,}")
    lead = "The test split was asked for, but read on validation" if split == TEST else "Read on validation"
    return f"{lead}: {'; '.join(parts)}, so the table reads validation."


def split_read(split: str, members, read: Read, val_steps: dict[int, set[int]],
               test_steps: dict[int, set[int]]) -> SplitRead:
    """The ``SplitRead`` of the group of run records ``members`` read at ``read`` (module
    docstring); ``val_steps`` / ``test_steps``: run id → the steps it recorded ``val_loss`` /
    ``test_loss`` at."""
    if split == VAL or read.step is None:
        return SplitRead(VAL, "")
    counted = [r for r in sorted(members, key=lambda r: r.id)
               if r.status not in LEFT_STATUSES and read.step in val_steps.get(r.id, ())]
    lacking = [r for r in counted if read.step not in test_steps.get(r.id, ())]
    if counted and not lacking:
        return SplitRead(TEST, f"Read on the held-out test split: every run recorded it at step {read.step:,}.")
    if not lacking or (split != TEST and not any(test_steps.get(r.id) for r in members)):
        return SplitRead(VAL, "")
    return SplitRead(VAL, _why_val(split, lacking, test_steps, read.step))


def _value_text(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def tuned_text(configs, free: tuple[str, ...]) -> str:
    """``lr=0.01, 0.0316``: each free field with the distinct values the stored ``configs`` hold
    (fields apart by "; "; "" when ``free`` is empty or there are no configs)."""
    configs = list(configs)
    parts = []
    for name in free if configs else ():
        values = list({repr(v): v for v in (c.get(name) for c in configs)}.values())  # distinct, hashable or not
        try:
            ordered = sorted(values)
        except TypeError:  # None beside numbers, or values of several types
            ordered = sorted(values, key=repr)
        parts.append(f"{name}=" + ", ".join(_value_text(v) for v in ordered))
    return "; ".join(parts)
