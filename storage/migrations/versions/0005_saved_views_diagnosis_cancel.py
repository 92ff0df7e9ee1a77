"""Saved Compare views; a diagnosis can be asked to stop.

* new table ``saved_views``: a named Compare view (``state``: the URL query of the
  view as JSON, e.g. ``{"runs": "1,2,5", "pool": "1"}``), its name unique.
* new column ``diagnostics.cancel_requested`` (false for old rows): another process (the
  CLI, another dashboard) asks the one computing a diagnosis to stop; it keeps the
  results of the work done and ends ``cancelled``.

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

from storage.models import UTCDateTime

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "saved_views",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("state", sa.JSON, nullable=False),
        sa.Column("created_at", UTCDateTime),
        sa.Column("updated_at", UTCDateTime),
    )
    op.create_index("ix_saved_views_name", "saved_views", ["name"], unique=True)
    op.add_column("diagnostics", sa.Column("cancel_requested", sa.Boolean, nullable=False, server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table("diagnostics") as batch:
        batch.drop_column("cancel_requested")
    op.drop_index("ix_saved_views_name", table_name="saved_views")
    op.drop_table("saved_views")
