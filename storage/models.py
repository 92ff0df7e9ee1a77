"""SQLAlchemy 2 typed models: ``runs``, ``metrics`` and the one-row ``schema_version`` table.

All timestamps are timezone-aware UTC datetimes (see :class:`UTCDateTime`; SQLite stores
them as naive UTC text, PostgreSQL as ``timestamptz``).  ``metrics.id`` is declared
AUTOINCREMENT on SQLite so ids are never reused after a delete: the dashboard polls with
"ids greater than the last one I have" and relies on that.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Optional

from sqlalchemy import (
    JSON,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    TypeDecorator,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

__all__ = ["Base", "Run", "Metric", "SchemaVersion", "UTCDateTime", "utcnow"]


def utcnow() -> datetime:
    """Current time as a timezone-aware UTC datetime."""
    return datetime.now(timezone.utc)


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
    pass


class SchemaVersion(Base):
    """Exactly one row: the schema version of this database (see ``storage.db.SCHEMA_VERSION``)."""

    __tablename__ = "schema_version"

    version: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)


class Run(Base):
    __tablename__ = "runs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200), index=True)
    status: Mapped[str] = mapped_column(String(16), index=True, default="queued")
    created_at: Mapped[Optional[datetime]] = mapped_column(UTCDateTime, default=utcnow)
    started_at: Mapped[Optional[datetime]] = mapped_column(UTCDateTime)
    finished_at: Mapped[Optional[datetime]] = mapped_column(UTCDateTime)
    heartbeat_at: Mapped[Optional[datetime]] = mapped_column(UTCDateTime)
    # the full config; the fields below are copies for indexing / filtering
    config: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    estimator: Mapped[Optional[str]] = mapped_column(String(64), index=True)
    rank: Mapped[Optional[int]] = mapped_column(Integer, index=True)
    lam: Mapped[Optional[float]] = mapped_column(Float, index=True)
    seed: Mapped[Optional[int]] = mapped_column(Integer, index=True)
    preset: Mapped[Optional[str]] = mapped_column(String(64), index=True)
    steps: Mapped[Optional[int]] = mapped_column(Integer, index=True)
    steps_done: Mapped[int] = mapped_column(Integer, default=0)
    error: Mapped[Optional[str]] = mapped_column(Text)
    notes: Mapped[str] = mapped_column(Text, default="")
    versions: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    git_commit: Mapped[Optional[str]] = mapped_column(String(64))
    device: Mapped[Optional[str]] = mapped_column(String(200))
    owner: Mapped[Optional[str]] = mapped_column(String(255))  # "hostname:pid" of the worker
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)

    metrics: Mapped[list["Metric"]] = relationship(
        back_populates="run", cascade="all, delete-orphan", passive_deletes=True
    )


class Metric(Base):
    __tablename__ = "metrics"
    __table_args__ = (
        Index("ix_metrics_run_id_id", "run_id", "id"),
        Index("ix_metrics_run_id_name_step", "run_id", "name", "step"),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    step: Mapped[int] = mapped_column(Integer)
    wall_time: Mapped[float] = mapped_column(Float)
    name: Mapped[str] = mapped_column(String(64))
    # nullable: SQLite stores NaN as NULL, and a diverged loss must not crash the writer
    value: Mapped[Optional[float]] = mapped_column(Float)

    run: Mapped[Run] = relationship(back_populates="metrics")
