"""Which stored runs compare and how they are told apart: keys of stored config dicts
(``comparable_key``, ``seed_group_key``), the fields in which configs differ, and the
shape columns of exports. A stored dict that is not a ``RunConfig`` (written by hand or
by another version) still gets a key, from its fields as they are."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from engine.config.fields import ConfigError
from engine.config.run import BOOKKEEPING_NAMES, SWEPT_NAMES, RunConfig, fingerprint_of


def stored(config: Mapping[str, Any]) -> RunConfig | None:
    """The ``RunConfig`` of a stored config dict, or None when it is not one (a run
    written by hand or by a version of BASIS Lab with other fields)."""
    try:
        return RunConfig.from_dict(config)
    except (ConfigError, TypeError):
        return None


def comparable_key(config: Mapping[str, Any]) -> str:
    """The fingerprint of ``RunConfig.comparable()`` of a stored config: equal for runs
    that may be compared (a string, so tables can group by it)."""
    run = stored(config)
    return run.comparable().fingerprint() if run else fingerprint_of(config, {*SWEPT_NAMES, *BOOKKEEPING_NAMES})


def seed_group_key(config: Mapping[str, Any]) -> str:
    """The fingerprint of ``RunConfig.seed_group()`` of a stored config: equal for runs
    that differ only by seed."""
    run = stored(config)
    if run:
        return run.seed_group().fingerprint()
    exact = config.get("estimator") == "exact" or config.get("sketched_layers") == "none"
    return fingerprint_of(config, {"seed", *BOOKKEEPING_NAMES, *(("rank", "lam") if exact else ())})


def differing_fields(configs) -> list[str]:
    """The trajectory and measurement fields, other than estimator, rank, λ and seed,
    whose values differ among the stored ``configs`` (what tells setups apart in a table
    or a legend; bookkeeping such as steps or the eval interval does not)."""
    configs = list(configs)
    keys = sorted({k for c in configs for k in c} - {*SWEPT_NAMES, *BOOKKEEPING_NAMES})
    return [k for k in keys if len({json.dumps(c.get(k), sort_keys=True, default=str) for c in configs}) > 1]


def shape_columns(config: Mapping[str, Any]) -> dict[str, int | None]:
    """The effective shape of a stored config for exports: ``B_seqs`` (batch size),
    ``T_tokens`` (sequence length) and ``R_rows`` (rank clipped to B·T; None for exact
    runs); all None when the config is not a ``RunConfig``."""
    run = stored(config)
    if run is None:
        return {"B_seqs": None, "T_tokens": None, "R_rows": None}
    return {"B_seqs": run.effective_batch_size, "T_tokens": run.effective_seq_len,
            "R_rows": None if run.is_exact else run.effective_rank}
