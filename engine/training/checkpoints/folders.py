"""Where checkpoints live: a run's folder under the root, its epoch folders, and the orbax
manager that reads or writes one folder."""

from __future__ import annotations

import os
import re
from pathlib import Path

import orbax.checkpoint as ocp

from engine.training.checkpoints.errors import CheckpointError
from engine.training.checkpoints.quiet import orbax_quiet

ENV_DIR = "BASIS_LAB_CHECKPOINTS"
TMP_SUFFIX = ocp.path.atomicity_types.TMP_DIR_SUFFIX
EPOCH_DIR = re.compile(r"epoch-(\d+)")


def run_dir(root: str | os.PathLike, run: int | str) -> Path:
    """The checkpoint directory of run ``run`` (its id or uid) under ``root``."""
    name = str(run)
    if not name or "/" in name or "\\" in name or name in (".", ".."):
        raise CheckpointError(f"run {run!r} is not a run id or uid: fix by passing the run's id")
    return Path(root) / f"run-{name}"


def open_manager(directory: Path, policy=None) -> ocp.CheckpointManager:
    with orbax_quiet():
        return new_manager(directory, policy)


def new_manager(directory: Path, policy) -> ocp.CheckpointManager:
    return ocp.CheckpointManager(
        directory,
        item_handlers={"state": ocp.StandardCheckpointHandler(), "meta": ocp.JsonCheckpointHandler()},
        options=ocp.CheckpointManagerOptions(enable_async_checkpointing=False, preservation_policy=policy,
                                             create=False),
    )


def epoch_folders(directory: Path) -> list[tuple[int, Path]]:
    """``(epoch, folder)`` of ``directory`` itself (epoch -1: from before epochs) and of
    each ``epoch-<E>`` folder in it, oldest first."""
    found = [(-1, directory)]
    try:
        entries = list(directory.iterdir())
    except OSError:
        entries = []
    for p in entries:
        m = EPOCH_DIR.fullmatch(p.name)
        if m and p.is_dir():
            found.append((int(m.group(1)), p))
    return sorted(found)
