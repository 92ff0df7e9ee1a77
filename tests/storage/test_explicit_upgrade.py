"""Issue 44 item 6: a database is migrated on open only where that is the opener's to do.

An empty database gets the schema on both backends (``test_migrations.py``'s
``test_migrations_build_exactly_the_models``); a SQLite file at an older revision backs
itself up and migrates; a shared PostgreSQL database at an older revision is refused with
one line naming ``python -m engine db upgrade --db URL``, which backs it up and migrates it;
a newer schema is refused naming the fix (upgrade BASIS Lab)."""

from __future__ import annotations

import sqlite3
import subprocess
import sys

import pytest
import sqlalchemy as sa
from sqlalchemy import inspect

from engine.cli.main import main
from storage import RunStore, head_revision, masked_url, schema_revision
from storage.errors import SchemaBehindError, SchemaNewerError, StorageError
from storage.upgrade import schema_status, upgrade
from tests.storage.test_migration_0014 import _database_at_0013
from tests.support.sqlite import sqlite_url


def _state(url: str) -> tuple[str, list[str], int]:
    """The revision, run_logs' columns and the number of runs, read on a plain engine."""
    eng = sa.create_engine(url)
    try:
        with eng.connect() as con:
            revision = con.execute(sa.text("SELECT version_num FROM alembic_version")).scalar_one()
            columns = [c["name"] for c in inspect(con).get_columns("run_logs")]
            runs = con.execute(sa.text("SELECT count(*) FROM runs")).scalar_one()
    finally:
        eng.dispose()
    return revision, columns, runs


def test_an_older_postgresql_database_is_refused_on_open_and_nothing_is_written(pg_url, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _database_at_0013(pg_url)
    before = _state(pg_url)
    assert before[0] == "0013" and "source" not in before[1] and before[2] == 2
    with pytest.raises(SchemaBehindError) as info:
        RunStore(pg_url)
    message = str(info.value)
    assert "\n" not in message and "schema revision 0013, older than this BASIS Lab's 0014" in message
    assert f"`python -m engine db upgrade --db {masked_url(pg_url)}`" in message and "nothing was written" in message
    assert _state(pg_url) == before and list(tmp_path.iterdir()) == []  # no backup, no change
    assert schema_status(pg_url).state == "behind"


def test_engine_db_upgrade_backs_up_then_migrates_a_postgresql_database(pg_url, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    _database_at_0013(pg_url)
    assert main(["db", "current", "--db", pg_url]) == 0
    assert "schema revision 0013, behind this BASIS Lab's 0014: run `python -m engine db upgrade" in capsys.readouterr().out

    out = tmp_path / "taken" / "before.dump"
    out.parent.mkdir()
    out.write_bytes(b"mine")
    assert main(["db", "upgrade", "--db", pg_url, "--backup", str(out)]) == 2  # an existing file needs --force
    assert "--force" in capsys.readouterr().err and out.read_bytes() == b"mine" and _state(pg_url)[0] == "0013"

    assert main(["db", "upgrade", "--db", pg_url]) == 0
    printed = capsys.readouterr().out
    dumps = list(tmp_path.glob("*.before-0014.dump"))
    assert len(dumps) == 1 and dumps[0].read_bytes()[:5] == b"PGDMP"  # pg_dump's custom format
    assert f"upgraded from schema revision 0013 to 0014; backup: {dumps[0]}" in printed
    revision, columns, runs = _state(pg_url)
    assert (revision, "source" in columns, runs) == (head_revision(), True, 2)
    store = RunStore(pg_url)  # now opens
    assert sorted(r.name for r in store.runs.list_runs()) == ["r1", "r2"]
    store.close()
    assert main(["db", "current", "--db", pg_url]) == 0 and "current" in capsys.readouterr().out
    assert upgrade(pg_url).describe() == f"already at schema revision {head_revision()}; nothing to do"


def test_a_sqlite_file_still_migrates_itself_after_backing_up_beside_it(tmp_path):
    url = sqlite_url(tmp_path)
    _database_at_0013(url)
    store = RunStore(url)
    assert schema_revision(store.engine) == head_revision() and len(store.runs.list_runs()) == 2
    store.close()
    kept = tmp_path / f"lab.db.before-{head_revision()}.db"
    with sqlite3.connect(kept) as con:
        assert con.execute("SELECT version_num FROM alembic_version").fetchall() == [("0013",)]
        assert con.execute("SELECT count(*) FROM runs").fetchone() == (2,)
    con.close()


def test_a_failed_automatic_migration_removes_its_backup(tmp_path):
    url = sqlite_url(tmp_path)
    _database_at_0013(url)
    with sqlite3.connect(tmp_path / "lab.db") as con:  # what revision 0014 adds, there already: its upgrade fails
        con.execute("ALTER TABLE run_logs ADD COLUMN source VARCHAR(100)")
    con.close()
    with pytest.raises(StorageError, match="from schema revision 0013 to 0014 failed"):
        RunStore(url)
    assert sorted(p.name for p in tmp_path.iterdir() if "before" in p.name) == []
    assert _state(url)[0] == "0013"


def test_a_newer_schema_is_refused_naming_the_fix_on_open_and_by_db_upgrade(db_url, capsys):
    eng = sa.create_engine(db_url)
    with eng.begin() as con:
        con.execute(sa.text("UPDATE alembic_version SET version_num = '9999_newer'"))
    eng.dispose()
    with pytest.raises(SchemaNewerError, match="newer than this BASIS Lab .*nothing was written: upgrade BASIS Lab"):
        RunStore(db_url)
    assert main(["db", "upgrade", "--db", db_url, "--no-backup"]) == 2
    assert "upgrade BASIS Lab" in capsys.readouterr().err
    assert main(["db", "current", "--db", db_url]) == 0
    assert "9999_newer, newer than this BASIS Lab's" in capsys.readouterr().out
    assert _state(db_url)[0] == "9999_newer"


def test_the_cli_refuses_an_older_postgresql_database_in_one_line(pg_url, tmp_path):
    """What a user of a shared database sees after someone upgraded BASIS Lab: exit 2, one line."""
    _database_at_0013(pg_url)
    done = subprocess.run([sys.executable, "-m", "engine", "list", "--db", pg_url], capture_output=True, text=True,
                          cwd=tmp_path, timeout=600)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: database ")
    assert "older than this BASIS Lab's 0014" in lines[0] and "python -m engine db upgrade --db" in lines[0]
    assert _state(pg_url)[0] == "0013" and list(tmp_path.iterdir()) == []


def test_the_dashboard_shows_the_same_line_for_an_older_postgresql_database(pg_url, monkeypatch):
    from app import state
    from tests.support.pages import app

    _database_at_0013(pg_url)
    monkeypatch.setenv("BASIS_LAB_DB_URL", pg_url)
    try:
        at = app().run()
    finally:
        state._lab.clear()
    errors = [e.value.replace("\\", "") for e in at.error]
    assert not at.exception and len(errors) == 1 and "\n" not in errors[0]
    assert errors[0].startswith("The database cannot be opened: database ")
    assert "older than this BASIS Lab's 0014" in errors[0] and "python -m engine db upgrade --db" in errors[0]
    assert _state(pg_url)[0] == "0013"
