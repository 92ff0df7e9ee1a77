"""Why an interrupted run stopped, as a column.

* new column ``runs.interruption_cause`` (NULL unless the run is ``interrupted``): one of
  ``storage.records.INTERRUPTION_CAUSES``: ``signal`` (its process was told to stop: a
  signal, the dashboard exiting), ``stale`` (its worker died: no heartbeat, or its process
  is gone; a worker may resume it), ``crash`` (its training thread raised past the run),
  ``disk_full`` (the database's or the checkpoints' disk).
* old interrupted rows get theirs from the error text the code before this revision wrote
  (``interrupted: …`` from the staleness rule, ``interrupted by a signal…``, ``interrupted
  before it started…``, ``disk full: …``, ``the worker … stopped training it…``); a text
  none of those begins stays NULL (cause unknown). The error texts are kept.

Revision ID: 0008
Revises: 0007
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

# (cause, the beginnings of the error texts that meant it before this revision), tried in order
OLD_TEXTS = (
    ("signal", ("interrupted by a signal", "interrupted before it started")),
    ("stale", ("interrupted: ",)),
    ("disk_full", ("disk full: ",)),
    ("crash", ("the worker ",)),
)


def upgrade() -> None:
    op.add_column("runs", sa.Column("interruption_cause", sa.String(16), nullable=True))
    runs = sa.table("runs", sa.column("status", sa.String), sa.column("error", sa.Text),
                    sa.column("interruption_cause", sa.String))
    for cause, beginnings in OLD_TEXTS:
        matches = sa.or_(*(runs.c.error.startswith(b, autoescape=True) for b in beginnings))
        op.execute(runs.update().where(runs.c.status == "interrupted", runs.c.interruption_cause.is_(None), matches)
                   .values(interruption_cause=cause))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("interruption_cause")
