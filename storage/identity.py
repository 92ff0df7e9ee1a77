"""A database's identity and the identities its contents had before it was copied.

The repository ``store.identities`` of :class:`storage.store.RunStore`: ``models.DatabaseIdentity``
holds this database's uid, ``models.DatabaseLineage`` every uid its contents have had; a
backup's first use gives it its own (see :meth:`IdentityRepository.identities.identity`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from sqlalchemy import insert, select

from .database import Database, Repository
from .errors import StorageError
from .models import DatabaseIdentity, DatabaseLineage, new_uid


@dataclass(frozen=True)
class Identity:
    """A database's identity: ``uid``, its own, and ``lineage``, every identity its
    contents have had, oldest first, ``uid`` last (a database never copied: ``(uid,)``)."""

    uid: str
    lineage: tuple[str, ...]

    @property
    def ancestors(self) -> tuple[str, ...]:
        """The databases this one was copied from, the nearest first."""
        return tuple(reversed(self.lineage[:-1]))


class IdentityRepository(Repository):
    """This database's :class:`Identity`, read once and then kept."""

    def __init__(self, db: Database):
        super().__init__(db)
        self.known: Optional[Identity] = None

    def identity(self) -> Identity:
        """This database's :class:`Identity`. A database without one (a backup, which
        leaves its original's out) gets a new one now, appended to the lineage it was
        copied with; processes that ask at once agree on one."""
        if self.known is None:
            self.known = self.read() or self._make()
        return self.known

    def read(self) -> Optional[Identity]:
        """The stored identity, or None when the database has none yet."""
        with self.db.session() as s:
            uid = s.execute(select(DatabaseIdentity.uid).where(DatabaseIdentity.id == 1)).scalar()
            lineage = s.execute(select(DatabaseLineage.uid).order_by(DatabaseLineage.id)).scalars().all()
        if uid is None:
            return None
        return Identity(uid, tuple(u for u in lineage if u != uid) + (uid,))

    def _make(self) -> Identity:
        try:
            with self.db.session(write=True) as s:
                if s.execute(select(DatabaseIdentity.id).where(DatabaseIdentity.id == 1).with_for_update()).first() is None:
                    uid = new_uid()
                    s.execute(insert(DatabaseIdentity), [{"id": 1, "uid": uid}])
                    s.execute(insert(DatabaseLineage), [{"uid": uid}])
        except StorageError:
            if self.read() is None:  # not another process that made it first
                raise
        found = self.read()
        if found is None:
            raise StorageError(f"the identity of {self.db.url} could not be stored; check that the database is writable")
        return found
