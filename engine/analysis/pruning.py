"""Early stopping of tuning trials by Optuna's pruners, decided from the trials' stored validations.

A campaign with a pruner (``TuneSpec.pruner``: ``halving``, Optuna's ``SuccessiveHalvingPruner``
(asynchronous successive halving), or ``hyperband``, its ``HyperbandPruner``) asks at every
validation of a trial whether to stop it. Each method and tuning seed is one study; its trials
report their validation loss at each eval step (the resource is the step count: the smallest
rung is one eval interval, the largest the run's steps, each rung ``REDUCTION`` times the last).

The lab's runs are the record of truth, so the study is not kept anywhere: ``decide`` rebuilds
it in memory from the stored validations of the trials of the same method and seed that were
queued before this one (in queue order, each reporting its evaluations as it did, pruned where
the pruner pruned it, told complete when it finished, left running while it trains) and then
replays this trial's own evaluations; its answer at the newest one is the decision. A pruned
trial ends cancelled with ``PRUNED`` in its error and keeps the steps it ran in its method's
budget; it is never chosen.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence

from engine.config.tuning import PRUNERS

PRUNED = "pruned"  # the error of a pruned trial starts with it
REDUCTION = 3


def make_pruner(name: str, min_resource: int, max_resource: int):
    """Optuna's pruner of ``name`` over steps [``min_resource``, ``max_resource``]."""
    import optuna

    if name == "halving":
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=min_resource, reduction_factor=REDUCTION)
    if name == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=min_resource, max_resource=max_resource,
                                              reduction_factor=REDUCTION)
    raise ValueError(f"unknown pruner {name!r}; choose one of {', '.join(PRUNERS)}")


def _replay(trial, history: Mapping[int, float]) -> bool:
    """Report ``history`` (step → validation loss) to ``trial`` in step order; whether the pruner
    stopped it at one of those steps."""
    for step, value in sorted(history.items()):
        trial.report(float(value), int(step))
        if trial.should_prune():
            return True
    return False


def decide(name: str, min_resource: int, max_resource: int, earlier: Sequence[tuple[Mapping[int, float], str]],
           mine: Mapping[int, float], study_name: str) -> bool:
    """Whether the pruner ``name`` stops a trial whose validations so far are ``mine`` (step →
    loss), given the ``earlier`` trials of its study as (validations, status): each replayed in
    order, told complete when ``finished``, pruned when the pruner pruned it (or it was pruned
    when it ran: status ``pruned``), failed when it failed, left running otherwise."""
    import optuna
    from optuna.trial import TrialState

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        study = optuna.create_study(study_name=study_name, pruner=make_pruner(name, min_resource, max_resource),
                                    sampler=optuna.samplers.RandomSampler(seed=0))
        for history, status in earlier:
            trial = study.ask()
            stopped = _replay(trial, history)
            if stopped or status == PRUNED:
                study.tell(trial, state=TrialState.PRUNED)
            elif status == "finished" and history:
                study.tell(trial, float(history[max(history)]))
            elif status in ("failed", "cancelled"):
                study.tell(trial, state=TrialState.FAIL)
        return _replay(study.ask(), mine)
