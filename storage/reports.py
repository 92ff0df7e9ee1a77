"""Reports built from the runs: stored, listed, read, replaced in place by key, deleted.

The repository ``store.reports`` of :class:`storage.store.RunStore`, over its
:class:`storage.database.Database`. It keeps a report's content as the text it is given
(JSON written by ``engine.analysis.report``) and knows nothing of what is inside it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Iterable, Mapping, Optional

from sqlalchemy import delete, select
from sqlalchemy.orm import defer

from .database import Repository
from .db import rowcount
from .errors import StorageError
from .limits import check_utf8, json_text_as_utf8
from .models import Report, new_uid, utcnow
from .records import json_normal

REPORT_TITLE_MAX = 200


@dataclass(frozen=True)
class ReportRecord:
    """One stored report; ``content`` is None in listings (``list_reports``), the stored
    JSON text from ``get_report`` (a string in it that UTF-8 cannot encode, stored before the
    UTF-8 check, with its escape: ``storage.limits.json_text_as_utf8``)."""

    id: int
    uid: str
    key: Optional[str]
    sweep_id: Optional[str]
    title: str
    selection: dict
    run_ids: list
    at_step: Optional[int]
    created_at: Optional[datetime]
    content: Optional[str]

    @classmethod
    def from_row(cls, r: Report, content: bool = True) -> "ReportRecord":
        return cls(id=r.id, uid=r.uid, key=r.key, sweep_id=r.sweep_id, title=r.title or f"report {r.id}",
                   selection=dict(r.selection or {}), run_ids=[int(i) for i in (r.run_ids or [])], at_step=r.at_step,
                   created_at=r.created_at, content=json_text_as_utf8(r.content) if content else None)


def report_not_found(report_id: Any) -> StorageError:
    return StorageError(f"no report {report_id}; list the stored reports (`python -m engine report --list`) to see "
                        "their ids")


class ReportsRepository(Repository):
    """Reports built from the runs: stored, listed, read, replaced in place by key, deleted."""

    def save_report(self, *, title: str, content: str, run_ids: Iterable[int], selection: Mapping[str, Any],
                    at_step: Optional[int] = None, sweep_id: Optional[str] = None, key: Optional[str] = None) -> int:
        """Store a report; its id. With ``key``, the report stored under that key (if any)
        is replaced in place, keeping its id, so rebuilding a sweep's report does not pile
        up copies (two processes saving one key at once leave one row)."""
        title = check_utf8("report title", str(title).strip()[:REPORT_TITLE_MAX] or "report")
        if not isinstance(content, str) or not content:
            raise ValueError("a report's content must be non-empty text (the report as JSON)")
        values = dict(title=title, content=content, run_ids=[int(i) for i in run_ids],
                      selection=json_normal(dict(selection), "report selection"),
                      at_step=None if at_step is None else int(at_step), sweep_id=sweep_id, created_at=utcnow())
        for attempt in range(2):
            try:
                with self.db.session(write=True) as s:
                    row = s.scalars(select(Report).where(Report.key == key)).first() if key is not None else None
                    if row is None:
                        row = Report(uid=new_uid(), key=key, **values)
                        s.add(row)
                    else:
                        for name, value in values.items():
                            setattr(row, name, value)
                    s.flush()
                    return int(row.id)
            except StorageError as e:
                # another process inserted the same key between our read and insert: replace theirs
                if attempt or key is None or "unique" not in str(e).lower():
                    raise
        raise AssertionError("unreachable")

    def list_reports(self, *, sweep_id: Optional[str] = None, run_id: Optional[int] = None) -> list[ReportRecord]:
        """Stored reports, newest first, without their content; with ``sweep_id`` those of
        that sweep, with ``run_id`` those that read that run."""
        stmt = select(Report).options(defer(Report.content)).order_by(Report.id.desc())
        if sweep_id is not None:
            stmt = stmt.where(Report.sweep_id == sweep_id)
        with self.db.session() as s:
            out = [ReportRecord.from_row(r, content=False) for r in s.scalars(stmt)]
        if run_id is not None:
            out = [r for r in out if int(run_id) in r.run_ids]
        return out

    def get_report(self, report_id: int) -> ReportRecord:
        with self.db.session() as s:
            row = s.get(Report, int(report_id))
            if row is None:
                raise report_not_found(report_id)
            return ReportRecord.from_row(row)

    def delete_report(self, report_id: int) -> None:
        with self.db.session(write=True) as s:
            if rowcount(s.execute(delete(Report.__table__).where(Report.__table__.c.id == int(report_id)))) != 1:
                raise report_not_found(report_id)
