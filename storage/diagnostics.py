"""Estimator diagnoses of a run: their lifecycle and result rows.

The repository ``store.diagnostics`` of :class:`storage.store.RunStore`, over its :class:`storage.database.Database`."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Iterable, Mapping, Optional

import numpy as np
import pandas as pd
from sqlalchemy import delete, insert, select, update

from .database import Repository
from .db import rowcount
from .errors import StorageError
from .models import Diagnostic, DiagnosticResult, Run, new_uid, utcnow
from .records import (
    DIAGNOSTIC_RESULT_COLUMNS,
    ENDED_STATUSES,
    KEY_VALUES,
    check_status,
    json_normal,
    run_not_found,
)


class DiagnosticsRepository(Repository):
    """Estimator diagnoses of a run: their lifecycle and result rows."""

    def create_diagnostic(self, run_id: int, step: Optional[int], settings: Optional[dict] = None) -> int:
        """Queue an estimator-diagnostics job on the run's checkpoint at ``step``; its id."""
        settings = json_normal(dict(settings or {}), "diagnostic settings")
        with self.db.session(write=True) as s:
            if s.execute(select(Run.id).where(Run.id == run_id)).first() is None:
                raise run_not_found(run_id)
            diag = Diagnostic(uid=new_uid(), run_id=int(run_id), step=None if step is None else int(step),
                              status="queued", settings=settings, created_at=utcnow(), notes="")
            s.add(diag)
            s.flush()
            return int(diag.id)

    def claim_diagnostic(self, diag_id: int, owner: str) -> bool:
        """Atomically move a queued diagnostic to running; False if it is no longer queued."""
        now = utcnow()
        with self.db.session(write=True) as s:
            res = s.execute(
                update(Diagnostic)
                .where(Diagnostic.id == diag_id, Diagnostic.status == "queued")
                .values(status="running", started_at=now, heartbeat_at=now, owner=owner)
                .execution_options(synchronize_session=False)
            )
            return rowcount(res) == 1

    def set_diagnostic_status(self, diag_id: int, status: str, error: Optional[str] = None) -> None:
        check_status(status)
        now = utcnow()
        with self.db.session(write=True) as s:
            diag = s.get(Diagnostic, diag_id)
            if diag is None:
                raise StorageError(f"no diagnosis {diag_id}; list the run's diagnoses to see their ids")
            diag.status = status
            diag.heartbeat_at = now
            if status == "running" and diag.started_at is None:
                diag.started_at = now
            if status in ENDED_STATUSES:
                diag.finished_at = now
            if error is not None:
                diag.error = str(error)

    def running_diagnoses_heartbeats(self) -> list[tuple[int, Optional[str], Optional[datetime]]]:
        """``(diagnostic id, owner, last sign of life)`` of every running diagnosis, by id; the
        last sign of life is the heartbeat, else the start."""
        with self.db.session() as s:
            rows = s.execute(select(Diagnostic.id, Diagnostic.owner, Diagnostic.heartbeat_at, Diagnostic.started_at)
                             .where(Diagnostic.status == "running").order_by(Diagnostic.id)).all()
        return [(int(i), owner, beat or started) for i, owner, beat, started in rows]

    def request_cancel_diagnostic(self, diag_id: int) -> bool:
        """Queued -> cancelled now; running -> flag for the process computing it (it keeps
        the results of the work done and ends ``cancelled``); False if it already ended."""
        now = utcnow()
        with self.db.session(write=True) as s:
            res = s.execute(
                update(Diagnostic).where(Diagnostic.id == diag_id, Diagnostic.status == "queued")
                .values(status="cancelled", finished_at=now, cancel_requested=True,
                        error="cancelled before it started; nothing was computed")
                .execution_options(synchronize_session=False)
            )
            if rowcount(res) == 1:
                return True
            res = s.execute(
                update(Diagnostic).where(Diagnostic.id == diag_id, Diagnostic.status == "running")
                .values(cancel_requested=True).execution_options(synchronize_session=False)
            )
            if rowcount(res) == 1:
                return True
            if s.get(Diagnostic, diag_id) is None:
                raise StorageError(f"no diagnosis {diag_id}; list the diagnoses to see their ids")
            return False

    def diagnostic_cancel_requested(self, diag_id: int) -> bool:
        """Whether someone asked diagnostic ``diag_id`` to stop (False when it is gone)."""
        with self.db.session() as s:
            return bool(s.execute(select(Diagnostic.cancel_requested).where(Diagnostic.id == diag_id)).scalar())

    def delete_diagnostic(self, diag_id: int) -> None:
        """Delete a diagnostic and its result rows; a running one must be cancelled first."""
        with self.db.session(write=True) as s:
            status = s.execute(select(Diagnostic.status).where(Diagnostic.id == diag_id).with_for_update()).scalar()
            if status is None:
                raise StorageError(f"no diagnosis {diag_id}; list the diagnoses to see their ids")
            if status == "running":
                raise StorageError(f"diagnosis {diag_id} is running; cancel it first, then delete it once it stops")
            s.execute(delete(DiagnosticResult.__table__).where(DiagnosticResult.__table__.c.diagnostic_id == diag_id))
            s.execute(delete(Diagnostic.__table__).where(Diagnostic.__table__.c.id == diag_id))

    def add_diagnostic_results(self, diag_id: int, rows: Iterable[Mapping[str, Any]]) -> None:
        """Append result rows (keys from :data:`DIAGNOSTIC_RESULT_COLUMNS`, missing ones NULL,
        and optionally ``key_values``: a (batches, 1 + 2·keys) float array, see
        ``storage.models.DiagnosticResult``). A bad row writes nothing."""
        params = []
        for row in rows:
            unknown = set(row) - {*DIAGNOSTIC_RESULT_COLUMNS, KEY_VALUES}
            if unknown:
                raise ValueError(f"unknown diagnostic result fields {sorted(unknown)}; "
                                 f"expected some of {', '.join((*DIAGNOSTIC_RESULT_COLUMNS, KEY_VALUES))}")
            p = {c: row.get(c) for c in DIAGNOSTIC_RESULT_COLUMNS}
            for c in ("rank", "keys", "batches"):
                v = p[c]
                p[c] = None if v is None else int(v)
            for c in ("lam", "bias2", "bias2_se", "variance", "mse", "cos_mean"):
                v = p[c]
                p[c] = None if v is None else float(v)
            p[KEY_VALUES] = _key_bytes(row.get(KEY_VALUES), p["keys"], p["batches"])
            params.append({"diagnostic_id": int(diag_id), **p})
        if not params:
            return
        with self.db.session(write=True) as s:
            if s.get(Diagnostic, diag_id) is None:
                raise StorageError(f"no diagnosis {diag_id}; list the run's diagnoses to see their ids")
            s.execute(insert(DiagnosticResult.__table__), params)

    def diagnostic_results(self, diag_id: int, key_values: bool = False) -> pd.DataFrame:
        """The result rows of one diagnostic, in the order they were added; with
        ``key_values`` also that column: each row's (batches, 1 + 2·keys) float64 array, or
        None for a row stored without (before revision 0007)."""
        rt = DiagnosticResult.__table__
        columns = (*DIAGNOSTIC_RESULT_COLUMNS, *((KEY_VALUES,) if key_values else ()))
        stmt = select(*(rt.c[c] for c in columns)).where(rt.c.diagnostic_id == int(diag_id))
        with self.db.session() as s:
            rows = [tuple(r) for r in s.execute(stmt.order_by(rt.c.id))]
        frame = pd.DataFrame.from_records(rows, columns=list(columns))
        for col in ("rank", "keys", "batches"):
            frame[col] = frame[col].astype("Int64")
        for col in ("lam", "bias2", "bias2_se", "variance", "mse", "cos_mean"):
            frame[col] = frame[col].astype("float64")
        if key_values:
            frame[KEY_VALUES] = pd.Series([None if blob is None else
                                           np.frombuffer(bytes(blob), "<f8").reshape(int(batches), -1).copy()
                                           for blob, batches in zip(frame[KEY_VALUES], frame["batches"])],
                                          index=frame.index, dtype=object)
        return frame


def _key_bytes(values, keys: Optional[int], batches: Optional[int]) -> Optional[bytes]:
    """A row's per-key values as little-endian float64 bytes, checked against its keys and batches."""
    if values is None:
        return None
    array = np.asarray(values, dtype="<f8")
    if keys is None or batches is None or array.shape != (batches, 1 + 2 * keys):
        raise ValueError(f"key_values of shape {array.shape} do not fit keys {keys} and batches {batches}: "
                         "need (batches, 1 + 2·keys)")
    return array.tobytes()
