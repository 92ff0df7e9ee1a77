"""Ids never reused, run uids, sweeps/tags/workers/checkpoints, diagnostics; drop ``schema_version``.

* ``runs.id`` becomes AUTOINCREMENT on SQLite (the table is rebuilt keeping every row and
  id; ``storage.db`` turns foreign keys off around the upgrade so the rebuild cannot cascade
  into ``metrics``, and checks them afterwards).  PostgreSQL ids come from a sequence already.
* new run columns: ``uid`` (random hex, unique, backfilled), ``sweep_id``, ``tags`` (JSON list,
  ``[]`` for old rows), ``worker_id``, ``checkpoint_step``, ``history_version`` (0).
* new tables ``workers``, ``diagnostics``, ``diagnostic_results``.
* the pre-Alembic one-row ``schema_version`` table, adopted by revision 0001, is dropped.

Revision ID: 0002
Revises: 0001
"""

import uuid

import sqlalchemy as sa
from alembic import op

from storage.models import UTCDateTime

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

_NEW_RUN_COLUMNS = (
    ("uid", sa.String(32)),
    ("sweep_id", sa.String(64)),
    ("tags", sa.JSON),
    ("worker_id", sa.String(64)),
    ("checkpoint_step", sa.Integer),
    ("history_version", sa.Integer),
)


def upgrade() -> None:
    conn = op.get_bind()
    if conn.dialect.name == "sqlite":
        with op.batch_alter_table("runs", recreate="always", table_kwargs={"sqlite_autoincrement": True}) as batch:
            for name, type_ in _NEW_RUN_COLUMNS:
                batch.add_column(sa.Column(name, type_))
    else:
        for name, type_ in _NEW_RUN_COLUMNS:
            op.add_column("runs", sa.Column(name, type_))

    runs = sa.table("runs", sa.column("id", sa.Integer), sa.column("uid", sa.String),
                    sa.column("tags", sa.JSON), sa.column("history_version", sa.Integer))
    ids = conn.execute(sa.select(runs.c.id)).scalars().all()
    if ids:
        conn.execute(
            sa.update(runs).where(runs.c.id == sa.bindparam("rid")).values(uid=sa.bindparam("new_uid")),
            [{"rid": rid, "new_uid": uuid.uuid4().hex} for rid in ids],
        )
    conn.execute(sa.update(runs).values(tags=[], history_version=0))
    op.create_index("ix_runs_uid", "runs", ["uid"], unique=True)
    op.create_index("ix_runs_sweep_id", "runs", ["sweep_id"])

    op.create_table(
        "workers",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("host", sa.String(255)),
        sa.Column("pid", sa.Integer),
        sa.Column("device", sa.String(200)),
        sa.Column("started_at", UTCDateTime),
        sa.Column("heartbeat_at", UTCDateTime),
        sa.Column("current_run_id", sa.Integer, sa.ForeignKey("runs.id", ondelete="SET NULL")),
        sa.Column("status", sa.String(16)),
        sa.Column("concurrent", sa.Integer),
    )
    op.create_table(
        "diagnostics",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("uid", sa.String(32)),
        sa.Column("run_id", sa.Integer, sa.ForeignKey("runs.id", ondelete="CASCADE")),
        sa.Column("step", sa.Integer),
        sa.Column("status", sa.String(16)),
        sa.Column("settings", sa.JSON),
        sa.Column("created_at", UTCDateTime),
        sa.Column("started_at", UTCDateTime),
        sa.Column("finished_at", UTCDateTime),
        sa.Column("heartbeat_at", UTCDateTime),
        sa.Column("owner", sa.String(255)),
        sa.Column("error", sa.Text),
        sa.Column("notes", sa.Text),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_diagnostics_uid", "diagnostics", ["uid"], unique=True)
    op.create_index("ix_diagnostics_run_id", "diagnostics", ["run_id"])
    op.create_index("ix_diagnostics_status", "diagnostics", ["status"])
    op.create_table(
        "diagnostic_results",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("diagnostic_id", sa.Integer, sa.ForeignKey("diagnostics.id", ondelete="CASCADE")),
        sa.Column("layer", sa.String(200)),
        sa.Column("estimator", sa.String(64)),
        sa.Column("rank", sa.Integer),
        sa.Column("lam", sa.Float),
        sa.Column("bias2", sa.Float),
        sa.Column("bias2_se", sa.Float),
        sa.Column("variance", sa.Float),
        sa.Column("mse", sa.Float),
        sa.Column("cos_mean", sa.Float),
        sa.Column("keys", sa.Integer),
        sa.Column("batches", sa.Integer),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_diagnostic_results_diagnostic_id", "diagnostic_results", ["diagnostic_id"])

    if "schema_version" in sa.inspect(conn).get_table_names():
        op.drop_table("schema_version")


def downgrade() -> None:
    raise NotImplementedError("BASIS Lab never downgrades a database; restore a backup instead")
