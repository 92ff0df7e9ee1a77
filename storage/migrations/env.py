"""Alembic runs this on the connection that :func:`storage.db.ensure_schema` hands it.

That connection is already inside the transaction (SQLite ``BEGIN IMMEDIATE``, PostgreSQL
with an advisory lock held), so every revision of one upgrade commits or rolls back together.
"""

from alembic import context

from storage.models import Base

connection = context.config.attributes["connection"]
context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    render_as_batch=connection.dialect.name == "sqlite",
    transaction_per_migration=False,
)
with context.begin_transaction():
    context.run_migrations()
