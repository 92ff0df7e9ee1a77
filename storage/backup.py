"""A consistent copy of the whole database, taken while runs keep writing to it.

Copying the ``.db`` file alone is not a backup: in WAL mode the newest transactions live
in ``lab.db-wal`` until a checkpoint moves them over, and a copy taken mid-write may be
torn.  :func:`backup` uses what each backend offers for this:

- SQLite: the online backup API (``sqlite3.Connection.backup``), in one step, so it reads
  one snapshot (WAL readers never block writers, nor writers them).  The copy is one
  self-contained file in rollback-journal mode, checked with ``PRAGMA quick_check``; open it
  with ``--db OUT`` or put it in place of the database to restore it.
- PostgreSQL: ``pg_dump --format=custom`` (one snapshot of the database); restore it with
  ``pg_restore --dbname URL OUT`` into an empty database.  Where ``pg_dump`` is not
  installed the error says how to get it.

A copy is a database of its own: it leaves out its original's identity
(``models.DatabaseIdentity``; the PostgreSQL dump holds that table empty) and makes its
own at its first use, keeping the original's in its lineage, so it reads the checkpoints
its runs had when it was taken but never deletes or prunes what its original owns.

The copy is written beside ``out`` under a temporary name and renamed into place once it is
complete, so a failed backup leaves no partial file; ``out`` is never the database itself,
nor anything but a regular file (a device, a FIFO, a socket: ``storage.outputs``).
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import sqlite3
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from sqlalchemy.engine import URL

from .errors import StorageError
from .models import DatabaseIdentity
from .outputs import OutputExistsError, refuse_special

__all__ = ["Backup", "backup", "backup_url", "backup_bytes", "pg_dump_path"]


@dataclass(frozen=True)
class Backup:
    """What :func:`backup` wrote: the file, its size, the backend and how many runs it holds
    (None for a PostgreSQL dump, which is not read back)."""

    path: Path
    size: int
    backend: str
    runs: Optional[int]

    def describe(self) -> str:
        held = f"{self.runs} run(s), " if self.runs is not None else ""
        kind = "SQLite database" if self.backend == "sqlite" else "pg_dump archive (restore with pg_restore)"
        return f"{held}{self.size / 2**20:.2f} MiB {kind}"


def pg_dump_path() -> Optional[str]:
    """``pg_dump`` on the PATH, else the newest under ``/usr/lib/postgresql/*/bin``, else None."""
    found = shutil.which("pg_dump")
    if found:
        return found
    def major(path: str) -> int:
        version = Path(path).parts[-3]
        return int(version) if version.isdigit() else 0

    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_dump"), key=major)
    return candidates[-1] if candidates else None


def backup(store, out: str | os.PathLike, *, force: bool = False) -> Backup:
    """Write a consistent copy of ``store``'s database (a :class:`storage.RunStore`) to
    ``out``: :func:`backup_url` of its URL."""
    return backup_url(store.engine.url, out, force=force)


def backup_url(url: URL, out: str | os.PathLike, *, force: bool = False) -> Backup:
    """Write a consistent copy of the database at ``url`` (at any schema revision: the
    migrations back up the revision they leave) to ``out``; refuses an existing ``out``
    unless ``force``.  Raises :class:`StorageError` with the fix. ``out`` must not name
    anything but a regular file (a device, a FIFO, a socket: ``storage.outputs``), ``force``
    or not: checked before the copy and again just before it is renamed into place."""
    out = Path(out).expanduser().absolute()
    backend = url.get_backend_name()
    if out.is_dir():
        raise StorageError(f"{out} is a directory; name the backup file to write, e.g. {out / 'basis-lab-backup.db'}")
    if not out.parent.is_dir():
        raise StorageError(f"cannot write {out}: its directory does not exist; create it or choose another path")
    if backend == "sqlite":
        source = Path(url.database or "")
        if not url.database or url.database == ":memory:":
            raise StorageError("an in-memory database cannot be backed up; use a SQLite file or PostgreSQL")
        if out in {source.absolute(), Path(f"{source}-wal").absolute(), Path(f"{source}-shm").absolute()}:
            raise StorageError(f"{out} is the database itself; write the backup to another file")
    elif backend != "postgresql":
        raise StorageError(f"cannot back up a {backend} database; BASIS Lab backs up SQLite and PostgreSQL")
    refuse_special(out)
    if out.exists() and not force:
        raise OutputExistsError(str(out))
    fd, tmp_name = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        runs: Optional[int] = None
        if backend == "sqlite":
            runs = _sqlite_backup(source, tmp)
        else:
            _pg_dump(url, tmp)
        refuse_special(out)  # made while the copy was taken
        os.replace(tmp, out)
    except OSError as e:
        raise StorageError(f"cannot write the backup {out} ({e.strerror or e}); check the disk space and "
                           "permissions, or choose another path") from e
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    return Backup(out, out.stat().st_size, backend, runs)


def backup_bytes(store) -> tuple[bytes, str]:
    """The backup as bytes and its file name (``.db`` or ``.dump``): the dashboard's download."""
    suffix = ".db" if store.engine.url.get_backend_name() == "sqlite" else ".dump"
    with tempfile.TemporaryDirectory(prefix="basis-lab-backup-") as work:
        done = backup(store, Path(work) / f"basis-lab-backup{suffix}")
        return done.path.read_bytes(), done.path.name


def _sqlite_backup(source: Path, target: Path) -> int:
    """Copy the SQLite database at ``source`` (with its WAL) into ``target``; the runs it holds."""
    try:
        src = sqlite3.connect(source, timeout=30)  # only reads; read-write so it may use the WAL's -shm
    except sqlite3.Error as e:
        raise StorageError(f"cannot read the database {source} ({e}); check the path and its permissions") from e
    try:
        dst = sqlite3.connect(target)
        try:
            src.backup(dst)  # one step: one consistent snapshot, the WAL's transactions included
            dst.execute("PRAGMA journal_mode = DELETE")  # one self-contained file
            tables = {row[0] for row in dst.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if DatabaseIdentity.__tablename__ in tables:  # (a schema before revision 0006 has none)
                dst.execute(f"DELETE FROM {DatabaseIdentity.__tablename__}")  # the copy makes its own
            check = dst.execute("PRAGMA quick_check").fetchone()[0]
            if check != "ok":
                raise StorageError(f"the backup of {source} failed its integrity check ({check}); try again")
            runs = dst.execute("SELECT count(*) FROM runs").fetchone()[0] if "runs" in tables else 0
            dst.commit()
        finally:
            dst.close()
    except sqlite3.Error as e:
        raise StorageError(f"backing up {source} failed ({e}); nothing was written, try again") from e
    finally:
        src.close()
    return int(runs)


def _pg_dump(url: URL, target: Path) -> None:
    """``pg_dump`` the PostgreSQL database at ``url`` into ``target`` (custom format)."""
    tool = pg_dump_path()
    if tool is None:
        raise StorageError("pg_dump is not installed, and PostgreSQL is backed up with it: install the PostgreSQL "
                           "client tools (Debian/Ubuntu: apt install postgresql-client; macOS: brew install libpq) "
                           "of the server's major version or newer")
    env = dict(os.environ)
    in_query = url.query.get("password")  # ?password= is libpq's too: kept off the command line the same way
    given = (in_query,) if isinstance(in_query, str) else tuple(in_query or ())
    password = url.password or (given[-1] if given else None)
    if password:
        env["PGPASSWORD"] = str(password)  # not on the command line, where any user could read it
    libpq = url.set(drivername="postgresql", password=None).difference_update_query(["password"])
    cmd = [tool, "--format=custom", "--no-owner", f"--file={target}",
           f"--exclude-table-data={DatabaseIdentity.__tablename__}",  # the copy makes its own
           f"--dbname={libpq.render_as_string(hide_password=False)}"]
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=24 * 3600)
    except (OSError, subprocess.SubprocessError) as e:
        raise StorageError(f"pg_dump could not run ({e}); check the PostgreSQL client installation") from e
    if done.returncode != 0:
        reason = next((line for line in done.stderr.splitlines() if line.strip()), f"exit status {done.returncode}")
        hint = ("use a pg_dump of the server's major version or newer" if "version mismatch" in reason
                else "check the database URL and that this user may read every table")
        raise StorageError(f"pg_dump failed ({reason.strip()}); {hint}")
    return None
