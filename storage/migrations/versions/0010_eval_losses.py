"""The per-batch losses of every evaluation of a run (``storage.eval_losses``).

* new table ``eval_losses`` (id, run_id → runs ON DELETE CASCADE, step, split, losses: a
  JSON list of the per-batch mean losses, ``null`` for a non-finite one), unique on
  ``(run_id, step, split)``. Runs trained before this revision have no rows.

Revision ID: 0010
Revises: 0009
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "eval_losses",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("run_id", sa.Integer, sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("step", sa.BigInteger, nullable=False),
        sa.Column("split", sa.String(16), nullable=False),
        sa.Column("losses", sa.JSON, nullable=False),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_eval_losses_run_id_step_split", "eval_losses", ["run_id", "step", "split"], unique=True)


def downgrade() -> None:
    raise NotImplementedError("BASIS Lab never downgrades a database; restore a backup instead")
