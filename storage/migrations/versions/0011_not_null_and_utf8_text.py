"""Every column the models declare NOT NULL is NOT NULL; stored text UTF-8 cannot encode is repaired.

* NOT NULL: revisions 0001 to 0005 created the 24 columns of ``NOT_NULL`` nullable, though
  ``models.py`` declares them NOT NULL, so a NULL there (a metric without a step or run)
  broke every reader.  They become NOT NULL: PostgreSQL alters them in place; SQLite's
  tables are rebuilt (batch mode) keeping every row and id, and the AUTOINCREMENT high-water
  marks in ``sqlite_sequence`` are put back (as revision 0003 did); their ``id`` is declared
  NOT NULL too (a ``runs`` table written before versioning, ``id INTEGER PRIMARY KEY``, read
  as nullable though a rowid never is NULL).  A NULL stored there is
  - given the value the readers already showed for it, where there is one (``NEUTRAL``: a
    run's name ``run-<id>``, status ``finished``, empty config, versions, notes and tags,
    0 steps done and history version, no cancel request; a diagnosis's empty settings and
    notes; a report's empty selection and run list; a worker ``stopped``; a new random uid),
    as revision 0001 did for runs written before versioning;
  - refused elsewhere (``REFUSED``: a metric's run, step, wall time or name, a diagnosis's
    run or status, a diagnosis result's diagnosis): the upgrade stops with one line naming
    each such column, its rows, and the fix (delete those rows, the ``DELETE`` statement
    given, or restore a backup), and changes nothing.
* UTF-8: a version before the UTF-8 check (``storage.limits.check_utf8``) stored text that
  UTF-8 cannot encode: a lone surrogate escaped in JSON (tags ``["pilot", "t\\udcfe"]``, a
  config, a saved view; ``JSON_TEXT``), or, in SQLite, bytes that are not UTF-8 in a text
  column (``TEXT``, and ``JSON_TEXT``; PostgreSQL's text is always UTF-8).  Each such
  character is stored as its visible escape: the lone surrogate U+DCFE (how Python reads an
  undecodable byte 0xfe) and the byte 0xfe itself both become the six characters
  ``\\udcfe``.  Chosen over U+FFFD, as it keeps which byte it was, is what
  ``storage.limits.as_utf8`` writes and the readers show, and can be typed to edit it
  (``engine tag RUN --remove 't\\udcfe'``).  Text that is UTF-8 is not touched.  A run whose
  text (or log) was repaired gets a line in its notes saying so (``NOTE``), a diagnosis in its
  own notes; a report or a saved view has no notes.

Revision ID: 0011
Revises: 0010
"""

import json
import uuid

import sqlalchemy as sa
from alembic import op

from storage.db import masked_url
from storage.errors import StorageError
from storage.schema_check import mismatch_error, missing_columns

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

NOT_NULL = {
    "runs": ("uid", "name", "status", "config", "steps_done", "notes", "versions", "cancel_requested", "tags",
             "history_version"),
    "metrics": ("run_id", "step", "wall_time", "name"),
    "diagnostics": ("uid", "run_id", "status", "settings", "notes"),
    "diagnostic_results": ("diagnostic_id",),
    "reports": ("uid", "selection", "run_ids"),
    "workers": ("status",),
}
AUTOINCREMENT = ("runs", "metrics", "diagnostics", "diagnostic_results", "reports")
NEW_UID = "new uid"  # NEUTRAL's value for a uid: a new random one per row
NEUTRAL = {
    ("runs", "uid"): NEW_UID, ("runs", "status"): "finished", ("runs", "config"): {}, ("runs", "steps_done"): 0,
    ("runs", "notes"): "", ("runs", "versions"): {}, ("runs", "cancel_requested"): False, ("runs", "tags"): [],
    ("runs", "history_version"): 0, ("diagnostics", "uid"): NEW_UID, ("diagnostics", "settings"): {},
    ("diagnostics", "notes"): "", ("reports", "uid"): NEW_UID, ("reports", "selection"): {},
    ("reports", "run_ids"): [], ("workers", "status"): "stopped",
}  # and ("runs", "name"): "run-<id>"
REFUSED = [(t, c) for t, cols in NOT_NULL.items() for c in cols if (t, c) not in NEUTRAL and (t, c) != ("runs", "name")]

TEXT = {
    "runs": ("name", "notes", "error", "sweep_id", "estimator", "preset"),
    "diagnostics": ("notes", "error"),
    "reports": ("title", "key", "sweep_id"),
    "saved_views": ("name",),
    "run_logs": ("text",),
}
JSON_TEXT = {
    "runs": ("tags", "config", "versions"),
    "diagnostics": ("settings",),
    "reports": ("selection", "content"),  # content: a report as JSON, in a text column
    "saved_views": ("state",),
}
NOTE = ("[upgrade 0011] text stored before the UTF-8 check was repaired ({}): each character UTF-8 could not "
        "encode is now written as its escape, e.g. \\udcfe for the byte 0xfe")
NOTES_MAX = 10_000  # storage.limits.NOTES_MAX at this revision: notes keep their newest characters


def upgrade() -> None:
    conn = op.get_bind()
    _require_columns(conn)
    _refuse_nulls(conn)
    _fill_nulls(conn)
    repaired: dict[tuple[str, int], list[str]] = {}
    if conn.dialect.name == "sqlite":
        for table, columns in _merged(TEXT, JSON_TEXT).items():
            for column in columns:
                _note(conn, repaired, table, column, _repair_bytes(conn, table, column))
    for table, columns in JSON_TEXT.items():
        for column in columns:
            _note(conn, repaired, table, column, _repair_json(conn, table, column))
    _append_notes(conn, repaired)
    _set_not_null(conn)


def _merged(*maps: dict[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
    out: dict[str, tuple[str, ...]] = {}
    for m in maps:
        for table, columns in m.items():
            out[table] = out.get(table, ()) + tuple(c for c in columns if c not in out.get(table, ()))
    return out


def _require_columns(conn: sa.Connection) -> None:
    """Refuse (touching nothing) a database that lacks a column this revision reads."""
    wanted = {t: ("id", *cols) for t, cols in _merged(NOT_NULL, TEXT, JSON_TEXT).items()}
    wanted["run_logs"] = (*wanted["run_logs"], "run_id")
    missing = missing_columns(conn, wanted)
    if missing:
        raise mismatch_error(masked_url(conn.engine.url), f"{down_revision} (upgrading here to {revision})", missing)


def _null_counts(conn: sa.Connection, table: str, columns: tuple[str, ...]) -> dict[str, int]:
    t = sa.table(table, *(sa.column(c) for c in columns))
    row = conn.execute(sa.select(*(sa.func.sum(sa.case((t.c[c].is_(None), 1), else_=0)) for c in columns))).one()
    return {c: int(n or 0) for c, n in zip(columns, row)}


def _refuse_nulls(conn: sa.Connection) -> None:
    """One line naming every REFUSED column holding NULL, and the statements that delete those rows."""
    found: dict[str, list[tuple[str, int]]] = {}
    for table in dict.fromkeys(t for t, _ in REFUSED):
        columns = tuple(c for t, c in REFUSED if t == table)
        found[table] = [(c, n) for c, n in _null_counts(conn, table, columns).items() if n]
    found = {t: cols for t, cols in found.items() if cols}
    if not found:
        return
    where = ", ".join(f"{t}.{c} in {n} row{'s' * (n != 1)}" for t, cols in found.items() for c, n in cols)
    delete = " ".join(f"DELETE FROM {t} WHERE {' OR '.join(f'{c} IS NULL' for c, _ in cols)};"
                      for t, cols in found.items())
    raise StorageError(
        f"cannot upgrade database {masked_url(conn.engine.url)} to schema revision {revision}: a value is required "
        f"but missing (NULL) in {where}; nothing was changed: delete those rows ({delete}) or restore a backup, "
        "then open it again")


def _fill_nulls(conn: sa.Connection) -> None:
    """Every NULL of a NEUTRAL column gets its neutral value (a run's name: ``run-<id>``)."""
    runs = sa.table("runs", sa.column("id", sa.Integer), sa.column("name", sa.String))
    conn.execute(sa.update(runs).where(runs.c.name.is_(None))
                 .values(name=sa.literal("run-") + sa.cast(runs.c.id, sa.String)))
    for (table, column), value in NEUTRAL.items():
        if value == NEW_UID:
            t = sa.table(table, sa.column("id", sa.Integer), sa.column(column, sa.String))
            ids = conn.execute(sa.select(t.c.id).where(t.c[column].is_(None))).scalars().all()
            if ids:
                conn.execute(sa.update(t).where(t.c.id == sa.bindparam("rid")).values({column: sa.bindparam("uid")}),
                             [{"rid": rid, "uid": uuid.uuid4().hex} for rid in ids])
            continue
        kind = sa.JSON if isinstance(value, (dict, list)) else sa.Boolean if isinstance(value, bool) else None
        t = sa.table(table, sa.column(column, kind))
        conn.execute(sa.update(t).where(t.c[column].is_(None)).values({column: value}))


def _escaped(value):
    """``value`` (JSON) with every string UTF-8 cannot encode holding its escapes instead."""
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {_escaped(k): _escaped(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_escaped(v) for v in value]
    return value


def _not_utf8(raw) -> int:
    try:
        bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        return 1
    return 0


def _repair_bytes(conn: sa.Connection, table: str, column: str) -> list[int]:
    """SQLite: each value of ``table.column`` that is not UTF-8 text (bytes that are not
    UTF-8, or a blob) stored as UTF-8 text with each undecodable byte escaped; the ids repaired."""
    raw = conn.connection.dbapi_connection
    raw.create_function("basis_0011_not_utf8", 1, _not_utf8, deterministic=True)
    q = conn.dialect.identifier_preparer.quote
    t, c = q(table), q(column)
    rows = conn.exec_driver_sql(
        f"SELECT id, CAST({c} AS BLOB) FROM {t} WHERE typeof({c}) = 'blob' "
        f"OR (typeof({c}) = 'text' AND basis_0011_not_utf8(CAST({c} AS BLOB)))").all()
    for rid, value in rows:
        text = bytes(value).decode("utf-8", "surrogateescape").encode("utf-8", "backslashreplace").decode("utf-8")
        conn.exec_driver_sql(f"UPDATE {t} SET {c} = ? WHERE id = ?", (text, rid))
    return [int(rid) for rid, _ in rows]


def _repair_json(conn: sa.Connection, table: str, column: str) -> list[int]:
    """Each JSON value of ``table.column`` holding a string UTF-8 cannot encode (a lone
    surrogate, escaped in the text) stored with that string escaped; the ids repaired."""
    t = sa.table(table, sa.column("id", sa.Integer), sa.column(column, sa.Text if column == "content" else sa.JSON))
    text = sa.cast(t.c[column], sa.Text)
    rows = conn.execute(sa.select(t.c.id, text).select_from(t)
                        .where(sa.func.lower(text).like("%\\ud%", escape="!"))).all()
    repaired = []
    for rid, stored in rows:
        try:
            value = json.loads(stored)
        except ValueError:
            continue  # not JSON: nothing a reader could decode either
        fixed = _escaped(value)
        if fixed == value:
            continue
        if column == "tags" and isinstance(fixed, list):
            fixed = list(dict.fromkeys(fixed))  # two tags may now be spelt alike
        conn.execute(sa.update(t).where(t.c.id == rid).values({column: json.dumps(fixed) if column == "content"
                                                               else fixed}))
        repaired.append(int(rid))
    return repaired


def _note(conn: sa.Connection, repaired: dict[tuple[str, int], list[str]], table: str, column: str,
          ids: list[int]) -> None:
    """Record which rows of which run (or diagnosis) ``ids`` of ``table.column`` repaired."""
    if not ids:
        return
    if table == "run_logs":
        owner, name = "runs", "log"
        logs = sa.table("run_logs", sa.column("id", sa.Integer), sa.column("run_id", sa.Integer))
        ids = sorted(set(conn.execute(sa.select(logs.c.run_id).where(logs.c.id.in_(ids))).scalars()))
    elif table in ("runs", "diagnostics"):
        owner, name = table, column
    else:
        return  # a report or a saved view: no notes to tell
    for rid in ids:
        columns = repaired.setdefault((owner, rid), [])
        if name not in columns:
            columns.append(name)


def _append_notes(conn: sa.Connection, repaired: dict[tuple[str, int], list[str]]) -> None:
    """Append NOTE, naming what was repaired, to the notes of each run and diagnosis repaired."""
    for (table, rid), columns in repaired.items():
        t = sa.table(table, sa.column("id", sa.Integer), sa.column("notes", sa.Text))
        notes = conn.execute(sa.select(t.c.notes).where(t.c.id == rid)).scalar() or ""
        line = NOTE.format(", ".join(columns))
        notes = f"{notes}\n{line}" if notes else line
        if len(notes) > NOTES_MAX:
            notes = "…" + notes[len(notes) - NOTES_MAX + 1:]
        conn.execute(sa.update(t).where(t.c.id == rid).values(notes=notes))


def _set_not_null(conn: sa.Connection) -> None:
    """NOT NULL on every column of NOT_NULL (SQLite: each table rebuilt, ids never reused)."""
    if conn.dialect.name != "sqlite":
        for table, columns in NOT_NULL.items():
            for column in columns:
                op.alter_column(table, column, nullable=False)
        return
    high = dict(conn.exec_driver_sql("SELECT name, seq FROM sqlite_sequence").all())
    for table, columns in NOT_NULL.items():
        kwargs = {"sqlite_autoincrement": True} if table in AUTOINCREMENT else {}
        with op.batch_alter_table(table, recreate="always", table_kwargs=kwargs) as batch:
            for column in ("id", *columns):  # id: a table from before versioning left out its NOT NULL
                batch.alter_column(column, nullable=False)
    for table, seq in high.items():
        if table not in AUTOINCREMENT:
            continue
        if conn.exec_driver_sql("SELECT 1 FROM sqlite_sequence WHERE name = ?", (table,)).first() is None:
            conn.exec_driver_sql("INSERT INTO sqlite_sequence (name, seq) VALUES (?, ?)", (table, seq))
        else:
            conn.exec_driver_sql("UPDATE sqlite_sequence SET seq = max(seq, ?) WHERE name = ?", (seq, table))


def downgrade() -> None:
    raise NotImplementedError("BASIS Lab never downgrades a database; restore a backup instead")
