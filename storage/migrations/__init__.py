"""Alembic environment of the BASIS Lab schema (see :mod:`storage.db`); no alembic.ini needed."""
