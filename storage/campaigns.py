"""Campaigns of runs in stages: created with their first stage's runs, advanced exactly once.

A tuning campaign (``engine.runner.campaigns``) is created in one transaction with its trial
runs (``create``): the campaign row and every trial, or nothing. When every trial has ended,
whoever notices first advances it (``advance``): one transaction moves ``stage`` from
``tuning`` to ``evaluating`` with a conditional ``UPDATE … WHERE stage = 'tuning'`` and queues
the comparison's runs. Two workers that notice at once (threads of one process, processes on
one SQLite file, hosts on one PostgreSQL) both try; the database lets exactly one update the
row (SQLite takes the write lock at BEGIN; PostgreSQL's second ``UPDATE`` waits for the first
to commit, then finds the stage changed and updates nothing), so the comparison is queued once.

The repository ``store.campaigns`` of :class:`storage.store.RunStore`. It stores ``spec`` and
``chosen`` as the JSON it is given and knows nothing of what is inside them.
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Mapping, Optional, Sequence

from sqlalchemy import select, update

from .database import Repository
from .db import rowcount
from .errors import StorageError
from .limits import NAME_MAX, check_text
from .models import Campaign, Run, new_uid, utcnow
from .records import json_normal
from .runs import new_runs

STAGES = ("tuning", "evaluating")


@dataclass(frozen=True)
class CampaignRecord:
    """One stored campaign (see :class:`storage.models.Campaign`)."""

    id: int
    uid: str
    name: str
    kind: str
    stage: str
    spec: dict
    chosen: Optional[dict]
    tune_sweep_id: str
    eval_sweep_id: Optional[str]
    created_at: Optional[datetime]
    advanced_at: Optional[datetime]

    @classmethod
    def from_row(cls, c: Campaign) -> "CampaignRecord":
        return cls(id=c.id, uid=c.uid, name=c.name, kind=c.kind, stage=c.stage, spec=dict(c.spec or {}),
                   chosen=None if c.chosen is None else dict(c.chosen), tune_sweep_id=c.tune_sweep_id,
                   eval_sweep_id=c.eval_sweep_id, created_at=c.created_at, advanced_at=c.advanced_at)


def campaign_not_found(ref: Any) -> StorageError:
    return StorageError(f"no campaign {ref}; `python -m engine tune --list` shows the stored campaigns")


class CampaignsRepository(Repository):
    """Campaigns of runs in stages (see the module)."""

    def create(self, *, name: str, spec: Mapping[str, Any], tune_sweep_id: str,
               runs: Sequence[Mapping[str, Any]], kind: str = "tune") -> tuple[int, list[int]]:
        """Store a campaign and queue its first stage's ``runs`` (``RunsRepository.create_run``'s
        arguments each) in one transaction; (its id, the runs' ids in order)."""
        name = check_text("campaign name", str(name).strip() or "campaign", NAME_MAX)
        rows = new_runs(runs)
        with self.db.session(write=True) as s:
            row = Campaign(uid=new_uid(), name=name, kind=str(kind), stage=STAGES[0],
                           spec=json_normal(dict(spec), "campaign spec"), tune_sweep_id=str(tune_sweep_id),
                           created_at=utcnow())
            s.add(row)
            s.add_all(rows)
            s.flush()
            return int(row.id), [int(r.id) for r in rows]

    def advance(self, campaign_id: int, *, chosen: Mapping[str, Any], eval_sweep_id: str,
                runs: Sequence[Mapping[str, Any]]) -> Optional[list[int]]:
        """Move the campaign from ``tuning`` to ``evaluating``, store ``chosen`` and queue the
        comparison's ``runs`` under ``eval_sweep_id``, all in one transaction; the new runs'
        ids, or None when the campaign had left ``tuning`` already (another process advanced
        it: nothing is written)."""
        rows = new_runs(runs)
        values = dict(stage=STAGES[1], chosen=json_normal(dict(chosen), "campaign choice"),
                      eval_sweep_id=str(eval_sweep_id), advanced_at=utcnow())
        with self.db.session(write=True) as s:
            moved = rowcount(s.execute(update(Campaign).where(Campaign.id == int(campaign_id),
                                                              Campaign.stage == STAGES[0]).values(**values)))
            if not moved:
                return None
            s.add_all(rows)
            s.flush()
            return [int(r.id) for r in rows]

    def get(self, campaign_id: int) -> CampaignRecord:
        with self.db.session() as s:
            row = s.get(Campaign, int(campaign_id))
            if row is None:
                raise campaign_not_found(campaign_id)
            return CampaignRecord.from_row(row)

    def list(self, stage: Optional[str] = None) -> list[CampaignRecord]:
        """Every campaign (``stage``: only those in it), oldest first."""
        stmt = select(Campaign).order_by(Campaign.id)
        if stage is not None:
            stmt = stmt.where(Campaign.stage == stage)
        with self.db.session() as s:
            return [CampaignRecord.from_row(c) for c in s.scalars(stmt)]

    def of_sweep(self, sweep_id: Optional[str]) -> Optional[CampaignRecord]:
        """The campaign whose trials or comparison are the runs of sweep ``sweep_id``, else None."""
        if not sweep_id:
            return None
        stmt = select(Campaign).where((Campaign.tune_sweep_id == sweep_id) | (Campaign.eval_sweep_id == sweep_id))
        with self.db.session() as s:
            row = s.scalars(stmt).first()
            return None if row is None else CampaignRecord.from_row(row)

    def runs_of(self, campaign_id: int) -> "tuple[builtins.list[int], builtins.list[int]]":
        """(the trial run ids, the comparison's run ids) still stored, by id."""
        c = self.get(campaign_id)
        with self.db.session() as s:
            def ids(sweep: Optional[str]) -> list[int]:
                if sweep is None:
                    return []
                return [int(i) for i in s.scalars(select(Run.id).where(Run.sweep_id == sweep).order_by(Run.id))]

            return ids(c.tune_sweep_id), ids(c.eval_sweep_id)
