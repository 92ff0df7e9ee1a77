"""Expand a sweep (estimators × ranks × λ × seeds) into run configs."""

from __future__ import annotations

import dataclasses
from typing import Iterable, Sequence

from engine.train import ConfigError, RunConfig


def parse_ranks(text: str) -> tuple[bool, list[int]]:
    """``"exact,1,8,32"`` → (True, [1, 8, 32]). ``exact`` adds an exact-backprop run."""
    with_exact, ranks = False, []
    for token in (t.strip() for t in text.split(",")):
        if not token:
            continue
        if token == "exact":
            with_exact = True
            continue
        try:
            ranks.append(int(token))
        except ValueError:
            raise ConfigError(f"ranks: {token!r} is neither 'exact' nor an integer >= 1 (e.g. --ranks exact,1,8,32)") from None
    if not with_exact and not ranks:
        raise ConfigError("ranks: give at least one rank or 'exact' (e.g. --ranks exact,1,8,32)")
    return with_exact, ranks


def expand_grid(
    base: RunConfig,
    *,
    estimators: Sequence[str],
    ranks: Sequence[int],
    seeds: Sequence[int],
    lams: Sequence[float] | None = None,
    with_exact: bool = False,
) -> list[RunConfig]:
    """One config per (seed, estimator, rank, λ), exact runs once per seed (λ = 0).

    ``exact`` among ``estimators`` is the same as ``with_exact``. Every config is
    validated here, so a bad value fails before anything is queued.
    """
    lams = list(lams) if lams is not None else [base.lam]
    sketched = [e for e in estimators if e != "exact"]
    with_exact = with_exact or "exact" in estimators
    if not seeds:
        raise ConfigError("seeds: give at least one seed (e.g. --seeds 0,1,2)")
    if sketched and not ranks:
        raise ConfigError(f"ranks: estimators {sketched} need at least one rank (e.g. --ranks 1,8,32)")
    configs: list[RunConfig] = []
    for seed in seeds:
        if with_exact:
            configs.append(dataclasses.replace(base, estimator="exact", lam=0.0, seed=seed, name=None))
        for estimator in sketched:
            for rank in ranks:
                for lam in lams:
                    configs.append(dataclasses.replace(base, estimator=estimator, rank=rank, lam=lam, seed=seed, name=None))
    if not configs:
        raise ConfigError("the grid is empty: choose at least one estimator with ranks, or exact")
    return _unique(configs)


def _unique(configs: Iterable[RunConfig]) -> list[RunConfig]:
    seen, out = set(), []
    for c in configs:
        key = repr(c)
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out
