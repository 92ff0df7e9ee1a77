"""CSV export: round trips in the long and wide shapes, formula neutralisation, and the
safe writer (atomic, no overwrite without force, never the database).  Every database
lives in tmp_path."""

from __future__ import annotations

import math
import os

import numpy as np
import pandas as pd
import pytest

from storage import RunStore, StorageError, export_csv, long_frame, to_csv_bytes, wide_frame
from storage.export import COLUMNS, database_files, neutralize, write_file
from tests.support.runs import new_run


@pytest.fixture
def store(tmp_path):
    s = RunStore(f"sqlite:///{tmp_path / 'lab.db'}")
    yield s
    s.close()





def _exported_store(store):
    rng = np.random.default_rng(0)
    a = new_run(store, "a,quoted \"name\"", lam=0.1, seed=1)
    b = new_run(store, "b", estimator="bp", rank=None, lam=1e-7, seed=2,
                 config={"estimator": "bp", "model": {"width": 32}, "note": "x,y"})
    recorded = {}
    for rid in (a, b):
        rows = []
        for step in range(0, 50, 5):
            for name in ("train_loss", "val_loss", "cos_mean"):
                if name == "val_loss" and step % 10:
                    continue  # sparse metric: NaN in the wide shape
                value = float(rng.normal() * 10.0 ** int(rng.integers(-8, 8)))
                rows.append((step, step * 0.123456789 + rid, name, value))
                recorded[(rid, step, name)] = value
        store.metrics.add_metrics(rid, rows)
    return a, b, recorded


def test_export_long_round_trip(store, tmp_path):
    a, b, recorded = _exported_store(store)
    path = tmp_path / "long.csv"
    n = export_csv(store, path, [a, b], fmt="long")
    assert n == len(recorded)
    back = pd.read_csv(path)
    assert list(back.columns) == ["run_id", "run_name", "status", "sweep_id", "tags", "notes", "estimator", "rank",
                                  "lam", "seed", "preset", "steps", "B_seqs", "T_tokens", "R_rows", "step",
                                  "wall_time_s", "metric", "value"]
    assert len(back) == len(recorded)
    got = {(r.run_id, r.step, r.metric): r.value for r in back.itertuples()}
    assert got.keys() == recorded.keys()
    keys = sorted(recorded)
    np.testing.assert_allclose([got[k] for k in keys], [recorded[k] for k in keys], rtol=1e-15, atol=0)
    assert set(back.loc[back.run_id == a, "run_name"]) == {"a,quoted \"name\""}
    assert back.loc[back.run_id == b, "rank"].isna().all() and (back.loc[back.run_id == a, "rank"] == 8).all()
    assert back.loc[back.run_id == b, "lam"].iloc[0] == 1e-7
    assert to_csv_bytes(long_frame(store, [a, b])) == path.read_bytes()
    # run_ids None = all runs
    assert export_csv(store, tmp_path / "all.csv") == len(recorded)


def test_export_wide_round_trip(store, tmp_path):
    a, b, recorded = _exported_store(store)
    path = tmp_path / "wide.csv"
    n = export_csv(store, path, [a, b], fmt="wide")
    back = pd.read_csv(path)
    assert n == len(back) == len({(rid, step) for rid, step, _ in recorded})
    assert list(back.columns[:15]) == ["run_id", "run_name", "status", "sweep_id", "tags", "notes", "estimator", "rank",
                                       "lam", "seed", "preset", "steps", "B_seqs", "T_tokens", "R_rows"]
    assert {"config.model.width", "config.model.depth", "config.lr", "config.layers", "config.note"} <= set(back.columns)
    assert back["config.model.width"].tolist() == [64] * 10 + [32] * 10
    assert back.loc[back.run_id == a, "config.layers"].iloc[0] == "[1, 2]"
    assert back.loc[back.run_id == b, "config.note"].iloc[0] == "x,y"
    assert back.loc[back.run_id == b, "config.lr"].isna().all()
    assert list(back.columns[-3:]) == ["cos_mean", "train_loss", "val_loss"]
    checked = 0
    for row in back.itertuples(index=False):
        row = row._asdict()
        assert row["wall_time_s"] == pytest.approx(row["step"] * 0.123456789 + row["run_id"], rel=1e-15)
        for name in ("train_loss", "val_loss", "cos_mean"):
            key = (row["run_id"], row["step"], name)
            if key in recorded:
                assert row[name] == pytest.approx(recorded[key], rel=1e-15, abs=0)
                checked += 1
            else:
                assert math.isnan(row[name])
    assert checked == len(recorded)
    assert to_csv_bytes(wide_frame(store, [a, b])) == path.read_bytes()


def test_exports_explain_themselves_status_sweep_tags_notes_shape_and_no_rank_for_exact(store, tmp_path):
    from engine.config import RunConfig, shape_columns

    sketched = RunConfig(preset="tiny", rank=100_000, batch_size=2, seq_len=16)  # R clips to B·T = 32
    exact = RunConfig(preset="tiny", estimator="exact")
    ids = []
    for config in (sketched, exact):
        ids.append(store.runs.create_run(name=config.label(), config=config.to_dict(), estimator=config.estimator,
                                    rank=None if config.is_exact else config.effective_rank, lam=config.lam,
                                    seed=config.seed, preset=config.preset, steps=config.steps,
                                    sweep_id="20261122-101500-3fa9c1", tags=["pilot", "lr sweep"]))
        store.metrics.add_metrics(ids[-1], [(0, 0.25, "val_loss", 10.0), (10, 1.5, "val_loss", 9.0)])
    store.runs.set_notes(ids[0], "=too high?")
    store.runs.set_status(ids[0], "running")
    for fmt in ("long", "wide"):
        path = tmp_path / f"{fmt}.csv"
        export_csv(store, path, ids, fmt=fmt, shape=shape_columns)
        back = pd.read_csv(path, keep_default_na=False).drop_duplicates("run_id").set_index("run_id")
        s, e = back.loc[ids[0]], back.loc[ids[1]]
        assert (s["status"], e["status"]) == ("running", "queued")
        assert s["sweep_id"] == "20261122-101500-3fa9c1" and s["tags"] == "pilot, lr sweep"
        assert s["notes"] == "'=too high?"  # neutralised
        assert [str(s[c]) for c in ("B_seqs", "T_tokens", "R_rows", "rank")] == ["2", "16", "32", "32"]
        preset = RunConfig(preset="tiny")
        assert [str(e[c]) for c in ("B_seqs", "T_tokens")] == [str(preset.effective_batch_size),
                                                                 str(preset.effective_seq_len)]
        assert e["rank"] == "" and e["R_rows"] == ""  # exact runs carry no rank
        if fmt == "wide":
            assert e["config.rank"] == "" and str(s["config.rank"]) == "100000"  # stored as launched
        assert "wall_time_s" in back.columns and "wall_time" not in back.columns
    assert set(COLUMNS) >= {c for c in pd.read_csv(tmp_path / "long.csv").columns}


def test_the_readme_column_dictionary_is_the_exports():
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    for column, text in COLUMNS.items():
        assert f"| `{column}` | {text} |" in readme, column


def test_export_rejects_unknown_format_and_unknown_run(store, tmp_path):
    a = new_run(store)
    with pytest.raises(ValueError, match="long.*wide"):
        export_csv(store, tmp_path / "x.csv", [a], fmt="parquet")
    assert not (tmp_path / "x.csv").exists()
    with pytest.raises(StorageError, match="no run 42"):
        export_csv(store, tmp_path / "x.csv", [42])
    # a run without metrics exports as zero rows with the header
    assert export_csv(store, tmp_path / "empty.csv", [a], fmt="wide") == 0
    assert pd.read_csv(tmp_path / "empty.csv").empty




# ----------------------------------------------------------------------------- formula injection

HOSTILE = ['=HYPERLINK("http://x")', "+1", "-cmd", "@SUM(A1)", "\tx", "\rx"]


def test_neutralize_prefixes_text_formulas_and_leaves_numbers():
    frame = pd.DataFrame({
        "name": [*HOSTILE, "plain", "a=b"],
        "value": [-1.5, -2.0, 3.0, -0.0, 1e-9, -7.25, 0.5, -1.0],
        "count": np.arange(-4, 4),
        "=head": ["x"] * 8,
    })
    out = neutralize(frame)
    assert out["name"].tolist() == [f"'{h}" for h in HOSTILE] + ["plain", "a=b"]
    assert list(out.columns) == ["name", "value", "count", "'=head"]
    pd.testing.assert_series_equal(out["value"], frame["value"])  # negative floats are numbers, not text
    pd.testing.assert_series_equal(out["count"], frame["count"])
    assert frame["name"].iloc[0] == HOSTILE[0]  # the input is not modified


def test_every_csv_shape_is_neutralised(store, tmp_path):
    rid = new_run(store, HOSTILE[0], config={"cmd": "-rm", "lr": -0.5})
    store.metrics.add_metrics(rid, [(1, 0.1, "train_loss", -3.25), (1, 0.1, "@evil", 1.0)])
    for fmt in ("long", "wide"):
        export_csv(store, tmp_path / f"{fmt}.csv", fmt=fmt)
        back = pd.read_csv(tmp_path / f"{fmt}.csv", keep_default_na=False)
        assert back["run_name"].iloc[0] == "'" + HOSTILE[0]
    long = pd.read_csv(tmp_path / "long.csv")
    assert set(long["metric"]) == {"train_loss", "'@evil"} and long.loc[long.metric == "train_loss", "value"].item() == -3.25
    wide = pd.read_csv(tmp_path / "wide.csv")
    assert wide["config.cmd"].item() == "'-rm" and wide["config.lr"].item() == -0.5 and wide["train_loss"].item() == -3.25
    assert "'@evil" in wide.columns
    # the dashboard's download path
    assert to_csv_bytes(long_frame(store, [rid])) == (tmp_path / "long.csv").read_bytes()
    assert b"\n=HYPERLINK" not in to_csv_bytes(wide_frame(store, [rid])) and b",=HYPERLINK" not in to_csv_bytes(wide_frame(store, [rid]))


# ----------------------------------------------------------------------------- safe writing


def _still_whole(store, n_runs):
    reopened = RunStore(store.url)
    assert len(reopened.runs.list_runs()) == n_runs
    reopened.close()


def test_export_refuses_to_overwrite_without_force(store, tmp_path):
    a, b, recorded = _exported_store(store)
    path = tmp_path / "out.csv"
    path.write_text("precious")
    with pytest.raises(StorageError, match="already exists; pass --force") as info:
        export_csv(store, path)
    assert "\n" not in str(info.value) and path.read_text() == "precious"
    assert export_csv(store, path, force=True) == len(recorded)
    assert len(pd.read_csv(path)) == len(recorded)
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []  # no temporary left


@pytest.mark.parametrize("spelling", ["absolute", "relative", "dotdot", "tilde", "symlink", "hardlink", "wal", "shm"])
@pytest.mark.parametrize("force", [False, True])
def test_export_never_writes_the_database(store, tmp_path, monkeypatch, spelling, force):
    a, b, recorded = _exported_store(store)
    db = tmp_path / "lab.db"
    assert database_files(store)[0] == db
    before = db.read_bytes()
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")
    monkeypatch.setenv("HOME", str(tmp_path))
    if spelling == "symlink":
        os.symlink(db, tmp_path / "link.csv")
    if spelling == "hardlink":
        os.link(db, tmp_path / "hard.csv")
    path = {
        "absolute": str(db), "relative": "../lab.db", "dotdot": str(tmp_path / "sub" / ".." / "lab.db"),
        "tilde": "~/lab.db", "symlink": str(tmp_path / "link.csv"), "hardlink": str(tmp_path / "hard.csv"),
        "wal": str(db) + "-wal", "shm": "../lab.db-shm",
    }[spelling]
    with pytest.raises(StorageError, match="refusing to write .*database") as info:
        export_csv(store, path, force=force)
    assert "\n" not in str(info.value)
    assert db.read_bytes() == before
    _still_whole(store, 2)


def test_export_errors_name_the_fix_and_write_nothing(store, tmp_path):
    new_run(store)
    with pytest.raises(StorageError, match="does not exist; create it"):
        export_csv(store, tmp_path / "missing" / "x.csv")
    with pytest.raises(StorageError, match="is a directory"):
        export_csv(store, tmp_path, force=True)
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("lab.db")) == []


def test_write_file_is_atomic_and_follows_symlinks(store, tmp_path):
    target = tmp_path / "real.txt"
    target.write_text("old")
    link = tmp_path / "link.txt"
    os.symlink(target, link)
    write_file(store, link, "new", force=True)
    assert link.is_symlink() and target.read_text() == "new"
    # the content is replaced as a whole: a reader holding the old file keeps the old bytes
    with open(target) as held:
        write_file(store, target, "newer", force=True)
        assert held.read() == "new"
    assert target.read_text() == "newer"
    assert write_file(None, tmp_path / "free.txt", b"\x00bytes") == tmp_path / "free.txt"


def test_cli_export_force_flag(store, tmp_path, capsys, monkeypatch):
    from engine.cli import main as cli

    _exported_store(store)
    monkeypatch.setenv("BASIS_LAB_DB_URL", store.url)
    out = tmp_path / "e.csv"
    assert cli.main(["export", "--out", str(out)]) == 0
    assert cli.main(["export", "--out", str(out), "--format", "wide"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "--force" in err and len(err.strip().splitlines()) == 1
    assert pd.read_csv(out).columns[-1] == "value"  # still the long file
    assert cli.main(["export", "--out", str(out), "--format", "wide", "--force"]) == 0
    assert "step" in pd.read_csv(out).columns and "metric" not in pd.read_csv(out).columns
    assert cli.main(["export", "--out", str(tmp_path / "lab.db"), "--force"]) == 2
    assert "database" in capsys.readouterr().err
    _still_whole(store, 2)


def test_a_symlinked_database_protects_its_targets_companions(tmp_path):
    real = tmp_path / "real.db"
    RunStore(f"sqlite:///{real}").close()
    os.symlink(real, tmp_path / "link.db")
    store = RunStore(f"sqlite:///{tmp_path / 'link.db'}")
    for name in ("real.db", "real.db-wal", "link.db-shm", "link.db"):
        with pytest.raises(StorageError, match="database"):
            write_file(store, tmp_path / name, "x", force=True)
    assert write_file(store, tmp_path / "real.csv", "x") == tmp_path / "real.csv"
    store.close()
