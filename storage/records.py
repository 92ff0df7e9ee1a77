"""What the store hands out: run and worker records, the status names, and the value
checks and conversions every repository of the store shares (public: the one definition)."""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any, Iterable, Optional, Union

import pandas as pd

from .db import json_dumps
from .errors import InvalidValueError, RunNotFoundError
from .limits import TAG_MAX, check_utf8
from .models import Run, Worker

RUN_STATUSES = ("queued", "running", "finished", "failed", "cancelled", "interrupted")
ACTIVE_STATUSES = ("queued", "running")
ENDED_STATUSES = ("finished", "failed", "cancelled", "interrupted")
RESUMABLE_STATUSES = ("failed", "cancelled", "interrupted")  # what requeue() moves back to queued
WORKER_STATUSES = ("active", "stopped")
# why an interrupted run stopped (``runs.interruption_cause``; revision 0008):
INTERRUPTION_CAUSES = (
    "signal",  # its process was told to stop (a signal, the dashboard exiting): stopped on purpose
    "stale",  # its worker died (its process is gone, or silent past the timeout): any worker may resume it
    "crash",  # its training thread raised past the run
    "disk_full",  # the database's or the checkpoints' disk is full
)
STALE_CAUSE = "stale"  # the cause a liveness sweep writes, and the only one a late heartbeat undoes
LAST_METRICS = {"last_train_loss": "train_loss", "last_val_loss": "val_loss", "last_mean_cos": "cos_mean"}
METRIC_COLUMNS = ("id", "run_id", "step", "wall_time", "name", "value")
DIAGNOSTIC_RESULT_COLUMNS = ("layer", "estimator", "rank", "lam", "bias2", "bias2_se", "variance", "mse",
                             "cos_mean", "keys", "batches")
KEY_VALUES = "key_values"  # a result row's per-key values (``DiagnosticsRepository.diagnostics.diagnostic_results(key_values=True)``)


@dataclass(frozen=True)
class RunRecord:
    id: int
    uid: str
    name: str
    status: str
    created_at: Optional[datetime]
    started_at: Optional[datetime]
    finished_at: Optional[datetime]
    heartbeat_at: Optional[datetime]
    config: dict
    estimator: Optional[str]
    rank: Optional[int]
    lam: Optional[float]
    seed: Optional[int]
    preset: Optional[str]
    steps: Optional[int]
    steps_done: int
    error: Optional[str]
    notes: str
    versions: dict
    git_commit: Optional[str]
    device: Optional[str]
    owner: Optional[str]
    cancel_requested: bool
    sweep_id: Optional[str]
    tags: list
    worker_id: Optional[str]
    checkpoint_step: Optional[int]
    history_version: int
    epoch: int = 0
    interruption_cause: Optional[str] = None  # one of INTERRUPTION_CAUSES while interrupted (None: unknown)

    @classmethod
    def from_row(cls, run: Run) -> "RunRecord":
        return cls(
            id=run.id,
            uid=run.uid,
            name=run.name if run.name is not None else f"run-{run.id}",
            status=run.status or "finished",
            created_at=run.created_at,
            started_at=run.started_at,
            finished_at=run.finished_at,
            heartbeat_at=run.heartbeat_at,
            config=dict(run.config or {}),
            estimator=run.estimator,
            rank=run.rank,
            lam=run.lam,
            seed=run.seed,
            preset=run.preset,
            steps=run.steps,
            steps_done=run.steps_done or 0,
            error=run.error,
            notes=run.notes or "",
            versions=dict(run.versions or {}),
            git_commit=run.git_commit,
            device=run.device,
            owner=run.owner,
            cancel_requested=bool(run.cancel_requested),
            sweep_id=run.sweep_id,
            tags=list(run.tags or []),
            worker_id=run.worker_id,
            checkpoint_step=run.checkpoint_step,
            history_version=run.history_version or 0,
            epoch=run.epoch or 0,
            interruption_cause=run.interruption_cause,
        )


@dataclass(frozen=True)
class WorkerRecord:
    id: str
    host: Optional[str]
    pid: Optional[int]
    device: Optional[str]
    started_at: Optional[datetime]
    heartbeat_at: Optional[datetime]
    current_run_id: Optional[int]
    status: str
    concurrent: Optional[int]

    @classmethod
    def from_row(cls, w: Worker) -> "WorkerRecord":
        return cls(**{f.name: getattr(w, f.name) for f in fields(cls)})


SCALAR_FIELDS = tuple(f.name for f in fields(RunRecord) if f.name not in ("config", "versions"))
RUN_TIME_FIELDS = ("created_at", "started_at", "finished_at", "heartbeat_at")
RUN_INT_FIELDS = ("rank", "seed", "steps", "steps_done", "checkpoint_step")
DIAGNOSTIC_FIELDS = ("id", "uid", "run_id", "step", "status", "settings", "created_at", "started_at",
                      "finished_at", "heartbeat_at", "owner", "error", "notes", "cancel_requested")


def check_status(status: str) -> str:
    """``status`` if it is a run status, else a ValueError listing them."""
    if status not in RUN_STATUSES:
        raise ValueError(f"unknown run status {status!r}; expected one of {', '.join(RUN_STATUSES)}")
    return status


def check_cause(cause: Optional[str]) -> Optional[str]:
    """``cause`` if it is None or one of :data:`INTERRUPTION_CAUSES`, else a ValueError listing them."""
    if cause is not None and cause not in INTERRUPTION_CAUSES:
        raise ValueError(f"unknown interruption cause {cause!r}; expected one of {', '.join(INTERRUPTION_CAUSES)}")
    return cause


def run_not_found(ref: Any) -> RunNotFoundError:
    """The error for a run id (or name) that names no run."""
    return RunNotFoundError(f"no run {ref}; list the runs to see their ids")


def as_ids(run_ids: Union[int, Iterable[int]]) -> list[int]:
    """One id or many as a list of ints, without duplicates, in order."""
    if isinstance(run_ids, int) or hasattr(run_ids, "__index__"):  # one id (also numpy ints)
        return [int(run_ids)]  # type: ignore[arg-type]
    return [int(r) for r in dict.fromkeys(run_ids)]


def json_normal(value: Any, what: str) -> Any:
    """``value`` as JSON gives it back (tuples -> lists, numpy scalars -> numbers)."""
    try:
        normal = json.loads(json_dumps(value))
    except (TypeError, ValueError) as e:
        raise ValueError(f"{what} must be JSON serialisable: {e}") from e
    return check_utf8(what, normal)


def clean_tags(tags: Optional[Iterable[str]]) -> list[str]:
    """Tags as stored: stripped, without duplicates, in order; an empty or too long one is a ValueError."""
    if tags is None:
        return []
    if isinstance(tags, str):
        tags = [tags]
    out = [str(t).strip() for t in tags]
    if any(not t for t in out):
        raise InvalidValueError("tags: a tag cannot be empty")
    for t in out:
        if len(t) > TAG_MAX:
            raise InvalidValueError(f"tags: {t[:20]!r}… is {len(t)} characters long; the most is {TAG_MAX}: shorten it")
        check_utf8("tags", t)
    return list(dict.fromkeys(out))


def empty_metrics_frame() -> pd.DataFrame:
    """A metrics frame (:data:`METRIC_COLUMNS`, typed) with no rows."""
    return metrics_frame([])


def metrics_frame(rows: list) -> pd.DataFrame:
    """Metric rows (tuples in :data:`METRIC_COLUMNS` order) as a typed frame."""
    frame = pd.DataFrame.from_records(rows, columns=list(METRIC_COLUMNS))
    return frame.astype(
        {"id": "int64", "run_id": "int64", "step": "int64", "wall_time": "float64", "value": "float64"}
    )

