"""Each run's console (``storage.logs``): where a log line came from.

* new column ``run_logs.source`` (NOT NULL, default ``""``): ``stdout``, ``stderr``, ``warning``,
  a logger's name or ``lab``. Every line stored before keeps its id, time, level and text, with
  the source ``""`` (not recorded then); its level is already one of the levels (``debug``
  joins them, below ``info``, with no row to change).

Revision ID: 0014
Revises: 0013
"""

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("run_logs") as batch:  # SQLite: ALTER TABLE ADD COLUMN, no copy of the table
        batch.add_column(sa.Column("source", sa.String(100), nullable=False, server_default=""))


def downgrade() -> None:
    raise NotImplementedError("BASIS Lab never downgrades a database; restore a backup instead")
