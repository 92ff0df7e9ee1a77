"""Per-key values of a diagnosis.

* new column ``diagnostic_results.key_values`` (binary, NULL for old rows): per batch,
  the float64 vector [‖dW‖², ‖e_1‖² … ‖e_K‖², ‖e_1 − ē‖² … ‖e_K − ē‖²] of the row
  (little-endian, batches × (1 + 2K) values; ``engine.analysis.keystats``), from which
  the claims' intervals are made. Rows without it (diagnoses stored before) keep their
  moments; their intervals are the old worst-case bounds, and say so.

Revision ID: 0007
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("diagnostic_results", sa.Column("key_values", sa.LargeBinary, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("diagnostic_results") as batch:
        batch.drop_column("key_values")
