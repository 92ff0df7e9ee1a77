"""Where a run's checkpoints live, derived from the database URL and the database's
identity (see ``engine.training.checkpoints`` for what a checkpoint holds).

Under the checkpoint root, a database keeps its runs' checkpoints in folders named by its
identity (``storage.RunStore.identity``), so that a copy of it (``engine backup``) and the
original never delete or prune each other's::

    <root>/run-<run uid>/                 the database first created (a backup's original)
    <root>/db-<database uid>/run-<run uid>/   a copy of it (a backup in use, restored or not)

A copy reads the checkpoints its runs had when it was taken from the folders of the
databases in its lineage (the nearest first) and writes, prunes and deletes only in its own.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from engine.training.checkpoints import ENV_DIR, RunCheckpoints, run_dir
from storage import RunStore, db


def checkpoint_root(db_url: str | None = None) -> Path:
    """``$BASIS_LAB_CHECKPOINTS``, else ``checkpoints`` beside the SQLite file of
    ``resolve_url(db_url)`` (beside the default SQLite path for other databases)."""
    env = os.environ.get(ENV_DIR, "").strip()
    if env:
        return Path(env).expanduser().absolute()
    url = db.resolve_url(db_url)
    prefix = "sqlite:///"
    if url.startswith(prefix) and len(url) > len(prefix):
        database = Path(url[len(prefix) :].split("?", 1)[0])
    else:
        database = db.DEFAULT_DB_PATH
    return database.expanduser().absolute().parent / "checkpoints"


@dataclass(frozen=True)
class RunFolders:
    """The checkpoint folders of one run of one database: ``own``, the only one it writes,
    prunes or deletes, and ``borrowed``, those of the databases it was copied from (the
    nearest first), which it only reads."""

    own: Path
    borrowed: tuple[Path, ...] = ()

    def exists(self) -> bool:
        """Whether any of the folders is there (a run that never saved has none)."""
        return any(p.is_dir() for p in (self.own, *self.borrowed))

    def open(self, *, keep: int, name: str | None = None, epoch: int | None = None, **options) -> RunCheckpoints:
        """The run's ``RunCheckpoints``, writing into ``own`` (``options``: its ``resume_limit``,
        ``guard`` and ``on_saved``)."""
        return RunCheckpoints(self.own, keep=keep, name=name, epoch=epoch, borrowed=self.borrowed, **options)


def resume_limit(recorded: int | None) -> int:
    """The newest checkpoint step a resume of a run may take: the step its database records
    (written by the lease holder after the metrics of every step before it, so resuming there
    leaves no gap in the stored history), or -1 (none) when it records none."""
    return -1 if recorded is None else recorded


def database_dir(root: str | os.PathLike, lineage: tuple[str, ...], uid: str) -> Path:
    """The folder under ``root`` of database ``uid`` of ``lineage`` (oldest first): the
    root itself for the first, ``db-<uid>`` for a copy."""
    return Path(root) if uid == lineage[0] else Path(root) / f"db-{uid}"


def run_folders(store: RunStore, run_uid: str, root: str | os.PathLike | None = None) -> RunFolders:
    """The :class:`RunFolders` of run ``run_uid`` of ``store``'s database under ``root``
    (default ``checkpoint_root(store.url)``)."""
    root = Path(root) if root else checkpoint_root(store.url)
    me = store.identity()
    folder = run_dir(database_dir(root, me.lineage, me.uid), run_uid)
    return RunFolders(folder, tuple(run_dir(database_dir(root, me.lineage, a), run_uid) for a in me.ancestors))
