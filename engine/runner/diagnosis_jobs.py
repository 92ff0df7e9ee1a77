"""Diagnoses computed in the background of this process, each on a thread of its own.

``engine.runner.diagnosis`` plans, stores and computes one diagnosis; ``DiagnosisJobs``
starts them for the dashboard (through ``engine.runner.jobs.JobManager``), follows their
progress while they compute and stops them on request. Their heartbeats and cancel requests go
through the manager's one ``liveness.Channel``.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from engine.errors import TASK_FAILURES, is_bug
from engine.runner.liveness import Channel
from storage import RunStore

log = logging.getLogger(__name__)


class DiagnosisJobs:
    """The diagnoses this process computes: ``progress`` (diagnosis id → (settings done,
    total)) and ``stops`` (diagnosis id → its cancel event) hold the running ones; ``channel`` beats for them."""

    def __init__(self, store: RunStore, owner: str, checkpoint_root: Path, channel: Channel):
        self.store, self.owner, self.checkpoint_root, self.channel = store, owner, checkpoint_root, channel
        self.progress: dict[int, tuple[int, int]] = {}
        self.stops: dict[int, threading.Event] = {}

    def diagnose(self, run_id: int, **settings) -> int:
        """Start a diagnosis of ``run_id`` (``engine.runner.diagnosis.plan_diagnosis``'s settings);
        its id, once the settings are validated and its row stored."""
        from engine.runner import diagnosis

        return self.start(diagnosis.plan_diagnosis(self.store, run_id, checkpoints=self.checkpoint_root, **settings))

    def rerun(self, diag_id: int) -> int:
        """Run stored diagnosis ``diag_id`` again with its settings, as a new diagnosis; its id."""
        from engine.runner import diagnosis

        return self.start(diagnosis.replan(self.store, diag_id, self.checkpoint_root))

    def cancel(self, diag_id: int) -> bool:
        """Stop a diagnosis (computed here or by any process): at once when queued, after
        its current step when running; it keeps the results of the work done."""
        event = self.stops.get(diag_id)
        if event is not None:
            event.set()
        return self.store.diagnostics.request_cancel_diagnostic(diag_id)

    def start(self, plan) -> int:
        """Store and start ``plan`` (``engine.runner.diagnosis.Plan``) on a thread of its own; its id."""
        from engine.runner import diagnosis

        diag_id = diagnosis.start(self.store, plan)
        self.progress[diag_id] = (0, plan.work)
        self.stops[diag_id] = threading.Event()
        threading.Thread(target=self._compute, args=(diag_id, plan), name=f"basis-diagnosis-{diag_id}",
                         daemon=True).start()
        return diag_id

    def _compute(self, diag_id: int, plan) -> None:
        from engine.runner import diagnosis

        def progress(done: int, total: int) -> None:
            self.progress[diag_id] = (done, total)

        try:
            diagnosis.execute(self.store, diag_id, plan, owner=self.owner, on_progress=progress,
                              cancel=self.stops[diag_id], channel=self.channel)
        except TASK_FAILURES as e:  # recorded on the diagnosis by execute
            log.warning("diagnosis %s failed: %s: %s", diag_id, type(e).__name__, e, exc_info=is_bug(e))
        finally:
            self.progress.pop(diag_id, None)
            self.stops.pop(diag_id, None)

    def progress_of(self, diag_id: int) -> tuple[int, int] | None:
        """``(settings done, total)`` of a diagnosis computed here, else None once it ended."""
        return self.progress.get(diag_id)
