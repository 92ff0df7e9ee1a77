"""What follows a run's end in the process that trained it: a tuning campaign's next stage, a sweep's report.

``after_end`` is called by the job manager once a run's end is stored (not after an
interruption: the run resumes). It advances the campaign whose trial ended
(``engine.runner.campaigns.after_trial``; the comparison's runs it queues are returned, for
the manager to train when it owns them) and builds the report of a sweep that asks for one
and has ended (``engine.reads.reports.report_if_sweep_ended``). A failure of either is
logged, never raised: the runs are what matters, and the next end (or ``resume --all``)
tries again.
"""

from __future__ import annotations

import logging

from engine.errors import TASK_FAILURES
from storage import RunStore

log = logging.getLogger(__name__)


def report_if_sweep_ended(store: RunStore, run_id: int) -> int | None:
    """After ``run_id`` ended: when it belongs to a sweep that asks for a report (tagged
    ``engine.reads.reports.AUTO_REPORT_TAGS``) and no run of that sweep is still queued,
    running or interrupted, build the sweep's report and store it with the sweep
    (replacing its earlier one); the report's id, else None."""
    try:
        from engine.reads import reports

        return reports.report_if_sweep_ended(store, run_id)
    except TASK_FAILURES:  # a report must never take a worker down
        log.warning("the report of run %s's sweep could not be built", run_id, exc_info=True)
        return None


def after_end(store: RunStore, run_id: int, *, owner: str | None = None) -> list[int]:
    """The campaign step and the report that follow ``run_id``'s end (module docstring); the
    ids of the runs a campaign queued, owned by ``owner`` (None: for any worker)."""
    from engine.runner import campaigns

    queued = campaigns.after_trial(store, run_id, owner=owner)
    report_if_sweep_ended(store, run_id)
    return queued
