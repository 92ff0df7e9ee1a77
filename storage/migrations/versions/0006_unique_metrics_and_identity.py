"""A metric is stored once per (run, name, step); every database has an identity.

* ``metrics``: the index on ``(run_id, name, step)`` becomes unique.  Rows stored twice
  before (a resume that restarted from step 0 without deleting what the killed owner had
  written) are removed first, keeping the newest row (highest id) of each key, and the
  runs that lost rows get ``history_version`` bumped so incremental readers re-read them.
* new table ``database_identity`` (one row: this database's random ``uid``) and
  ``database_lineage`` (every identity its contents have had, oldest first); the
  upgrade gives the database its identity and starts its lineage with it.  A backup
  leaves the identity out, so the copy makes its own (``IdentityRepository.identities.identity``).

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op

from storage.models import UTCDateTime, new_uid, utcnow

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    conn = op.get_bind()
    keep = sa.text("SELECT max(id) FROM metrics GROUP BY run_id, name, step")
    conn.execute(sa.text(
        "UPDATE runs SET history_version = history_version + 1 WHERE id IN "
        f"(SELECT DISTINCT run_id FROM metrics WHERE id NOT IN ({keep.text}))"))
    conn.execute(sa.text(f"DELETE FROM metrics WHERE id NOT IN ({keep.text})"))
    op.drop_index("ix_metrics_run_id_name_step", table_name="metrics")
    op.create_index("ix_metrics_run_id_name_step", "metrics", ["run_id", "name", "step"], unique=True)

    identity = op.create_table(
        "database_identity",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("uid", sa.String(32), nullable=False),
        sa.Column("created_at", UTCDateTime),
    )
    lineage = op.create_table(
        "database_lineage",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("uid", sa.String(32), nullable=False, unique=True),
        sa.Column("created_at", UTCDateTime),
        sqlite_autoincrement=True,
    )
    uid, now = new_uid(), utcnow()
    op.bulk_insert(identity, [{"id": 1, "uid": uid, "created_at": now}])
    op.bulk_insert(lineage, [{"uid": uid, "created_at": now}])


def downgrade() -> None:
    raise NotImplementedError("BASIS Lab never downgrades a database; restore a backup instead")
