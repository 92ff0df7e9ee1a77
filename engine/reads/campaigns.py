"""Tuning campaigns read from the database: a campaign's ``TuneSpec``, its trials as a frame, its
comparison's runs and Table 3s. What the CLI's ``tune --list``, the Python API, the reports and
the Compare page read; starting and advancing a campaign is ``engine.runner.campaigns``.
Reading never writes."""

from __future__ import annotations

import pandas as pd

from engine.analysis import tuning
from engine.config.tuning import TuneSpec
from engine.core.stats import MARGIN
from engine.reads.queries import run_table3
from storage import RunStore
from storage.campaigns import CampaignRecord


def spec_of(campaign: CampaignRecord) -> TuneSpec:
    """The campaign's protocol, as stored (``TuneSpec.to_dict``)."""
    return TuneSpec.from_dict(campaign.spec)


def trial_records(store: RunStore, campaign: CampaignRecord) -> list:
    """The run records of the campaign's trials."""
    return [r for r in store.runs.list_runs() if r.sweep_id == campaign.tune_sweep_id]


def trials(store: RunStore, campaign: CampaignRecord, records: list | None = None) -> pd.DataFrame:
    """The campaign's trials (``records``: its ``trial_records``, when read already) as
    ``engine.analysis.tuning.trial_frame`` reads them from the store."""
    records = trial_records(store, campaign) if records is None else records
    return tuning.trial_frame(spec_of(campaign), records, store.metrics([r.id for r in records]))


def comparison(store: RunStore, campaign: CampaignRecord) -> tuple[list, list]:
    """(the tuned runs, the untuned runs) of the campaign's comparison ([] before it is queued)."""
    if campaign.eval_sweep_id is None or not campaign.chosen:
        return [], []
    records = [r for r in store.runs.list_runs() if r.sweep_id == campaign.eval_sweep_id]
    return tuning.split_comparison(spec_of(campaign), campaign.chosen["values"], records)


def comparison_tables(store: RunStore, campaign: CampaignRecord, adjust: bool = True) -> list[tuple[str, pd.DataFrame]]:
    """Table 3 of the comparison, each method at its chosen values (``free``: the tuned fields are
    part of the method, so each pairs with exact at exact's own choice) and, where trained, at the
    untuned values; both read on the test split where every run recorded it."""
    spec = spec_of(campaign)
    tuned, untuned = comparison(store, campaign)
    delta = spec.margin if spec.margin is not None else MARGIN
    out = []
    if tuned:
        out.append(("each method at its own best value (tuned)",
                    run_table3(store, [r.id for r in tuned], margin=delta, adjust=adjust, free=spec.fields)))
    if untuned:
        out.append(("every method at the untuned value",
                    run_table3(store, [r.id for r in untuned], margin=delta, adjust=adjust)))
    return out
