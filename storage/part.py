"""What each part of :class:`storage.store.RunStore` (the ``*Mixin`` classes) uses from the store.

Declarations only, for the type checker: ``RunStore`` defines them.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Callable

from sqlalchemy.orm import Session


class StorePart:
    """``_session(write=False)``: a short session in one transaction (on the write engine when
    ``write``); ``_pg``: whether the database is PostgreSQL."""

    _session: Callable[..., AbstractContextManager[Session]]
    _pg: bool
