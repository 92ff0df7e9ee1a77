"""Saved Compare views: a name and the view's URL query (``ViewsRepository.views.save_view``).

The repository ``store.views`` of :class:`storage.store.RunStore`, over its :class:`storage.database.Database`."""

from __future__ import annotations

from typing import Any, Mapping

from sqlalchemy import delete, select

from .database import Repository
from .db import rowcount
from .errors import InvalidValueError, StorageError
from .limits import check_utf8
from .models import SavedView, utcnow
from .records import json_normal

MAX_VIEW_NAME = 200


class ViewsRepository(Repository):
    """Named Compare views shared by everyone using the database."""

    def save_view(self, name: str, state: Mapping[str, Any]) -> None:
        """Store the view ``state`` (its URL query as a mapping of strings) under ``name``,
        replacing a view of that name."""
        name = (name or "").strip()
        if not name or len(name) > MAX_VIEW_NAME:
            raise InvalidValueError(f"a view name must be 1 to {MAX_VIEW_NAME} characters (got {len(name)})")
        check_utf8("view name", name)
        normal: dict[str, str] = json_normal({str(k): str(v) for k, v in dict(state).items()}, "view state")
        now = utcnow()
        with self.db.session(write=True) as s:
            view = s.execute(select(SavedView).where(SavedView.name == name).with_for_update()).scalar()
            if view is None:
                s.add(SavedView(name=name, state=normal, created_at=now, updated_at=now))
            else:
                view.state, view.updated_at = normal, now

    def saved_views(self) -> dict[str, dict[str, str]]:
        """Every saved view, name → state, most recently saved first."""
        with self.db.session() as s:
            rows = s.execute(select(SavedView.name, SavedView.state).order_by(SavedView.updated_at.desc(),
                                                                              SavedView.id.desc())).all()
        return {name: dict(state or {}) for name, state in rows}

    def delete_view(self, name: str) -> None:
        with self.db.session(write=True) as s:
            if rowcount(s.execute(delete(SavedView.__table__).where(SavedView.__table__.c.name == name))) != 1:
                raise StorageError(f"no saved view named {name!r}")
