"""How far a selection of runs has got, and when it will be done: one summary in place of a
progress bar per run.

The time left is estimated from the step rates the running runs show now: a run's rate is
the steps per second of wall time between its last ``RATE_WINDOW`` + 1 validation records
(validations, probes and checkpoints included, as the rest of its training will have
them); the rates of the running runs add up to the selection's rate (they train at the same
time), and the time left is the steps still to train, of the running and queued runs, over
that rate. It assumes the runs keep training as many at a time, and that queued runs step
about as fast as those running now: an estimate, said as one ("about"). Runs that ended
without finishing (failed, cancelled, interrupted) are counted by status, not in the steps.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from engine.core.units import format_seconds

RATE_WINDOW = 4  # validation intervals a run's rate is read over (the latest ones)
ORDER = ("finished", "running", "queued", "interrupted", "failed", "cancelled")
WORDS = {"running": "training"}  # what a status is called in the summary


@dataclass(frozen=True)
class Progress:
    """``counts`` by status; ``done`` of ``total`` steps of the finished, running and queued
    runs; ``rate``: steps per second of the running runs together (None: none observed
    yet); ``seconds_left``: the estimate (None: unknown; 0: nothing left)."""

    counts: dict[str, int]
    done: int
    total: int
    rate: float | None
    seconds_left: float | None

    @property
    def fraction(self) -> float:
        return min(self.done / self.total, 1.0) if self.total else 1.0

    @property
    def active(self) -> bool:
        return bool(self.counts.get("running") or self.counts.get("queued"))

    def text(self) -> str:
        """``3 finished · 2 training · 13 queued — 1,200 of 3,600 steps (33 %) — about 4 min left
        at 12.5 steps/s``."""
        runs = " · ".join(f"{self.counts[s]} {WORDS.get(s, s)}" for s in ORDER if self.counts.get(s))
        steps = f"{self.done:,} of {self.total:,} steps ({100 * self.fraction:.0f} %)"
        return f"{runs} — {steps}" + (f" — {self.eta_text()}" if self.active else "")

    def eta_text(self) -> str:
        """``about 4 min left at 12.5 steps/s``, or why the time left is not known yet."""
        if self.seconds_left is None:
            return "time left: known after the first validations of a running run"
        return f"about {format_seconds(self.seconds_left)} left at {self.rate:,.3g} steps/s"


def step_rate(steps: pd.Series, wall: pd.Series) -> float | None:
    """Steps per second between the first and last of one run's latest ``RATE_WINDOW`` + 1
    validation records (``steps`` and ``wall`` seconds, in step order); None with fewer than
    two records or no time between them."""
    if len(steps) < 2:
        return None
    steps, wall = steps.iloc[-RATE_WINDOW - 1:], wall.iloc[-RATE_WINDOW - 1:]
    elapsed = float(wall.iloc[-1] - wall.iloc[0])
    return float(steps.iloc[-1] - steps.iloc[0]) / elapsed if elapsed > 0 else None


def progress(records, metrics: pd.DataFrame) -> Progress:
    """The :class:`Progress` of ``records`` (``storage.RunRecord``) from their metric rows
    (the columns of ``RunStore.metrics``; only ``val_loss`` rows of running runs are read)."""
    records = list(records)
    counts: dict[str, int] = {}
    for r in records:
        counts[r.status] = counts.get(r.status, 0) + 1
    going = [r for r in records if r.status in ("finished", "running", "queued")]
    total = sum(int(r.steps or 0) for r in going)
    done = sum(int(r.steps or 0) if r.status == "finished" else min(int(r.steps_done), int(r.steps or 0)) for r in going)
    running = {r.id for r in records if r.status == "running"}
    val = metrics[(metrics["name"] == "val_loss") & metrics["run_id"].isin(running)]
    val = val.sort_values("id").drop_duplicates(["run_id", "step"], keep="last").sort_values(["run_id", "step"])
    rates = [rate for _, rows in val.groupby("run_id") if (rate := step_rate(rows["step"], rows["wall_time"]))]
    rate = sum(rates) if rates else None
    left = total - done
    seconds = 0.0 if left <= 0 else (left / rate if rate else None)
    return Progress(counts=counts, done=done, total=total, rate=rate, seconds_left=seconds)
