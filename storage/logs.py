"""Each run's log: what its training printed, warned and logged while it trained, stored
in the database (table ``run_logs``) so that every machine that reads the database sees it.

A row is one line: ``(id, run_id, time, level, text, source)``. ``id`` only grows
(AUTOINCREMENT on SQLite, a sequence on PostgreSQL), so a reader polls with "ids greater than
the last I saw". Levels are ``LOG_LEVELS``, least severe first; ``ALERT`` marks a run's bad
end (it failed, or its loss went NaN): one row per such end, what the dashboard raises as an
alert on every open page. ``source`` says where the line came from: ``stdout`` or ``stderr``
(what the run's thread printed), ``warning`` (a Python warning), a logger's name, ``lab`` (the
lab's own lines: claimed, progress, the end); ``""`` for lines stored before revision 0014.

Bounded: a line keeps at most ``LOG_TEXT_MAX`` characters (a longer one ends in "…"), and a
run keeps its newest ``LOG_LINES_MAX`` lines; each write deletes the older ones.
The ``logs`` repository of :class:`storage.store.RunStore`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Iterable, Optional, Sequence, Union

from sqlalchemy import ForeignKey, Index, Integer, String, Text, delete, func, insert, or_, select
from sqlalchemy.orm import Mapped, mapped_column

from .database import Repository
from .errors import InvalidValueError
from .lease import hold
from .limits import as_utf8
from .models import Base, UTCDateTime, utcnow

DEBUG, INFO, WARNING, ERROR, ALERT = "debug", "info", "warning", "error", "alert"
LOG_LEVELS = (DEBUG, INFO, WARNING, ERROR, ALERT)
CONSOLE_SOURCES = ("stdout", "stderr")  # lines shown with their source in front
LOG_LINES_MAX = 25_000  # lines a run keeps (its newest): more than two trainings' capture (engine.runner.runlog)
LOG_TEXT_MAX = 4_000  # characters a line keeps
SOURCE_MAX = 100  # characters a source keeps


class RunLog(Base):
    """One line of a run's log (see the module)."""

    __tablename__ = "run_logs"
    __table_args__ = (Index("ix_run_logs_run_id_id", "run_id", "id"), Index("ix_run_logs_level_id", "level", "id"),
                      {"sqlite_autoincrement": True})

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    time: Mapped[datetime] = mapped_column(UTCDateTime)
    level: Mapped[str] = mapped_column(String(16))
    text: Mapped[str] = mapped_column(Text)
    source: Mapped[str] = mapped_column(String(SOURCE_MAX), default="", server_default="")


@dataclass(frozen=True)
class LogLine:
    """A stored line of a run's log."""

    id: int
    run_id: int
    time: datetime
    level: str
    text: str
    source: str = ""

    @property
    def shown(self) -> str:
        """The text as the CLI and Run detail show it: a console line with its stream in front
        (``stderr: …``); a logger's line names its logger already, a warning its category."""
        return f"{self.source}: {self.text}" if self.source in CONSOLE_SOURCES else self.text


When = Union[datetime, float]
# (level, text), (time, level, text) or (time, level, text, source)
LineIn = Union[tuple[str, str], tuple[When, str, str], tuple[When, str, str, str]]


def _cut(text: object, limit: int) -> str:
    text = as_utf8(str(text))
    return text[:limit - 1] + "…" if len(text) > limit else text


def _row(run_id: int, line: LineIn) -> dict:
    """The row of ``line``: its time (a datetime, or seconds since the epoch; now when not
    given), a known level, its text made storable and cut to ``LOG_TEXT_MAX``, its source
    (none: "")."""
    parts = tuple(line)
    if len(parts) == 2:
        parts = (utcnow(), *parts)
    when, level, text, source = (*parts, "") if len(parts) == 3 else parts
    if isinstance(when, (int, float)):
        when = datetime.fromtimestamp(when, timezone.utc)
    if level not in LOG_LEVELS:
        raise InvalidValueError(f"log level {level!r} is not one of {', '.join(LOG_LEVELS)}")
    return {"run_id": int(run_id), "time": when, "level": level, "text": _cut(text, LOG_TEXT_MAX),
            "source": _cut(source, SOURCE_MAX)}


def _line(row) -> LogLine:
    return LogLine(int(row.id), int(row.run_id), row.time, row.level, row.text, row.source)


class LogsRepository(Repository):
    """Writing and reading run logs (see the module)."""

    def add_run_logs(self, run_id: int, lines: Iterable[LineIn], *, epoch: Optional[int] = None) -> None:
        """Append ``lines`` to the run's log, in order, and drop its lines beyond the newest
        ``LOG_LINES_MAX``; fenced by ``epoch`` as ``set_status`` (an owner that lost the run
        writes nothing). A bad level is a ValueError and nothing is written."""
        rows = [_row(run_id, line) for line in lines]
        if not rows:
            return
        table = RunLog.__table__
        with self.db.session(write=True) as s:
            hold(s, run_id, epoch)
            s.execute(insert(table), rows)
            cutoff = s.execute(select(table.c.id).where(table.c.run_id == run_id).order_by(table.c.id.desc())
                               .offset(LOG_LINES_MAX).limit(1)).scalar()
            if cutoff is not None:
                s.execute(delete(table).where(table.c.run_id == run_id, table.c.id <= cutoff))

    def run_logs(self, run_id: int, *, after_id: int = 0, levels: Optional[Sequence[str]] = None,
                 search: Optional[str] = None, tail: Optional[int] = None) -> list[LogLine]:
        """The run's log lines with ``id > after_id``, oldest first: of ``levels`` (None: all),
        whose text or source holds ``search`` (case-insensitive; None or "": all), the newest
        ``tail`` of them (None: all)."""
        table = RunLog.__table__
        stmt = select(table).where(table.c.run_id == run_id, table.c.id > after_id)
        if levels is not None:
            stmt = stmt.where(table.c.level.in_(list(levels)))
        if search:
            stmt = stmt.where(or_(table.c.text.icontains(search, autoescape=True),
                                  table.c.source.icontains(search, autoescape=True)))
        stmt = stmt.order_by(table.c.id.desc()).limit(tail) if tail is not None else stmt.order_by(table.c.id)
        with self.db.session() as s:
            rows = s.execute(stmt).all()
        return [_line(r) for r in (reversed(rows) if tail is not None else rows)]

    def alerts_after(self, after_id: int, *, limit: int = 20) -> list[LogLine]:
        """The ``ALERT`` lines of every run with ``id > after_id``, oldest first (at most ``limit``, the newest)."""
        table = RunLog.__table__
        stmt = (select(table).where(table.c.level == ALERT, table.c.id > after_id)
                .order_by(table.c.id.desc()).limit(limit))
        with self.db.session() as s:
            return [_line(r) for r in reversed(s.execute(stmt).all())]

    def last_log_id(self) -> int:
        """The highest log line id stored (0: none): where a new reader starts."""
        with self.db.session() as s:
            return int(s.execute(select(func.max(RunLog.__table__.c.id))).scalar() or 0)
