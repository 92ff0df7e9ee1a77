"""Runs of versions before the held-out test split keep the split they trained on.

From this revision every corpus has a third split, ``test``, taken after the validation
documents (``engine.data.cache``): ``RunConfig.test_tokens`` holds its size, and its
default (None: as many tokens as ``val_tokens``) moves documents out of the training
split.  A run stored before it has no ``test_tokens`` key in its config, so reading it
back (``RunConfig.from_dict`` fills defaults) would silently give it a test split and
another training split than the one it trained on (a resume would then refuse its own
sampler state, a diagnosis would draw other batches).

* ``runs.config``: every JSON object lacking ``test_tokens`` gets ``"test_tokens": 0`` (no
  test split: exactly the train and validation tokens it trained and validated on); every
  other key and value is kept.  A config that is not a JSON object (or not JSON) is left as
  it is.  Rows are read and written ``BATCH`` at a time, in id order, so a large ``runs``
  table is never held in memory at once; SQLite and PostgreSQL alike (the JSON is parsed
  and written in Python).
* downgrade: ``test_tokens`` is removed wherever it is 0 (what a version before this one
  reads; a run whose test split was not 0 keeps it, and such a version refuses its config).

Revision ID: 0012
Revises: 0011
"""

import json
from typing import Callable, Optional

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

KEY = "test_tokens"
BATCH = 1000  # runs read and written per round trip


def _runs() -> sa.TableClause:
    return sa.table("runs", sa.column("id", sa.Integer), sa.column("config", sa.JSON))


def _rewrite(conn: sa.Connection, change: Callable[[dict], Optional[dict]]) -> None:
    """Every run's config that is a JSON object, through ``change`` (None: leave it), ``BATCH``
    rows at a time by id."""
    runs = _runs()
    text = sa.cast(runs.c.config, sa.Text)
    last = None
    while True:
        query = sa.select(runs.c.id, text).order_by(runs.c.id).limit(BATCH)
        rows = conn.execute(query if last is None else query.where(runs.c.id > last)).all()
        if not rows:
            return
        last = rows[-1][0]
        updates = []
        for rid, stored in rows:
            try:
                config = json.loads(stored) if stored is not None else None
            except ValueError:
                continue  # not JSON: no reader can decode it either
            if isinstance(config, dict) and (new := change(config)) is not None:
                updates.append({"rid": rid, "new_config": new})
        if updates:
            conn.execute(sa.update(runs).where(runs.c.id == sa.bindparam("rid"))
                         .values(config=sa.bindparam("new_config", type_=sa.JSON)), updates)


def _add_key(config: dict) -> Optional[dict]:
    return None if KEY in config else {**config, KEY: 0}


def _drop_zero(config: dict) -> Optional[dict]:
    if type(config.get(KEY)) is not int or config[KEY] != 0:
        return None
    return {k: v for k, v in config.items() if k != KEY}


def upgrade() -> None:
    _rewrite(op.get_bind(), _add_key)


def downgrade() -> None:
    _rewrite(op.get_bind(), _drop_zero)
