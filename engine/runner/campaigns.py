"""Tuning campaigns in the database: started with their trials, advanced to the comparison exactly once.

Reading a campaign (its spec, trials and comparison) is ``engine.reads.campaigns``.
``start`` stores a campaign (its ``TuneSpec`` as JSON) and queues every trial in one transaction.
``advance`` is called whenever a run ends (``engine.runner.ends``), by ``engine resume --all`` and
by every worker as it starts: once every trial of a campaign has ended (``engine.analysis.tuning
.settled``) it chooses each method's values from the stored trials and queues the comparison,
in one transaction that moves the campaign's stage (``storage.campaigns``): whoever finishes
the last trial, and however many workers notice, the comparison is queued exactly once. The
comparison's runs are tagged ``TUNE_TAG``, so their sweep's report is built when the last ends.
"""

from __future__ import annotations

import logging

import pandas as pd

from engine.analysis import tuning
from engine.analysis.pruning import PRUNED, decide
from engine.config import RunConfig
from engine.config.tuning import TRIAL_TAG, TUNE_TAG, TuneSpec
from engine.errors import TASK_FAILURES
from engine.reads.campaigns import spec_of, trial_records, trials
from storage import RunStore
from storage.campaigns import CampaignRecord

log = logging.getLogger(__name__)


def start(store: RunStore, spec: TuneSpec, *, owner: str | None = None, env: dict | None = None,
          name: str | None = None) -> tuple[int, list[int]]:
    """Store the campaign and queue its trials (owned by ``owner``; None: any worker), all or
    nothing; (the campaign's id, the trials' run ids)."""
    from engine.runner.queueing import environment, new_sweep_id, run_row

    env, sweep_id = env or environment(), new_sweep_id()
    rows = [run_row(config, env, owner=owner, sweep_id=sweep_id, tags=(TRIAL_TAG,))
            for _, _, config in spec.trial_configs()]
    return store.campaigns.create(name=name or spec.grid.base.name or f"tune {sweep_id}", spec=spec.to_dict(),
                                  tune_sweep_id=sweep_id, runs=rows)


NO_METRICS = pd.DataFrame(columns=["run_id", "step", "name", "value"])  # a trial frame of configs and statuses alone


def advance(store: RunStore, campaign_id: int, *, owner: str | None = None) -> list[int]:
    """Queue the comparison of a campaign whose trials have all ended (module docstring); the
    new runs' ids, [] when it is not time yet or another process advanced it."""
    from engine.runner.queueing import environment, new_sweep_id, run_row

    campaign = store.campaigns.get(campaign_id)
    if campaign.stage != "tuning":
        return []
    records = trial_records(store, campaign)
    if not records or not {r.status for r in records} <= set(tuning.SETTLED_STATUSES):
        return []  # a trial still to train (or none left): not yet, and no metrics read
    frame = trials(store, campaign, records)
    if not tuning.settled(frame):
        return []
    spec = spec_of(campaign)
    choices = tuning.choose(spec, frame)
    chosen = tuning.chosen_values(spec, choices)
    env, sweep_id = environment(), new_sweep_id()
    rows = [run_row(c, env, owner=owner, sweep_id=sweep_id, tags=(TUNE_TAG,)) for c in spec.eval_configs(chosen)]
    record = {"values": chosen, "choices": tuning.stored_choices(choices)}
    ids = store.campaigns.advance(campaign.id, chosen=record, eval_sweep_id=sweep_id, runs=rows)
    if ids:
        log.info("campaign %s: trials settled; its comparison is queued (%d runs, sweep %s)", campaign.id, len(ids),
                 sweep_id)
    return ids or []


def advance_all(store: RunStore, *, owner: str | None = None) -> list[int]:
    """``advance`` every campaign still tuning; every new run's id. A failure is logged, never
    raised: the trials are stored, and the next run's end or ``resume --all`` tries again."""
    ids: list[int] = []
    for campaign in store.campaigns.list(stage="tuning"):
        try:
            ids += advance(store, campaign.id, owner=owner)
        except TASK_FAILURES:
            log.warning("campaign %s could not be advanced", campaign.id, exc_info=True)
    return ids


def after_trial(store: RunStore, run_id: int, *, owner: str | None = None) -> list[int]:
    """After run ``run_id`` ended: advance its campaign when it is a trial (``advance``)."""
    try:
        campaign = store.campaigns.of_sweep(store.runs.get_run(run_id).sweep_id)
        if campaign is None or campaign.stage != "tuning":
            return []
        return advance(store, campaign.id, owner=owner)
    except TASK_FAILURES:
        log.warning("the campaign of run %s could not be advanced", run_id, exc_info=True)
        return []


class TrialPruning:
    """Whether a trial of a campaign with a pruner stops at its newest validation
    (``engine.analysis.pruning.decide``, from the stored validations of the trials of its method
    and tuning seed queued before it)."""

    def __init__(self, store: RunStore, campaign: CampaignRecord, spec: TuneSpec, run) -> None:
        self.store, self.campaign, self.spec, self.run = store, campaign, spec, run
        found = tuning.trial_frame(spec, [run], NO_METRICS)
        self.method = str(found["method"].iloc[0]) if len(found) else None
        self.history: dict[int, float] = {}

    def earlier(self) -> list[tuple[dict[int, float], str]]:
        """(validations by step past 0, status) of the earlier trials of this method and seed, in queue order."""
        records = [r for r in trial_records(self.store, self.campaign) if r.id < self.run.id and r.seed == self.run.seed]
        frame = tuning.trial_frame(self.spec, records, NO_METRICS)
        ids = [int(i) for i in frame.loc[frame["method"] == self.method, "run_id"]]
        metrics = self.store.metrics(ids, names=["val_loss"])
        status = {r.id: r.status for r in records}
        pruned = set(frame.loc[frame["pruned"], "run_id"])
        out = []
        for run_id in ids:
            mine = metrics[(metrics["run_id"] == run_id) & (metrics["step"] > 0)]
            out.append(({int(s): float(v) for s, v in zip(mine["step"], mine["value"])},
                        PRUNED if run_id in pruned else status[run_id]))
        return out

    def prune(self, step: int, val_loss: float) -> str | None:
        """Record this trial's validation at ``step``; the reason it stops there, else None."""
        config = RunConfig.from_dict(self.run.config)
        if self.method is None or step <= 0 or step >= config.steps:
            return None
        self.history[int(step)] = float(val_loss)
        interval = config.effective_eval_interval
        name = f"campaign {self.campaign.uid} {self.method} s{self.run.seed}"
        if decide(self.spec.pruner, interval, config.steps, self.earlier(), self.history, name):
            return (f"{PRUNED} by Optuna's {self.spec.pruner} pruner at step {step} (validation loss {val_loss:.4f} "
                    "behind its rung); its steps count in its method's budget")
        return None


def pruning_for(store: RunStore, run) -> TrialPruning | None:
    """The pruning of run record ``run`` when it is a trial of a campaign with a pruner, else None."""
    campaign = store.campaigns.of_sweep(run.sweep_id)
    if campaign is None or campaign.tune_sweep_id != run.sweep_id:
        return None
    spec = spec_of(campaign)
    return TrialPruning(store, campaign, spec, run) if spec.pruner != "none" else None
