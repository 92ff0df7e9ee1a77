"""Each run's log (``storage.logs``).

* new table ``run_logs`` (id, run_id → runs ON DELETE CASCADE, time, level, text), indexed by
  ``(run_id, id)`` (a run's log, in order) and ``(level, id)`` (the alerts after an id).

Revision ID: 0009
Revises: 0008
"""

import sqlalchemy as sa
from alembic import op

from storage.models import UTCDateTime

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "run_logs",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("run_id", sa.Integer, sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("time", UTCDateTime, nullable=False),
        sa.Column("level", sa.String(16), nullable=False),
        sa.Column("text", sa.Text, nullable=False),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_run_logs_run_id_id", "run_logs", ["run_id", "id"])
    op.create_index("ix_run_logs_level_id", "run_logs", ["level", "id"])


def downgrade() -> None:
    raise NotImplementedError("BASIS Lab never downgrades a database; restore a backup instead")
