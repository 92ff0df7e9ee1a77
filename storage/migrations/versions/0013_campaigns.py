"""Campaigns of runs in stages (``storage.campaigns``): a tuning campaign's trials, then its comparison.

* new table ``campaigns`` (id, uid, name, kind, stage, spec: the protocol as JSON, chosen: the
  values the trials chose, tune_sweep_id, eval_sweep_id, created_at, advanced_at). Databases
  before this revision have no campaigns; their runs are untouched.

Revision ID: 0013
Revises: 0012
"""

import sqlalchemy as sa
from alembic import op

from storage.models import UTCDateTime

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "campaigns",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("uid", sa.String(32), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("stage", sa.String(16), nullable=False),
        sa.Column("spec", sa.JSON, nullable=False),
        sa.Column("chosen", sa.JSON, nullable=True),
        sa.Column("tune_sweep_id", sa.String(64), nullable=False),
        sa.Column("eval_sweep_id", sa.String(64), nullable=True),
        sa.Column("created_at", UTCDateTime, nullable=True),
        sa.Column("advanced_at", UTCDateTime, nullable=True),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_campaigns_uid", "campaigns", ["uid"], unique=True)
    op.create_index("ix_campaigns_stage", "campaigns", ["stage"])
    op.create_index("ix_campaigns_tune_sweep_id", "campaigns", ["tune_sweep_id"], unique=True)
    op.create_index("ix_campaigns_eval_sweep_id", "campaigns", ["eval_sweep_id"], unique=True)


def downgrade() -> None:
    raise NotImplementedError("BASIS Lab never downgrades a database; restore a backup instead")
