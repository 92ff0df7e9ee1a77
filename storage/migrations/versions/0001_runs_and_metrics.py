"""Runs and metrics: the schema of BASIS Lab before Alembic (its ``schema_version`` 1).

Creates both tables in an empty database, and adopts a database written before Alembic:
one stamped ``schema_version`` 1 already matches; one written before any versioning (a
``runs`` table without some columns) gets the missing columns, tables and indexes, with
neutral values in its old rows (status ``finished``, empty config/notes, no cancel request).
Nothing stored is rewritten or dropped.  The tables are a frozen copy: later revisions must
not change what this one does.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

from storage.db import FIX_HINT, StorageError
from storage.models import UTCDateTime

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def _tables() -> dict[str, sa.Table]:
    md = sa.MetaData()
    runs = sa.Table(
        "runs", md,
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("name", sa.String(200), index=True),
        sa.Column("status", sa.String(16), index=True),
        sa.Column("created_at", UTCDateTime),
        sa.Column("started_at", UTCDateTime),
        sa.Column("finished_at", UTCDateTime),
        sa.Column("heartbeat_at", UTCDateTime),
        sa.Column("config", sa.JSON),
        sa.Column("estimator", sa.String(64), index=True),
        sa.Column("rank", sa.Integer, index=True),
        sa.Column("lam", sa.Float, index=True),
        sa.Column("seed", sa.Integer, index=True),
        sa.Column("preset", sa.String(64), index=True),
        sa.Column("steps", sa.Integer, index=True),
        sa.Column("steps_done", sa.Integer),
        sa.Column("error", sa.Text),
        sa.Column("notes", sa.Text),
        sa.Column("versions", sa.JSON),
        sa.Column("git_commit", sa.String(64)),
        sa.Column("device", sa.String(200)),
        sa.Column("owner", sa.String(255)),
        sa.Column("cancel_requested", sa.Boolean),
    )
    metrics = sa.Table(
        "metrics", md,
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("run_id", sa.Integer, sa.ForeignKey("runs.id", ondelete="CASCADE")),
        sa.Column("step", sa.Integer),
        sa.Column("wall_time", sa.Float),
        sa.Column("name", sa.String(64)),
        sa.Column("value", sa.Float),
        sa.Index("ix_metrics_run_id_id", "run_id", "id"),
        sa.Index("ix_metrics_run_id_name_step", "run_id", "name", "step"),
        sqlite_autoincrement=True,
    )
    return {"runs": runs, "metrics": metrics}


def upgrade() -> None:
    conn = op.get_bind()
    tables = _tables()
    insp = sa.inspect(conn)
    existing = set(insp.get_table_names())
    quote = conn.dialect.identifier_preparer.quote
    for tname in ("runs", "metrics"):
        table = tables[tname]
        if tname not in existing:
            table.create(conn)
            continue
        have = {c["name"] for c in insp.get_columns(tname)}
        needed = {"runs": {"id"}, "metrics": {"id", "run_id"}}[tname]
        if not needed <= have:
            raise StorageError(
                f"the database has a {tname!r} table that BASIS Lab did not create (no {sorted(needed - have)} "
                f"column); it was left untouched; {FIX_HINT}"
            )
        for col in table.columns:
            if col.name not in have:
                ddl = col.type.compile(dialect=conn.dialect)
                conn.exec_driver_sql(f"ALTER TABLE {quote(tname)} ADD COLUMN {quote(col.name)} {ddl}")
        have_ix = {ix["name"] for ix in insp.get_indexes(tname)}
        for ix in table.indexes:
            if ix.name not in have_ix:
                ix.create(conn)
    runs = tables["runs"]
    backfill = {
        "name": sa.literal("run-") + sa.cast(runs.c.id, sa.String),
        "status": "finished",
        "config": {},
        "versions": {},
        "notes": "",
        "steps_done": 0,
        "cancel_requested": False,
    }
    for name, value in backfill.items():
        conn.execute(sa.update(runs).where(runs.c[name].is_(None)).values({name: value}))


def downgrade() -> None:
    raise NotImplementedError("BASIS Lab never downgrades a database; restore a backup instead")
