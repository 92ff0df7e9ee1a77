"""Which stored runs compare and how they are told apart: keys of stored config dicts
(``comparable_key``, ``seed_group_key``), the fields in which configs differ, and the
shape columns of exports. A stored dict that is not a ``RunConfig`` (written by hand or
by another version) still gets a key, from its fields as they are."""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from typing import Any

from engine.config.fields import ConfigError
from engine.config.run import BOOKKEEPING_NAMES, SWEPT_NAMES, RunConfig, base_type, fingerprint_of, schema


def stored(config: Mapping[str, Any]) -> RunConfig | None:
    """The ``RunConfig`` of a stored config dict, or None when it is not one (a run
    written by hand or by a version of BASIS Lab with other fields)."""
    try:
        return RunConfig.from_dict(config)
    except (ConfigError, TypeError):
        return None


def float_fields() -> list[str]:
    """The ``RunConfig`` fields that hold a real number (what a campaign tunes, such as ``lr``)."""
    return [f.name for f, _, tp in schema() if base_type(tp)[0] is float]


def check_free(free) -> tuple[str, ...]:
    """``free`` (run fields that are part of the method, not the setup) as a tuple; ValueError
    for a field ``RunConfig`` does not have, naming the real-valued fields one may free."""
    free = (free,) if isinstance(free, str) else tuple(free)
    unknown = [f for f in free if f not in RunConfig.__dataclass_fields__]
    if unknown:
        raise ValueError(f"unknown run field(s) {', '.join(map(repr, unknown))} to leave free; run fields with a "
                         f"real value: {', '.join(float_fields())}")
    return free


@functools.cache
def _defaults() -> dict[str, Any]:
    """The ``RunConfig`` defaults, as ``to_dict`` writes them."""
    return RunConfig().to_dict()


def comparable_key(config: Mapping[str, Any], free=()) -> str:
    """The fingerprint of ``RunConfig.comparable()`` of a stored config: equal for runs
    that may be compared (a string, so tables can group by it). ``free``: run fields that
    are part of the method rather than the setup (``("lr",)`` when each method runs at
    its own tuned learning rate), set to their ``RunConfig`` defaults first, so runs
    that differ only in them compare; ValueError for a field ``RunConfig`` does not have."""
    free = check_free(free)
    run = stored(config)
    if run is None:
        return fingerprint_of(config, {*SWEPT_NAMES, *BOOKKEEPING_NAMES, *free})
    if not free:
        return run.comparable().fingerprint()
    values = run.comparable().to_dict()
    values.update({name: _defaults()[name] for name in free})
    return fingerprint_of(values)


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
