"""Integers and text sized to what the schema allows, on SQLite and PostgreSQL: 64-bit
seeds and steps are stored, an over-long name is refused naming the field by the form,
the CLI and the store alike, a refused sweep queues nothing, any other value the database
refuses names its column, and revision 0003 widens stored databases keeping every row."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from alembic import command
from sqlalchemy import inspect

from engine.cli.main import main
from engine.config import ConfigError, RunConfig
from storage import RunStore, StorageError, head_revision, schema_revision
from storage import db as storage_db
from storage.limits import NAME_MAX, NOTES_MAX, TAG_MAX
from tests.storage.test_migrations import _migrated

BIG = 3_000_000_000  # past 2^31: what a 32-bit column cannot hold


def _run(store, **kw):
    args = dict(name="r", config={}, estimator="basis", rank=4, lam=0.0, seed=0, preset="tiny", steps=10)
    args.update(kw)
    return store.runs.create_run(**args)


def test_seeds_and_steps_past_2_31_are_stored(store):
    run_id = _run(store, seed=BIG, steps=BIG, rank=BIG)
    store.queue.claim(run_id, "host:1")
    store.runs.heartbeat(run_id, BIG - 1)
    store.runs.set_checkpoint_step(run_id, BIG - 1)
    store.metrics.add_metrics(run_id, [(BIG - 1, 1.0, "train_loss", 0.5)])
    r = store.runs.get_run(run_id)
    assert (r.seed, r.steps, r.rank, r.steps_done, r.checkpoint_step) == (BIG, BIG, BIG, BIG - 1, BIG - 1)
    assert store.metrics([run_id])["step"].tolist() == [BIG - 1]
    assert store.frames.runs_frame().set_index("id").loc[run_id, "seed"] == BIG
    with pytest.raises(ValueError, match=r"^seed = 9223372036854775808 does not fit the database"):
        _run(store, seed=2**63)


def test_text_past_its_limit_is_refused_by_the_store_naming_the_field(store):
    with pytest.raises(ValueError, match=f"^name is {NAME_MAX + 1} characters long; the most is {NAME_MAX}"):
        _run(store, name="n" * (NAME_MAX + 1))
    run_id = _run(store, name="n" * NAME_MAX)  # exactly the limit fits, on both backends
    assert store.runs.get_run(run_id).name == "n" * NAME_MAX
    with pytest.raises(ValueError, match="^name is"):
        store.runs.rename_run(run_id, "x" * 10_000)
    with pytest.raises(ValueError, match="^notes is"):
        store.runs.set_notes(run_id, "x" * (NOTES_MAX + 1))
    with pytest.raises(ValueError, match="^tags: "):
        store.runs.set_tags(run_id, ["t" * (TAG_MAX + 1)])
    store.runs.set_notes(run_id, "y" * NOTES_MAX)
    store.runs.append_notes(run_id, "resumed from the checkpoint at step 7")  # a run's own notes keep their newest part
    notes = store.runs.get_run(run_id).notes
    assert len(notes) == NOTES_MAX and notes.endswith("step 7") and notes.startswith("…")
    assert [r.name for r in store.runs.list_runs()] == ["n" * NAME_MAX]


def test_a_refused_sweep_queues_nothing(store, monkeypatch):
    good = dict(name="good", config={}, estimator="basis", rank=4, lam=0.0, seed=0, preset="tiny", steps=10)
    with pytest.raises(ValueError, match=r"^run 2 of 2 \('nnnn.*name is 10,000 characters long"):
        store.runs.create_runs([good, {**good, "name": "n" * 10_000}])
    assert store.runs.list_runs() == []
    assert store.runs.create_runs([good, {**good, "seed": BIG}]) and len(store.runs.list_runs()) == 2


def test_a_value_the_database_refuses_names_its_column(store, monkeypatch):
    """Past the store's own checks (disabled here), the database's refusal is one line
    naming the column, and the sweep's transaction stores none of its runs."""
    import storage.models
    import storage.runs

    good = dict(name="good", config={}, estimator="basis", rank=4, lam=0.0, seed=0, preset="tiny", steps=10)
    monkeypatch.setattr(storage.runs, "new_uid", lambda: "f" * 32)  # every run the same uid: UNIQUE refuses it
    with pytest.raises(StorageError) as e:
        store.runs.create_runs([good, good])
    assert "runs.uid" in str(e.value) and "\n" not in str(e.value)
    assert store.runs.list_runs() == []
    monkeypatch.undo()
    if store.engine.dialect.name == "postgresql":  # SQLite does not enforce VARCHAR lengths
        monkeypatch.setattr(storage.runs, "_name", lambda name: str(name))
        with pytest.raises(StorageError, match=r"refused the value of runs\.name .*fix the name"):
            store.runs.create_runs([good, {**good, "name": "n" * 10_000}])
        assert store.runs.list_runs() == []


@pytest.mark.parametrize("argv, message", [
    (["run", "--queue-only", "--preset", "tiny", "--name", "n" * (NAME_MAX + 1)],
     f"name is {NAME_MAX + 1} characters long; the most is {NAME_MAX}"),
    (["sweep", "--queue-only", "--preset", "tiny", "--ranks", "2,4", "--name", "n" * (NAME_MAX - 5)],
     f"may have at most {NAME_MAX - 15} characters here; it has {NAME_MAX - 5}"),  # 'name · basis R=2 s0' per run
    (["run", "--queue-only", "--preset", "tiny", "--steps", str(2**63)], "steps must be an integer in [1, "),
    (["run", "--queue-only", "--preset", "tiny", "--tags", "t" * (TAG_MAX + 1)], f"longer than {TAG_MAX} characters"),
])
def test_the_cli_refuses_by_field_and_writes_nothing(db_url, capsys, argv, message):
    assert main([*argv, "--db", db_url]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert RunStore(db_url).runs.list_runs() == []


def test_the_cli_queues_a_sweep_with_a_seed_past_2_31(db_url, capsys):
    assert main(["sweep", "--db", db_url, "--preset", "tiny", "--ranks", "2", "--seeds", f"0,{BIG}",
                 "--steps", str(BIG), "--queue-only"]) == 0
    runs = RunStore(db_url).runs.list_runs()
    assert [(r.seed, r.steps) for r in runs] == [(0, BIG), (BIG, BIG)]


def test_the_form_refuses_a_long_name_by_field():
    from app import form

    values = form.values_of(form.DEFAULT_SWEEP)
    with pytest.raises(ConfigError, match=f"name is {NAME_MAX + 1} characters long"):
        form.to_sweep({**values, "name": "n" * (NAME_MAX + 1)})
    name = next(w for w in form.widgets() if w.name == "name")
    assert name.max_chars == NAME_MAX  # the limit its message names (the browser box takes a longer paste, so the form can refuse it)
    assert RunConfig(name="n" * NAME_MAX).name == "n" * NAME_MAX


def test_revision_0003_widens_a_stored_database_keeping_rows_and_ids(empty_db_url):
    """A database at 0002 with runs and metrics, its newest run and metric deleted, upgrades
    to head: every row stays, ids of deleted rows are not handed out again, and the widened
    columns are 64-bit."""
    engine = sa.create_engine(empty_db_url)
    if engine.dialect.name == "sqlite":
        storage_db._install_sqlite_hooks(engine, memory=False)
    with engine.begin() as conn:
        command.upgrade(storage_db._alembic_config(conn), "0002")
        runs = sa.table("runs", sa.column("id"), sa.column("uid"), sa.column("name"), sa.column("status"),
                        sa.column("seed"), sa.column("steps"), sa.column("steps_done"), sa.column("notes"),
                        sa.column("tags"), sa.column("history_version"))
        metrics = sa.table("metrics", sa.column("id"), sa.column("run_id"), sa.column("step"), sa.column("wall_time"),
                           sa.column("name"), sa.column("value"))
        for i in (1, 2, 3):
            conn.execute(runs.insert().values(uid=f"{i:032x}", name=f"r{i}", status="finished", seed=i, steps=10,
                                              steps_done=10, notes="", history_version=0))
            conn.execute(metrics.insert().values(run_id=i, step=10, wall_time=1.0, name="val_loss", value=float(i)))
        conn.execute(metrics.delete().where(metrics.c.run_id == 3))
        conn.execute(runs.delete().where(runs.c.id == 3))
    engine.dispose()
    store = _migrated(empty_db_url)
    assert schema_revision(store.engine) == head_revision()
    assert [(r.id, r.name, r.seed, r.epoch) for r in store.runs.list_runs()] == [(1, "r1", 1, 0), (2, "r2", 2, 0)]
    assert store.metrics([1, 2])["value"].tolist() == [1.0, 2.0]
    new = _run(store, seed=BIG)
    assert new == 4 and store.runs.get_run(new).seed == BIG  # id 3 is never handed out again
    store.metrics.add_metrics(new, [(BIG, 0.0, "val_loss", 4.0)])
    assert store.metrics([new])["id"].tolist() == [4]
    columns = {(t, c["name"]): c["type"] for t in ("runs", "metrics", "diagnostics", "diagnostic_results")
               for c in inspect(store.engine).get_columns(t)}
    for key in [("runs", "seed"), ("runs", "steps"), ("runs", "steps_done"), ("runs", "rank"),
                ("runs", "checkpoint_step"), ("metrics", "step"), ("diagnostics", "step"),
                ("diagnostic_results", "rank"), ("diagnostic_results", "keys")]:
        assert isinstance(columns[key], sa.BigInteger), (key, columns[key])
    store.close()
