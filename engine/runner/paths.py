"""Where a run's checkpoints live, derived from the database URL (see
``engine.training.checkpoints`` for what a checkpoint holds)."""

from __future__ import annotations

import os
from pathlib import Path

from engine.training.checkpoints import ENV_DIR
from storage import db


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
