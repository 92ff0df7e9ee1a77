"""Run leases (fencing epochs), and integers sized to what the run schema allows.

* new run column ``epoch`` (0 for stored runs): the lease that every claim of a run bumps;
  an owner's writes hold only while it is still the run's (``storage.lease``).
* 64-bit integers (``BIGINT``) for every column a run's settings can push past 2³¹:
  ``runs.rank/seed/steps/steps_done/checkpoint_step``, ``metrics.step``,
  ``diagnostics.step`` and ``diagnostic_results.rank/keys/batches`` (a seed may be up to
  2³², steps are unbounded).  PostgreSQL alters the columns in place.  SQLite stores any
  integer in 64 bits already; its tables are rebuilt (batch mode) so their declared types
  agree with ``models.py``, keeping every row and id, and the AUTOINCREMENT high-water
  marks in ``sqlite_sequence`` are put back, so ids of deleted rows are never reused.

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

WIDENED = {
    "runs": ("rank", "seed", "steps", "steps_done", "checkpoint_step"),
    "metrics": ("step",),
    "diagnostics": ("step",),
    "diagnostic_results": ("rank", "keys", "batches"),
}


def upgrade() -> None:
    conn = op.get_bind()
    epoch = sa.Column("epoch", sa.Integer, nullable=False, server_default="0")
    if conn.dialect.name != "sqlite":
        op.add_column("runs", epoch)
        for table, columns in WIDENED.items():
            for column in columns:
                op.alter_column(table, column, type_=sa.BigInteger(), existing_type=sa.Integer())
        return
    high = dict(conn.exec_driver_sql("SELECT name, seq FROM sqlite_sequence").all())
    for table, columns in WIDENED.items():
        with op.batch_alter_table(table, recreate="always", table_kwargs={"sqlite_autoincrement": True}) as batch:
            if table == "runs":
                batch.add_column(epoch)
            for column in columns:
                batch.alter_column(column, type_=sa.BigInteger(), existing_type=sa.Integer())
    for table, seq in high.items():
        if table not in WIDENED:
            continue
        if conn.exec_driver_sql("SELECT 1 FROM sqlite_sequence WHERE name = ?", (table,)).first() is None:
            conn.exec_driver_sql("INSERT INTO sqlite_sequence (name, seq) VALUES (?, ?)", (table, seq))
        else:
            conn.exec_driver_sql("UPDATE sqlite_sequence SET seq = max(seq, ?) WHERE name = ?", (seq, table))


def downgrade() -> None:
    raise NotImplementedError("BASIS Lab never downgrades a database; restore a backup instead")
