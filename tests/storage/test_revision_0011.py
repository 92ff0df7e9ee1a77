"""Revision 0011 (issue 42): text stored before the UTF-8 check is repaired (and read escaped
where it was not), the NOT NULLs the models declare hold in the database, and a NULL
without a neutral value refuses the upgrade in one line, changing nothing.

Each test runs on SQLite and on a throwaway PostgreSQL (``empty_db_url``, ``db_url``)
but the one about bytes that are not UTF-8 in a text column, which only SQLite can hold."""

from __future__ import annotations

import json
import sqlite3

import pandas as pd
import pytest
import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy import inspect, text

from engine.cli.main import main
from engine.runner.tags import edit_tags
from storage import RunStore, StorageError, head_revision, schema_revision
from tests.storage.test_migrations import _at_revision, _migrated

RUN = ("INSERT INTO runs (uid, name, status, config, tags, notes, versions, steps_done, history_version, epoch, "
       "cancel_requested, estimator, lam, seed, preset, steps) VALUES (:uid, :name, 'finished', {config}, {tags}, "
       ":notes, '{{}}', 0, 0, 0, false, 'exact', 0.0, 0, 'tiny', 10)")
# JSON as a version before the UTF-8 check stored it: json.dumps escapes the lone surrogate (byte 0xfe)
BAD_TAGS, BAD_CONFIG = '\'["pilot", "t\\udcfe"]\'', '\'{"x": "c\\udcfe", "model": {"width": 16}}\''


def _encodable(value) -> bool:
    return json.dumps(value, ensure_ascii=False).encode("utf-8", "strict") is not None


def _raw(url, sql):
    """Rows of ``sql`` on a plain engine (no BASIS Lab hooks, no upgrade)."""
    eng = sa.create_engine(url)
    with eng.connect() as con:
        rows = con.execute(text(sql)).all()
    eng.dispose()
    return rows


def _old_database(url):
    """A 0010 database holding what a version before the UTF-8 check stored: a run's tags and
    config, a saved view's state, a report's content and a diagnosis's settings with lone surrogates."""
    eng = _at_revision(url, "0010")
    with eng.begin() as con:
        con.execute(text(RUN.format(config=BAD_CONFIG, tags=BAD_TAGS)), {"uid": "a" * 32, "name": "bad", "notes": "mine"})
        con.execute(text(RUN.format(config="'{}'", tags="'[\"clean\"]'")), {"uid": "b" * 32, "name": "good", "notes": ""})
        con.execute(text("INSERT INTO metrics (run_id, step, wall_time, name, value) VALUES (1, 0, 0.0, 'val_loss', 2.5)"))
        con.execute(text("INSERT INTO saved_views (name, state) VALUES ('v', '{\"runs\": \"1\", \"q\": \"w\\udcfe\"}')"))
        con.execute(text("INSERT INTO reports (uid, title, selection, run_ids, content) VALUES "
                         "(:uid, 'r', '{\"tags\": [\"t\\udcfe\"]}', '[1]', '{\"title\": \"t\\udcfe\"}')"), {"uid": "c" * 32})
        con.execute(text("INSERT INTO diagnostics (uid, run_id, status, settings, notes, cancel_requested) VALUES "
                         "(:uid, 1, 'finished', '{\"layers\": \"l\\udcfe\"}', '', false)"), {"uid": "d" * 32})
    eng.dispose()


def test_text_stored_before_the_utf8_check_is_repaired_and_every_command_reads_it(empty_db_url, tmp_path, capsys):
    """After the upgrade the lone surrogate is stored as its escape ``\\udcfe``, the run's notes
    say what was repaired, and list, show, export (both formats) and ``tag --remove`` (by the
    escaped form) succeed, with no traceback."""
    _old_database(empty_db_url)
    st = _migrated(empty_db_url)
    assert schema_revision(st.engine) == head_revision() == "0014"
    bad, good = st.runs.get_run(1), st.runs.get_run(2)
    assert bad.tags == ["pilot", "t\\udcfe"] and bad.config == {"x": "c\\udcfe", "model": {"width": 16}, "test_tokens": 0}
    assert bad.notes.startswith("mine\n[upgrade 0011] text stored before the UTF-8 check was repaired (tags, config)")
    assert (good.notes, good.tags) == ("", ["clean"])  # UTF-8 text is not touched
    stored = _raw(empty_db_url, "SELECT CAST(tags AS TEXT), CAST(config AS TEXT) FROM runs WHERE id = 1")[0]
    assert [json.loads(v) for v in stored] == [bad.tags, bad.config]  # repaired in the database, not just on read
    assert st.views.saved_views() == {"v": {"runs": "1", "q": "w\\udcfe"}}
    report = st.reports.get_report(1)
    assert json.loads(report.content) == {"title": "t\\udcfe"} and report.selection == {"tags": ["t\\udcfe"]}
    assert st.frames.diagnostics_frame()["settings"].tolist() == [{"layers": "l\\udcfe"}]
    assert st.frames.diagnostics_frame()["notes"].iloc[0].startswith("[upgrade 0011]")
    st.close()

    for args in (["list"], ["show", "1"], ["export", "--out", str(tmp_path / "long.csv")],
                 ["export", "--format", "wide", "--out", str(tmp_path / "wide.csv")]):
        assert main([*args, "--db", empty_db_url]) == 0, capsys.readouterr().err
    out, err = capsys.readouterr()
    assert "t\\udcfe" in out and "Traceback" not in err and "error" not in err
    long, wide = pd.read_csv(tmp_path / "long.csv"), pd.read_csv(tmp_path / "wide.csv")
    assert long.set_index("run_id").loc[1, "tags"] == "pilot, t\\udcfe"
    assert wide.set_index("run_id").loc[1, "config.x"] == "c\\udcfe"
    assert main(["tag", "--db", empty_db_url, "1", "--remove", "t\\udcfe"]) == 0
    assert capsys.readouterr() == ("run 1: tags pilot\n", "")


def test_bytes_that_are_not_utf8_in_sqlite_text_columns_are_repaired(tmp_path, capsys):
    """SQLite can hold bytes that are not UTF-8 in a text column (written by hand or by
    another tool, which Python's driver then refuses to read): the run's name and notes, a
    saved view's name, a report's title, a log line; the upgrade writes each such byte as
    its escape, and every reader then works."""
    url = f"sqlite:///{tmp_path / 'lab.db'}"
    _at_revision(url, "0010").dispose()
    with sqlite3.connect(tmp_path / "lab.db") as con:  # raw SQL, as the fault probe wrote it
        con.execute(RUN.replace(":uid", "'" + "a" * 32 + "'").replace(":name", "CAST(X'6EFE' AS TEXT)")
                    .replace(":notes", "CAST(X'6E6FFE74' AS TEXT)").format(config="'{}'", tags=BAD_TAGS))
        con.execute("INSERT INTO saved_views (name, state) VALUES (CAST(X'76FF' AS TEXT), '{}')")
        con.execute("INSERT INTO reports (uid, title, selection, run_ids, content) VALUES "
                    "('c', CAST(X'72C3' AS TEXT), '{}', '[]', '{}')")
        con.execute("INSERT INTO run_logs (run_id, time, level, text) VALUES (1, '2026-01-01 00:00:00', 'info', "
                    "X'6CFE')")  # a blob, not even text
    con.close()
    st = RunStore(url)
    run = st.runs.get_run(1)
    assert (run.name, run.tags) == ("n\\udcfe", ["pilot", "t\\udcfe"])
    assert run.notes == ("no\\udcfet\n[upgrade 0011] text stored before the UTF-8 check was repaired (name, notes, "
                         "log, tags): each character UTF-8 could not encode is now written as its escape, e.g. "
                         "\\udcfe for the byte 0xfe")
    assert list(st.views.saved_views()) == ["v\\udcff"] and st.reports.get_report(1).title == "r\\udcc3"
    assert [line.text for line in st.logs.run_logs(1)] == ["l\\udcfe"]
    st.close()
    assert main(["list", "--db", url]) == 0 and "n\\udcfe" in capsys.readouterr().out


def test_stored_json_that_escapes_a_lone_surrogate_is_read_escaped_without_the_upgrade(db_url, tmp_path):
    """Even a value the upgrade did not see (written into a database at the newest revision
    by hand) never raises: every reader shows its escape, and the tag can be removed by it."""
    st = RunStore(db_url)
    with st.engine.begin() as con:
        con.execute(text(RUN.format(config=BAD_CONFIG, tags=BAD_TAGS)), {"uid": "a" * 32, "name": "bad", "notes": ""})
        con.execute(text("INSERT INTO saved_views (name, state) VALUES ('v', '{\"q\": \"w\\udcfe\"}')"))
        con.execute(text("INSERT INTO reports (uid, title, selection, run_ids, content) VALUES "
                         "(:uid, 'r', '{}', '[]', '{\"title\": \"t\\udcfe\"}')"), {"uid": "c" * 32})
    run = st.runs.get_run(1)
    assert run.tags == ["pilot", "t\\udcfe"] and run.config["x"] == "c\\udcfe"
    assert all(_encodable(v) for v in (run.tags, run.config, st.views.saved_views(), st.reports.get_report(1).content))
    assert st.frames.runs_frame()["tags"].tolist() == [["pilot", "t\\udcfe"]]
    assert st.views.saved_views() == {"v": {"q": "w\\udcfe"}} and json.loads(st.reports.get_report(1).content) == {"title": "t\\udcfe"}
    assert main(["export", "--db", db_url, "--format", "wide", "--out", str(tmp_path / "w.csv")]) == 0
    assert edit_tags(st, 1, remove=["t\\udcfe"]) == ["pilot"]
    st.close()


def _with_nulls(url):
    """A 0010 database with a run whose notes, tags and steps done are NULL, a worker without
    a status, and a metric without a step and one without a run."""
    eng = _at_revision(url, "0010")
    with eng.begin() as con:
        con.execute(text("INSERT INTO runs (uid, name, status, config, versions, cancel_requested, history_version) "
                         "VALUES (:uid, 'kept', 'finished', '{}', '{}', false, 0)"), {"uid": "a" * 32})
        con.execute(text("INSERT INTO workers (id, host) VALUES ('w1', 'h')"))
        con.execute(text("INSERT INTO metrics (run_id, step, wall_time, name, value) VALUES "
                         "(1, 0, 0.0, 'val_loss', 2.0), (1, NULL, 0.0, 'val_loss', 3.0), (NULL, 1, 0.0, 'x', 4.0)"))
    eng.dispose()


def test_a_null_the_models_forbid_refuses_the_upgrade_in_one_line_changing_nothing(empty_db_url):
    """A metric without a step or run has no value to give it: the upgrade names both columns
    and the statement that deletes those rows, and leaves the database at 0010 as it was;
    once they are deleted it upgrades, the neutral NULLs filled, and the database itself
    refuses a NULL from then on."""
    _with_nulls(empty_db_url)
    before = _raw(empty_db_url, "SELECT id, notes, tags, steps_done FROM runs")
    with pytest.raises(StorageError) as info:
        _migrated(empty_db_url)
    message = str(info.value)
    assert "\n" not in message and "metrics.run_id in 1 row, metrics.step in 1 row" in message
    assert "DELETE FROM metrics WHERE run_id IS NULL OR step IS NULL;" in message and "restore a backup" in message
    assert "nothing was changed" in message
    assert _raw(empty_db_url, "SELECT version_num FROM alembic_version") == [("0010",)]
    assert _raw(empty_db_url, "SELECT id, notes, tags, steps_done FROM runs") == before == [(1, None, None, None)]
    assert len(_raw(empty_db_url, "SELECT id FROM metrics")) == 3

    eng = sa.create_engine(empty_db_url)
    with eng.begin() as con:  # the fix the message names
        con.execute(text(message.split("delete those rows (")[1].split(")")[0]))
    eng.dispose()
    st = _migrated(empty_db_url)
    run = st.runs.get_run(1)
    assert (run.notes, run.tags, run.steps_done, run.history_version) == ("", [], 0, 0)
    assert _raw(empty_db_url, "SELECT notes, CAST(tags AS TEXT), steps_done FROM runs") == [("", "[]", 0)]
    assert st.workers.list_workers()[0].status == "stopped"
    assert st.metrics([1])["value"].tolist() == [2.0]
    nullable = {c["name"]: c["nullable"] for c in inspect(st.engine).get_columns("metrics")}
    assert nullable == {"id": False, "run_id": False, "step": False, "wall_time": False, "name": False, "value": True}
    with pytest.raises(sa_exc.IntegrityError), st.engine.begin() as con:
        con.execute(text("INSERT INTO metrics (run_id, step, wall_time, name) VALUES (1, NULL, 0.0, 'val_loss')"))
    st.close()


def test_the_rebuilt_sqlite_tables_keep_their_ids_and_never_reuse_one(tmp_path):
    """SQLite sets NOT NULL by rebuilding the tables: every row and id stays, and an id
    deleted before the upgrade is not handed out again."""
    url = f"sqlite:///{tmp_path / 'lab.db'}"
    eng = _at_revision(url, "0010")
    with eng.begin() as con:
        for uid in ("a", "b", "c"):
            con.execute(text(RUN.format(config="'{}'", tags="'[]'")), {"uid": uid * 32, "name": uid, "notes": ""})
        con.execute(text("DELETE FROM runs WHERE id = 3"))
    eng.dispose()
    st = RunStore(url)
    assert [(r.id, r.name) for r in st.runs.list_runs()] == [(1, "a"), (2, "b")]
    assert st.runs.create_run(name="new", config={}, estimator="exact", rank=None, lam=0.0, seed=0, preset="tiny",
                         steps=1) == 4
    with st.engine.connect() as con:
        sql = con.execute(text("SELECT sql FROM sqlite_master WHERE name = 'runs'")).scalar()
    assert "AUTOINCREMENT" in sql and "name VARCHAR(200) NOT NULL" in sql
    st.close()
