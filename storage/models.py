"""SQLAlchemy 2 typed models: ``runs``, ``metrics``, ``eval_losses``, ``workers``,
``diagnostics``, ``diagnostic_results``, ``reports``, ``saved_views``, ``database_identity``
and ``database_lineage`` (``run_logs``: :mod:`storage.logs`).

This is the schema at the newest Alembic revision (``storage/migrations/versions``); a test
compares the two (tables, columns, indexes and which columns may be NULL: a column not
``Optional`` here is NOT NULL in every database, since revision 0011), so a change here needs
a new revision that does the same to a stored database.  Every open checks that the database
holds each table and column declared here (:mod:`storage.schema_check`).

Sizes come from :mod:`storage.limits`: a run's name is ``VARCHAR(NAME_MAX)`` and every
integer a run's settings can reach (seed, steps, rank, steps done, checkpoint and metric
steps) is ``BIGINT``.

All timestamps are timezone-aware UTC datetimes (see :class:`UTCDateTime`; SQLite stores
them as naive UTC text, PostgreSQL as ``timestamptz``).  ``runs.id`` and ``metrics.id`` are
declared AUTOINCREMENT on SQLite so ids are never reused after a delete: links and caches
name runs by id (and by the random ``runs.uid``), and the metrics feed polls with "ids
greater than the last one I have".
"""

from __future__ import annotations

import uuid
from datetime import datetime, timezone
from typing import Any, ClassVar, Optional

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Table,
    Text,
    TypeDecorator,
    false,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from .limits import NAME_MAX

__all__ = ["Base", "Run", "Metric", "EvalLosses", "Worker", "Diagnostic", "DiagnosticResult", "Report", "SavedView", "Campaign",
           "UTCDateTime",
           "DatabaseIdentity", "DatabaseLineage", "new_uid", "utcnow"]


def utcnow() -> datetime:
    """Current time as a timezone-aware UTC datetime."""
    return datetime.now(timezone.utc)


def new_uid() -> str:
    """32 random hex digits: an identity no later row can share (unlike a reusable id)."""
    return uuid.uuid4().hex


class UTCDateTime(TypeDecorator[datetime]):
    """DateTime that always round-trips as a timezone-aware UTC datetime.

    Naive datetimes given to it are taken to be UTC already.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: Optional[datetime], dialect: Any) -> Optional[datetime]:
        if value is None:
            return None
        value = value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)
        if dialect.name == "sqlite":  # SQLite has no time zones: store naive UTC
            value = value.replace(tzinfo=None)
        return value

    def process_result_value(self, value: Optional[datetime], dialect: Any) -> Optional[datetime]:
        if value is None:
            return None
        return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


class Base(DeclarativeBase):
    # Every model here is mapped to a plain Table (SQLAlchemy types it as any FromClause).
    __table__: ClassVar[Table]


class Run(Base):
    __tablename__ = "runs"
    __table_args__ = {"sqlite_autoincrement": True}

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    uid: Mapped[str] = mapped_column(String(32), unique=True, index=True, default=new_uid)
    name: Mapped[str] = mapped_column(String(NAME_MAX), index=True)
    status: Mapped[str] = mapped_column(String(16), index=True, default="queued")
    created_at: Mapped[Optional[datetime]] = mapped_column(UTCDateTime, default=utcnow)
    started_at: Mapped[Optional[datetime]] = mapped_column(UTCDateTime)
    finished_at: Mapped[Optional[datetime]] = mapped_column(UTCDateTime)
    heartbeat_at: Mapped[Optional[datetime]] = mapped_column(UTCDateTime)
    # the full config; the fields below are copies for indexing / filtering
    config: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    estimator: Mapped[Optional[str]] = mapped_column(String(64), index=True)
    rank: Mapped[Optional[int]] = mapped_column(BigInteger, index=True)
    lam: Mapped[Optional[float]] = mapped_column(Float, index=True)
    seed: Mapped[Optional[int]] = mapped_column(BigInteger, index=True)
    preset: Mapped[Optional[str]] = mapped_column(String(64), index=True)
    steps: Mapped[Optional[int]] = mapped_column(BigInteger, index=True)
    steps_done: Mapped[int] = mapped_column(BigInteger, default=0)
    error: Mapped[Optional[str]] = mapped_column(Text)
    # why an interrupted run stopped (storage.records.INTERRUPTION_CAUSES); NULL otherwise
    interruption_cause: Mapped[Optional[str]] = mapped_column(String(16))
    notes: Mapped[str] = mapped_column(Text, default="")
    versions: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    git_commit: Mapped[Optional[str]] = mapped_column(String(64))
    device: Mapped[Optional[str]] = mapped_column(String(200))
    owner: Mapped[Optional[str]] = mapped_column(String(255))  # "hostname:pid" of the worker
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    sweep_id: Mapped[Optional[str]] = mapped_column(String(64), index=True)
    tags: Mapped[list[str]] = mapped_column(JSON, default=list)
    worker_id: Mapped[Optional[str]] = mapped_column(String(64))  # the worker that trains it
    checkpoint_step: Mapped[Optional[int]] = mapped_column(BigInteger)  # last checkpointed step
    # bumped whenever stored metrics are deleted, so incremental readers re-read the run
    history_version: Mapped[int] = mapped_column(Integer, default=0)
    # the lease: bumped by every claim (and requeue); an owner's writes hold only while
    # the run's epoch is still the one its claim returned (see storage.runs)
    epoch: Mapped[int] = mapped_column(Integer, default=0, server_default="0")

    metrics: Mapped[list["Metric"]] = relationship(
        back_populates="run", cascade="all, delete-orphan", passive_deletes=True
    )


class Metric(Base):
    """One value of one metric of a run at one step: (run_id, name, step) is unique, so no
    write path can store a metric twice."""

    __tablename__ = "metrics"
    __table_args__ = (
        Index("ix_metrics_run_id_id", "run_id", "id"),
        Index("ix_metrics_run_id_name_step", "run_id", "name", "step", unique=True),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    step: Mapped[int] = mapped_column(BigInteger)
    wall_time: Mapped[float] = mapped_column(Float)
    name: Mapped[str] = mapped_column(String(64))
    # nullable: SQLite stores NaN as NULL, and a diverged loss must not crash the writer
    value: Mapped[Optional[float]] = mapped_column(Float)

    run: Mapped[Run] = relationship(back_populates="metrics")


class EvalLosses(Base):
    """The per-batch mean losses of one evaluation of a run: on ``split`` (``"val"``; a test
    split may follow) at ``step``, one JSON number per batch in batch order, ``null`` for a
    non-finite one (JSON has no NaN). (run_id, step, split) is unique; the metrics of the
    same record hold their mean (``val_loss``). See :mod:`storage.eval_losses`."""

    __tablename__ = "eval_losses"
    __table_args__ = (
        Index("ix_eval_losses_run_id_step_split", "run_id", "step", "split", unique=True),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    step: Mapped[int] = mapped_column(BigInteger)
    split: Mapped[str] = mapped_column(String(16))
    losses: Mapped[list[Optional[float]]] = mapped_column(JSON)


class Worker(Base):
    """A process that trains queued runs; its id is made by the worker (``host:pid:random``)."""

    __tablename__ = "workers"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    host: Mapped[Optional[str]] = mapped_column(String(255))
    pid: Mapped[Optional[int]] = mapped_column(Integer)
    device: Mapped[Optional[str]] = mapped_column(String(200))
    started_at: Mapped[Optional[datetime]] = mapped_column(UTCDateTime)
    heartbeat_at: Mapped[Optional[datetime]] = mapped_column(UTCDateTime)
    current_run_id: Mapped[Optional[int]] = mapped_column(ForeignKey("runs.id", ondelete="SET NULL"))
    status: Mapped[str] = mapped_column(String(16), default="active")  # "active" / "stopped"
    concurrent: Mapped[Optional[int]] = mapped_column(Integer)


class Diagnostic(Base):
    """An estimator-diagnostics job on a run's checkpoint at ``step`` (statuses as for runs)."""

    __tablename__ = "diagnostics"
    __table_args__ = {"sqlite_autoincrement": True}

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    uid: Mapped[str] = mapped_column(String(32), unique=True, index=True, default=new_uid)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    step: Mapped[Optional[int]] = mapped_column(BigInteger)
    status: Mapped[str] = mapped_column(String(16), index=True, default="queued")
    settings: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[Optional[datetime]] = mapped_column(UTCDateTime, default=utcnow)
    started_at: Mapped[Optional[datetime]] = mapped_column(UTCDateTime)
    finished_at: Mapped[Optional[datetime]] = mapped_column(UTCDateTime)
    heartbeat_at: Mapped[Optional[datetime]] = mapped_column(UTCDateTime)
    owner: Mapped[Optional[str]] = mapped_column(String(255))
    error: Mapped[Optional[str]] = mapped_column(Text)
    notes: Mapped[str] = mapped_column(Text, default="")
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())


class SavedView(Base):
    """A named Compare view: ``state`` holds its URL query (runs, filters, pooling, axis,
    smoothing, scale) as JSON, so reopening it is opening that URL."""

    __tablename__ = "saved_views"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True, index=True)
    state: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[Optional[datetime]] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[Optional[datetime]] = mapped_column(UTCDateTime, default=utcnow)


class DiagnosticResult(Base):
    """One (layer, estimator, rank, λ) row of a diagnostic: bias², its standard error,
    variance, MSE = bias² + variance and mean cosine, all relative to the exact dW, and
    (from revision 0007) every sketch key's values behind them (``key_values``)."""

    __tablename__ = "diagnostic_results"
    __table_args__ = {"sqlite_autoincrement": True}

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    diagnostic_id: Mapped[int] = mapped_column(ForeignKey("diagnostics.id", ondelete="CASCADE"), index=True)
    layer: Mapped[Optional[str]] = mapped_column(String(200))
    estimator: Mapped[Optional[str]] = mapped_column(String(64))
    rank: Mapped[Optional[int]] = mapped_column(BigInteger)
    lam: Mapped[Optional[float]] = mapped_column(Float)
    bias2: Mapped[Optional[float]] = mapped_column(Float)
    bias2_se: Mapped[Optional[float]] = mapped_column(Float)
    variance: Mapped[Optional[float]] = mapped_column(Float)
    mse: Mapped[Optional[float]] = mapped_column(Float)
    cos_mean: Mapped[Optional[float]] = mapped_column(Float)
    keys: Mapped[Optional[int]] = mapped_column(BigInteger)
    batches: Mapped[Optional[int]] = mapped_column(BigInteger)
    # per batch [‖dW‖², ‖e_k‖² (K), ‖e_k − ē‖² (K)] as little-endian float64; NULL before revision 0007
    key_values: Mapped[Optional[bytes]] = mapped_column(LargeBinary)


class Report(Base):
    """A report of a set of runs (a sweep, the runs with some tags, or a list), as built
    at ``created_at``: ``content`` is the report as JSON (its tables, claims and figures;
    ``engine.analysis.report``), ``run_ids`` the runs it read, ``selection`` how they were
    chosen and at which step. ``key`` names a report that is rebuilt in place (the report
    a sweep gets when its last run ends: ``sweep:<sweep id>``); other reports have none.
    Reports are snapshots: deleting a run leaves them as they were."""

    __tablename__ = "reports"
    __table_args__ = {"sqlite_autoincrement": True}

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    uid: Mapped[str] = mapped_column(String(32), unique=True, index=True, default=new_uid)
    key: Mapped[Optional[str]] = mapped_column(String(200), unique=True, index=True)
    sweep_id: Mapped[Optional[str]] = mapped_column(String(64), index=True)
    title: Mapped[str] = mapped_column(String(200))
    selection: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    run_ids: Mapped[list[int]] = mapped_column(JSON, default=list)
    at_step: Mapped[Optional[int]] = mapped_column(BigInteger)
    created_at: Mapped[Optional[datetime]] = mapped_column(UTCDateTime, default=utcnow)
    content: Mapped[str] = mapped_column(Text)


class Campaign(Base):
    """A campaign of runs in stages (revision 0013): a tuning campaign first trains its trials
    (runs of sweep ``tune_sweep_id``), then, once every trial has ended, its comparison (runs of
    sweep ``eval_sweep_id``) at the values ``chosen`` from the trials. ``spec`` is the protocol
    as JSON (what ``engine.config.tuning`` writes; storage reads nothing inside it). ``stage``
    moves ``tuning`` → ``evaluating`` exactly once, in the transaction that queues the
    comparison's runs (``storage.campaigns``)."""

    __tablename__ = "campaigns"
    __table_args__ = {"sqlite_autoincrement": True}

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    uid: Mapped[str] = mapped_column(String(32), unique=True, index=True, default=new_uid)
    name: Mapped[str] = mapped_column(String(NAME_MAX))
    kind: Mapped[str] = mapped_column(String(16), default="tune")
    stage: Mapped[str] = mapped_column(String(16), index=True, default="tuning")
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    chosen: Mapped[Optional[dict[str, Any]]] = mapped_column(JSON)
    tune_sweep_id: Mapped[str] = mapped_column(String(64), unique=True, index=True)
    eval_sweep_id: Mapped[Optional[str]] = mapped_column(String(64), unique=True, index=True)
    created_at: Mapped[Optional[datetime]] = mapped_column(UTCDateTime, default=utcnow)
    advanced_at: Mapped[Optional[datetime]] = mapped_column(UTCDateTime)


class DatabaseIdentity(Base):
    """This database's identity: one row (``id`` 1) whose random ``uid`` no other database
    shares, not even a backup of this one (``storage.backup`` leaves it out of the copy,
    which makes its own at its first use: ``IdentityRepository.identities.identity``). What a database keeps
    outside itself (a run's checkpoints) is named by it, so a copy never deletes its
    original's."""

    __tablename__ = "database_identity"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    uid: Mapped[str] = mapped_column(String(32), default=new_uid)
    created_at: Mapped[Optional[datetime]] = mapped_column(UTCDateTime, default=utcnow)


class DatabaseLineage(Base):
    """Every identity this database's contents have had, oldest first (by ``id``): the
    database it was first created as, each one it was copied from since, and its own.
    Unlike ``database_identity`` it travels with a backup."""

    __tablename__ = "database_lineage"
    __table_args__ = {"sqlite_autoincrement": True}

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    uid: Mapped[str] = mapped_column(String(32), unique=True)
    created_at: Mapped[Optional[datetime]] = mapped_column(UTCDateTime, default=utcnow)
