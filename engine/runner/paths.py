"""Where a run's checkpoints live, derived from the database URL and the database's
identity (see ``engine.training.checkpoints`` for what a checkpoint holds).

Under the checkpoint root, a database keeps its runs' checkpoints in folders named by its
identity (``storage.identities.identity.IdentityRepository.identities.identity``), so that a copy of it (``engine backup``) and the
original never delete or prune each other's::

    <root>/run-<run uid>/                 the database first created (a backup's original)
    <root>/db-<database uid>/run-<run uid>/   a copy of it (a backup in use, restored or not)

A copy reads the checkpoints its runs had when it was taken from the folders of the
databases in its lineage (the nearest first) and writes, prunes and deletes only in its own.

The names come from stored values, which a database someone sent, or a shared PostgreSQL
anyone can write, may hold crafted (``x/../..``). So every uid a folder is named by (the
database's, those of its lineage, the run's) must have the form ``storage.models.new_uid``
makes, 32 lowercase hex digits, and every folder built from them must resolve (links
followed) inside the root; otherwise a ``CheckpointError`` names the value and the fix,
before anything is written or deleted.
"""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

from engine.training.checkpoints import ENV_DIR, CheckpointError, RunCheckpoints, run_dir
from storage import RunStore, db

UID = re.compile(r"[0-9a-f]{32}")  # what storage.models.new_uid makes
_FIX = "nothing was written or deleted; use an undamaged copy of the database (restore it from a backup)"


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


def checked_uid(uid: object, what: str) -> str:
    """``uid`` when it has the form a folder may be named by (:data:`UID`); else a one-line
    ``CheckpointError`` naming ``what`` (e.g. ``the database's identity uid``) and the fix."""
    if not isinstance(uid, str) or not UID.fullmatch(uid):
        shown = repr(uid) if len(repr(uid)) <= 60 else repr(uid)[:57] + "..."
        raise CheckpointError(f"{what} is {shown}, not the 32 hex digits BASIS Lab writes (a damaged or crafted "
                              f"database), so no checkpoint folder is named by it: {_FIX}")
    return uid


def inside(root: str | os.PathLike, folder: str | os.PathLike) -> Path:
    """``folder`` when it resolves (links followed) inside ``root``; else a one-line
    ``CheckpointError``: nothing is written to or deleted from a folder outside the root."""
    real_root, real = os.path.realpath(root), os.path.realpath(folder)
    if os.path.commonpath([real_root, real]) != real_root:
        raise CheckpointError(f"the checkpoint folder {folder} resolves to {real}, outside the checkpoint root "
                              f"{real_root}: {_FIX}, or set {ENV_DIR}")
    return Path(folder)


def checked_root(store: RunStore, checkpoints: str | os.PathLike | None = None) -> Path:
    """The checkpoint root of ``store``'s runs (``checkpoints``, default
    ``checkpoint_root(store.url)``), once the uids of the database's identity and lineage
    have the form folders may be named by (:func:`checked_uid`): the check a command makes
    before it writes or deletes anything."""
    root = Path(checkpoints) if checkpoints else checkpoint_root(store.url)
    me = store.identities.identity()
    for uid in me.lineage:
        checked_uid(uid, f"the identity uid of the database {store.url}" if uid == me.uid
                    else f"a uid of the lineage of the database {store.url}")
    return root


@dataclass(frozen=True)
class RunFolders:
    """The checkpoint folders of one run of one database: ``own``, the only one it writes,
    prunes or deletes, and ``borrowed``, those of the databases it was copied from (the
    nearest first), which it only reads; ``database``: the copy's ``db-<uid>`` folder that
    holds ``own`` (None for the database first created, whose runs sit in the root)."""

    own: Path
    borrowed: tuple[Path, ...] = ()
    database: Path | None = None

    def exists(self) -> bool:
        """Whether any of the folders is there (a run that never saved has none)."""
        return any(p.is_dir() for p in (self.own, *self.borrowed))

    def open(self, *, keep: int, name: str | None = None, epoch: int | None = None, **options) -> RunCheckpoints:
        """The run's ``RunCheckpoints``, writing into ``own`` (``options``: its ``resume_limit``,
        ``guard`` and ``on_saved``)."""
        return RunCheckpoints(self.own, keep=keep, name=name, epoch=epoch, borrowed=self.borrowed, **options)

    def delete_own(self) -> None:
        """Delete ``own`` with every checkpoint in it, then the copy's ``database`` folder when
        that is left empty (one that still holds another run's folder stays); never a
        borrowed folder, never the root."""
        RunCheckpoints(self.own, keep=1).delete_all()
        if self.database is not None:
            with contextlib.suppress(OSError):  # not empty: another run of the copy saved there
                self.database.rmdir()


def resume_limit(recorded: int | None) -> int:
    """The newest checkpoint step a resume of a run may take: the step its database records
    (written by the lease holder after the metrics of every step before it, so resuming there
    leaves no gap in the stored history), or -1 (none) when it records none."""
    return -1 if recorded is None else recorded


def database_dir(root: str | os.PathLike, lineage: tuple[str, ...], uid: str) -> Path:
    """The folder under ``root`` of database ``uid`` of ``lineage`` (oldest first): the
    root itself for the first, ``db-<uid>`` for a copy; ``uid`` is checked first
    (:func:`checked_uid`)."""
    checked_uid(uid, "a database uid")
    return Path(root) if uid == lineage[0] else Path(root) / f"db-{uid}"


def run_folders(store: RunStore, run_uid: str, root: str | os.PathLike | None = None) -> RunFolders:
    """The :class:`RunFolders` of run ``run_uid`` of ``store``'s database under ``root``
    (default ``checkpoint_root(store.url)``): every uid checked (:func:`checked_root`,
    :func:`checked_uid`) and every folder inside the root (:func:`inside`), else a
    ``CheckpointError`` before anything is written or deleted."""
    root = checked_root(store, root)
    checked_uid(run_uid, f"the uid of a run of the database {store.url}")
    me = store.identities.identity()
    mine = database_dir(root, me.lineage, me.uid)
    folder = inside(root, run_dir(mine, run_uid))
    borrowed = tuple(inside(root, run_dir(database_dir(root, me.lineage, a), run_uid)) for a in me.ancestors)
    return RunFolders(folder, borrowed, None if mine == Path(root) else mine)
