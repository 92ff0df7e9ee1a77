"""A run's checkpoints as files: where each is, its step and size, and an archive of one
(the dashboard's Run detail lists them and downloads the newest).

``run_checkpoints`` reads the run's folders (``engine.runner.paths.run_folders``: its own and
those of the databases this one was copied from) without writing or deleting anything.
``archive`` writes an uncompressed tar of a checkpoint's folder (its arrays are already
dense: compressing would cost time for little) into a temporary file, read from disk file
by file, so that a large checkpoint is held in memory once, by whoever reads the result
(``archive_bytes``: the dashboard's download, made only when its button is pressed).
"""

from __future__ import annotations

import os
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from engine.runner.paths import run_folders
from engine.training.checkpoints import CheckpointError
from storage import RunRecord, RunStore


@dataclass(frozen=True)
class CheckpointFiles:
    """One complete checkpoint on disk: its training ``step``, the lease ``epoch`` that
    saved it (-1: before leases), its ``folder``, its size in ``bytes`` and whether it is
    ``borrowed`` (in the folder of a database this one was copied from)."""

    step: int
    epoch: int
    folder: Path
    bytes: int
    borrowed: bool


def folder_bytes(folder: Path) -> int:
    """The size of every file under ``folder`` (0 when it is gone)."""
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:  # removed meanwhile (pruned by its writer)
                pass
    return total


def run_checkpoints(store: RunStore, run: RunRecord, root: str | os.PathLike | None = None) -> list[CheckpointFiles]:
    """The run's complete checkpoints, by step (of one step, the one a resume takes last);
    [] when it has none here (never saved, deleted, or its folders are on another machine).
    An unreadable folder is a ``CheckpointError`` naming it."""
    folders = run_folders(store, run.uid, root)
    if not folders.exists():
        return []
    with folders.open(keep=1, name=f"run {run.id}") as checkpoints:
        located = checkpoints.located()
    return [CheckpointFiles(step, epoch, folder, folder_bytes(folder), any(folder.is_relative_to(b) for b in folders.borrowed))
            for step, epoch, folder in located if folder.is_dir()]


def archive(folder: str | os.PathLike) -> IO[bytes]:
    """An uncompressed tar of ``folder`` (named by the folder, as ``<step>/…``), in a
    temporary file opened for reading from its start; removed once it is closed."""
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f"the checkpoint folder {folder} is gone (pruned by a newer save?): reload the page")
    out = tempfile.TemporaryFile(prefix="basis-checkpoint-", suffix=".tar")
    try:
        with tarfile.open(fileobj=out, mode="w") as tar:
            tar.add(folder, arcname=folder.name)
    except OSError:
        out.close()
        raise
    out.seek(0)
    return out


def archive_bytes(folder: str | os.PathLike) -> bytes:
    """``archive(folder)``'s bytes (what a download hands the browser), its temporary file removed."""
    with archive(folder) as out:
        return out.read()
