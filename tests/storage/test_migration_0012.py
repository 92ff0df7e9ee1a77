"""Revision 0012 (issue 40): a run stored before the held-out test split gets ``"test_tokens": 0``
in its config, so reading it back gives the train and validation split it trained on; every
other key keeps its value. Each test runs on SQLite and on a throwaway PostgreSQL (``empty_db_url``)."""

from __future__ import annotations

import json

import sqlalchemy as sa
from alembic import command
from sqlalchemy import text

from engine.config import RunConfig
from storage import db as storage_db
from storage import head_revision, schema_revision
from tests.storage.test_migrations import _at_revision, _migrated, _revision_module

RUN = ("INSERT INTO runs (uid, name, status, config, tags, notes, versions, steps_done, history_version, epoch, "
       "cancel_requested, estimator, lam, seed, preset, steps) VALUES (:uid, :name, 'finished', :config, '[]', '', "
       "'{}', 0, 0, 0, false, 'exact', 0.0, 0, 'tiny', 10)")
NEW_FIELDS = ("test_tokens", "test_every_eval")


def _old_config(**changes) -> dict:
    """A config as a version before the test split stored it: no test fields."""
    config = RunConfig(preset="tiny", steps=10, val_tokens=4096, **changes).to_dict()
    return {k: v for k, v in config.items() if k not in NEW_FIELDS}


def _database_at_0011(url: str, configs: list) -> None:
    eng = _at_revision(url, "0011")
    with eng.begin() as con:
        con.execute(text(RUN), [{"uid": f"{i:032x}", "name": f"r{i}", "config": c if isinstance(c, str) else json.dumps(c)}
                                for i, c in enumerate(configs)])
    eng.dispose()


def _configs(url: str) -> dict[int, object]:
    eng = sa.create_engine(url)
    with eng.connect() as con:
        rows = con.execute(text("SELECT id, CAST(config AS TEXT) FROM runs ORDER BY id")).all()
    eng.dispose()
    return {rid: json.loads(stored) for rid, stored in rows}


def test_old_runs_get_no_test_split_and_keep_every_other_field(empty_db_url):
    """Every run lacking ``test_tokens`` gets 0 (more runs than one batch of the revision); a
    config that holds it already, or is not a JSON object, is left as it was."""
    old = _old_config(estimator="basis", rank=4, lam=0.01, seed=3, dataset_options={"max_documents": 9})
    batch = _revision_module("0012_test_split_of_old_runs.py").BATCH
    others = [{"lr": 0.5 + i} for i in range(batch + 2)]  # partial configs, as older versions wrote some
    chosen = {**old, "test_tokens": 512}
    _database_at_0011(empty_db_url, [old, chosen, {}, "[1, 2]", *others])

    st = _migrated(empty_db_url)
    assert schema_revision(st.engine) == head_revision()
    run = st.runs.get_run(1)
    assert run.config == {**old, "test_tokens": 0}
    config = RunConfig.from_dict(run.config)
    assert config.test_tokens == config.effective_test_tokens == 0 and not config.test_every_eval
    assert config.replace(test_tokens=None, test_every_eval=False).to_dict() == RunConfig.from_dict(
        {**old}).to_dict()  # nothing else read differently
    assert st.runs.get_run(2).config == chosen and st.runs.get_run(3).config == {"test_tokens": 0}
    stored = _configs(empty_db_url)
    assert stored[4] == [1, 2]
    assert stored[1] == {**old, "test_tokens": 0}  # in the database, not only on read
    assert [stored[5 + i] for i in range(len(others))] == [{**c, "test_tokens": 0} for c in others]
    st.close()


def test_downgrade_removes_the_key_where_it_is_zero(empty_db_url):
    old = _old_config()
    _database_at_0011(empty_db_url, [old, {**old, "test_tokens": 512}])
    eng = sa.create_engine(empty_db_url)
    with eng.begin() as con:
        command.upgrade(storage_db._alembic_config(con), "0012")
    assert _configs(empty_db_url)[1] == {**old, "test_tokens": 0}
    with eng.begin() as con:
        command.downgrade(storage_db._alembic_config(con), "0011")
    eng.dispose()
    assert _configs(empty_db_url) == {1: old, 2: {**old, "test_tokens": 512}}
