"""Reports: a table ``reports`` holding each report built from the runs (``storage.models.Report``).

Revision ID: 0004
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

from storage.models import UTCDateTime

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "reports",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("uid", sa.String(32)),
        sa.Column("key", sa.String(200)),
        sa.Column("sweep_id", sa.String(64)),
        sa.Column("title", sa.String(200), nullable=False),
        sa.Column("selection", sa.JSON),
        sa.Column("run_ids", sa.JSON),
        sa.Column("at_step", sa.BigInteger),
        sa.Column("created_at", UTCDateTime),
        sa.Column("content", sa.Text, nullable=False),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_reports_uid", "reports", ["uid"], unique=True)
    op.create_index("ix_reports_key", "reports", ["key"], unique=True)
    op.create_index("ix_reports_sweep_id", "reports", ["sweep_id"])


def downgrade() -> None:
    raise NotImplementedError("BASIS Lab never downgrades a database; restore a backup instead")
