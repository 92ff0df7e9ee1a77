"""Controlling launched runs from any process, for both faces of the lab: ``python -m engine
cancel`` and ``resume --queue-only`` and ``engine.api.Lab.cancel`` and ``resume(run="queue")``
call these. Runs are named by id or exact name (``RunsRepository.runs.resolve_runs``: an unknown one is a
``RunNotFoundError`` before anything is written). Pure orchestration: what to say about each
run is returned, the face says it.
"""

from __future__ import annotations

from typing import Iterable

from engine.runner import campaigns
from engine.runner.liveness import check_stale
from storage import RunStore

ACTIVE = ("queued", "running")


def cancel_runs(store: RunStore, refs: Iterable[str | int]) -> dict[int, str]:
    """Stop the named runs, whichever process trains them: a queued one is cancelled at once,
    a running one is asked to stop (it checkpoints and ends ``cancelled`` within a step); a run
    that is not active is left. Per run id, what happened, in words (``cancelled``, ``cancel
    requested; it stops within a step``, ``not active (finished); nothing to cancel``)."""
    check_stale(store)  # a running run whose process died is interrupted, not "cancel requested"
    done: dict[int, str] = {}
    for run_id in store.runs.resolve_runs(list(refs)):
        status = store.runs.get_run(run_id).status
        if status not in ACTIVE:
            done[run_id] = f"not active ({status}); nothing to cancel"
            continue
        store.runs.request_cancel(run_id)
        done[run_id] = "cancelled" if status == "queued" else "cancel requested; it stops within a step"
    return done


def resume_targets(store: RunStore, refs: Iterable[str | int] | None, every: bool) -> list[int]:
    """The ids of the named runs, and with ``every`` of every interrupted run too, in order
    (runs whose process died are marked interrupted first)."""
    check_stale(store)
    refs = list(refs or [])
    ids = store.runs.resolve_runs(refs) if refs else []
    if every:
        ids += [r.id for r in store.runs.list_runs(statuses=["interrupted"]) if r.id not in ids]
    return ids


def requeue_for_workers(store: RunStore, refs: Iterable[str | int] | None, every: bool) -> tuple[list[int], list[int]]:
    """The named runs (and with ``every`` every interrupted one) queued again for any worker,
    to continue from their newest checkpoint, and with ``every`` the comparison of every
    tuning campaign whose trials have ended: (the ids queued again, the comparison runs
    queued). Runs that are queued, running or finished are left as they are."""
    ids = resume_targets(store, refs, every)
    moved = store.queue.requeue(ids, owner=None) if ids else []
    return moved, campaigns.advance_all(store) if every else []
