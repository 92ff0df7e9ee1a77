"""The per-batch losses of every evaluation of a run (table ``eval_losses``): writes, truncation on resume, reads.

A row is one evaluation: ``(run_id, step, split, losses)``, ``losses`` the mean loss of each
batch of ``split`` (``"val"``) in batch order, as a JSON list. Every run of a dataset is
evaluated on the same batches, so batch b of two runs is a pair (what a paired analysis of
two methods needs to include the validation set's own sampling error). A non-finite loss (a
diverged evaluation) is stored as JSON ``null``, as JSON has no NaN, and read back as NaN:
the row is kept, so its length is always the number of batches.

Written as metrics are: with the metrics of the same record, in their transaction
(``add_metrics(…, eval_losses=…)``, :mod:`storage.metrics`), so a record is stored whole or
not at all; once per (run, step, split) (a unique index): a row whose key is stored already is
skipped (``INSERT … ON CONFLICT DO NOTHING``), and a resume deletes what it recomputes first
(``delete_metrics_after`` deletes these rows past its step too). A run's rows go with it.

The repository ``store.eval_losses`` of :class:`storage.store.RunStore`; ``store.eval_losses(run_ids)``
reads (:meth:`EvalLossesRepository.read`)."""

from __future__ import annotations

import math
from typing import Any, Iterable, Optional, Sequence, Union

import numpy as np
import pandas as pd
from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from .database import Database, Repository
from .db import rowcount
from .lease import hold
from .limits import check_int, check_text
from .models import EvalLosses
from .records import as_ids

SPLIT_MAX = 16  # characters of a split's name (``eval_losses.split`` is ``VARCHAR(16)``)
COLUMNS = ("run_id", "step", "losses")

EvalRow = tuple[int, str, Union[Sequence[float], np.ndarray]]  # (step, split, per-batch losses)


def rows_of(run_id: int, rows: Iterable[EvalRow]) -> list[dict[str, Any]]:
    """The table rows of ``(step, split, losses)``: each loss a float, a non-finite one None;
    a step the database cannot hold or a split name too long is a ValueError."""
    out = []
    for step, split, losses in rows:
        values = [float(x) for x in np.asarray(losses, dtype=np.float64).ravel()]
        out.append({"run_id": int(run_id), "step": check_int("step", int(step)),
                    "split": check_text("split", str(split), SPLIT_MAX),
                    "losses": [x if math.isfinite(x) else None for x in values]})
    return out


def insert(db: Database, s: Session, params: list[dict[str, Any]]) -> None:
    """Insert ``rows_of``'s rows in ``s``'s transaction, skipping a (run, step, split) stored already."""
    if params:
        s.execute(db.insert(EvalLosses.__table__).on_conflict_do_nothing(
            index_elements=["run_id", "step", "split"]), params)


def delete_after(s: Session, run_id: int, step: int) -> int:
    """Delete the run's rows with step > ``step`` in ``s``'s transaction; how many."""
    table = EvalLosses.__table__
    return int(rowcount(s.execute(delete(table).where(table.c.run_id == run_id, table.c.step > int(step)))) or 0)


def frame(rows: list) -> pd.DataFrame:
    """``(run_id, step, losses)`` rows as a frame: ids and steps int64, ``losses`` float64
    arrays (NaN where ``null`` was stored)."""
    out = pd.DataFrame.from_records(
        [(r, s, np.array([np.nan if x is None else x for x in losses], dtype=np.float64)) for r, s, losses in rows],
        columns=list(COLUMNS))
    return out.astype({"run_id": "int64", "step": "int64"})


class EvalLossesRepository(Repository):
    """The per-batch losses of every evaluation of a run (see the module)."""

    def add_eval_losses(self, run_id: int, rows: Iterable[EvalRow], *, epoch: Optional[int] = None) -> None:
        """Store ``(step, split, losses)`` rows in one transaction; a (step, split) the run holds
        already is skipped. Fenced by ``epoch`` as ``add_metrics`` (an owner that lost the run
        writes nothing). A trainer writes them with its metrics instead: ``add_metrics(…, eval_losses=…)``."""
        params = rows_of(run_id, rows)
        if not params:
            return
        with self.db.session(write=True) as s:
            hold(s, run_id, epoch)
            insert(self.db, s, params)

    def delete_eval_losses_after(self, run_id: int, step: int, *, epoch: Optional[int] = None) -> int:
        """Delete the run's rows with step > ``step``; how many. ``delete_metrics_after`` does
        this too, in its own transaction (what a resume calls). Fenced by ``epoch``."""
        with self.db.session(write=True) as s:
            hold(s, run_id, epoch)
            return delete_after(s, run_id, step)

    def read(self, run_ids: Iterable[int], split: str = "val") -> pd.DataFrame:
        """The evaluations of ``run_ids`` on ``split``: one row per (run, step) with columns
        ``run_id``, ``step`` and ``losses`` (a float64 array, one per batch in batch order, NaN
        for a non-finite loss), by run_id and step."""
        ids = as_ids(run_ids)
        if not ids:
            return frame([])
        table = EvalLosses.__table__
        stmt = (select(table.c.run_id, table.c.step, table.c.losses)
                .where(table.c.run_id.in_(ids), table.c.split == split).order_by(table.c.run_id, table.c.step))
        with self.db.session() as s:
            rows = [tuple(r) for r in s.execute(stmt)]
        return frame(rows)

    __call__ = read  # ``store.eval_losses(run_ids)``, as ``store.metrics(run_ids)``
