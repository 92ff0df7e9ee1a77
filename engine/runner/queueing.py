"""Queueing runs: the rows a launch stores (config, package versions, commit, device), one sweep id per launch.

``queue_runs`` stores a launch's runs in one transaction (all or none); ``owner`` None leaves
them to any worker (``--queue-only``), a process's owner keeps them for that process.
"""

from __future__ import annotations

import platform
import subprocess
import time
import uuid
from importlib import metadata
from pathlib import Path
from typing import Iterable

from engine.config import RunConfig
from storage import RunStore


def device_kind(count: int = 1) -> str:
    """``gpu: NVIDIA H200``, and ``gpu: NVIDIA H200 × 4`` for a run on 4 such devices
    (``app.tables.device_parts`` reads it back)."""
    import jax

    dev = jax.devices()[0]
    return f"{dev.platform}: {dev.device_kind}" + (f" × {count}" if count > 1 else "")


_PACKAGES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy", "tiktoken", "datasets", "SQLAlchemy",
             "streamlit")


def environment() -> dict:
    """Package versions, git commit and device, stored with every run."""
    versions = {"python": platform.python_version()}
    for name in _PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True, text=True, timeout=5
        ).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {"versions": versions, "git_commit": commit, "device": device_kind()}


def new_sweep_id() -> str:
    """A short id shared by the runs of one launch."""
    return time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]


def run_row(config: RunConfig, env: dict, *, owner: str | None = None, sweep_id: str | None = None,
            tags: Iterable[str] = ()) -> dict:
    """The ``RunsRepository.create_run`` arguments of one run of ``config``."""
    return dict(
        name=config.label(),
        config=config.to_dict(),
        estimator="exact" if config.is_exact else config.estimator,
        rank=None if config.is_exact else config.effective_rank,
        lam=config.lam,
        seed=config.seed,
        preset=config.preset,
        steps=config.steps,
        sweep_id=sweep_id,
        tags=list(tags),
        owner=owner,
        **env,
    )


def create_run(store: RunStore, config: RunConfig, env: dict, *, owner: str | None = None,
               sweep_id: str | None = None, tags: Iterable[str] = ()) -> int:
    """Queue one run; ``owner`` None leaves it to any worker."""
    return store.runs.create_run(**run_row(config, env, owner=owner, sweep_id=sweep_id, tags=tags))


def queue_runs(store: RunStore, configs: Iterable[RunConfig], *, sweep_id: str | None = None,
               tags: Iterable[str] = (), owner: str | None = None, env: dict | None = None) -> list[int]:
    """Queue runs in one transaction, all or none (``owner`` None: for any worker, as
    ``--queue-only``); their ids in order."""
    env, sweep_id = env or environment(), sweep_id or new_sweep_id()
    tags = list(tags)
    return store.runs.create_runs([run_row(c, env, owner=owner, sweep_id=sweep_id, tags=tags) for c in configs])


