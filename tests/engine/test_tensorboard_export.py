"""``engine export --format tensorboard DIR`` (``engine.runner.tensorboard``): TensorBoard's own
reader (its ``EventAccumulator``) reads back every metric of every exported run, steps, values
(as the float32 TensorBoard keeps) and wall times equal to the store's; each run's config and
method are an HParams session that TensorBoard's own HParams backend lists with the run's final
metrics; a bad DIR is refused in one line and nothing is written. Every database lives in tmp_path."""

from __future__ import annotations

import io
import os
import stat
import zipfile

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import api_pb2
from tensorboard.plugins.hparams import metadata as hp_metadata

import storage.stream as stream
from engine.cli.main import main
from engine.config import RunConfig
from engine.runner import tensorboard as tb
from storage import RunStore, StorageError
from tests.support.runs import TINY, fake_run, new_run


@pytest.fixture
def lab(tmp_path):
    """A store with a finished BASIS run (system metrics too), a failed exact run and a queued
    run with no metrics; yields (url, store, ids)."""
    url = f"sqlite:///{tmp_path / 'lab.db'}"
    store = RunStore(url)
    basis = fake_run(store, TINY, system=True)
    exact = fake_run(store, RunConfig(preset="tiny", steps=30, eval_interval=10, probe_interval=10, estimator="exact",
                                      seed=1, lr=0.05), status="failed", error="boom")
    queued = new_run(store, "a/b: c?")
    yield url, store, [basis, exact, queued]
    store.close()


def _read(folder) -> EventAccumulator:
    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def _content(acc: EventAccumulator, tag: str) -> bytes:
    return acc.SummaryMetadata(tag).plugin_data.content


def _hparams(acc: EventAccumulator) -> dict:
    """The run's HParams session start, read by TensorBoard's own parser: {name: value}."""
    values = hp_metadata.parse_session_start_info_plugin_data(_content(acc, hp_metadata.SESSION_START_INFO_TAG)).hparams
    return {k: v.WhichOneof("kind") and getattr(v, v.WhichOneof("kind")) for k, v in values.items()}


def _export(url, out, *extra) -> int:
    return main(["export", "--db", url, "--format", "tensorboard", str(out), *extra])


def test_every_metric_reads_back_with_the_stores_steps_values_and_wall_times(lab, tmp_path, capsys):
    url, store, ids = lab
    out = tmp_path / "tb"
    assert _export(url, out) == 0
    assert f"wrote 3 run folders to {out}" in capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == [f"{ids[0]}-basis_R=32_s0", f"{ids[1]}-exact_s1", f"{ids[2]}-a_b_c"]
    for run_id in ids:
        run = store.runs.get_run(run_id)
        acc = _read(out / tb.folder_name(run))
        stored = store.metrics([run_id])
        assert set(acc.Tags()["scalars"]) == set(stored["name"])
        for name, rows in stored.groupby("name"):
            events = acc.Scalars(name)
            assert [e.step for e in events] == rows["step"].tolist()
            assert [e.value for e in events] == rows["value"].astype(np.float32).tolist()
            np.testing.assert_allclose([e.wall_time for e in events],
                                       run.created_at.timestamp() + rows["wall_time"].to_numpy(), rtol=0, atol=1e-5)
    basis = _read(out / tb.folder_name(store.runs.get_run(ids[0]))).Tags()["scalars"]
    assert len(basis) > 15 and {"val_loss", "cos/head", "sys/rss_mib"} <= set(basis)  # the test has something to read
    assert store.metrics([ids[2]]).empty and _hparams(_read(out / f"{ids[2]}-a_b_c"))  # a run with no metric yet


def test_each_run_is_an_hparams_session_with_its_config_method_and_status(lab, tmp_path):
    url, store, ids = lab
    folders = tb.export_tensorboard(store, ids, tmp_path / "tb")
    basis, exact, queued = (_read(f) for f in folders)
    hp = _hparams(basis)
    assert hp["estimator"] == "basis" and hp["rank"] == 32 and hp["lam"] == 0 and hp["seed"] == 0
    assert hp["lr"] == pytest.approx(0.01) and hp["preset"] == "tiny" and hp["steps"] == 40 and hp["status"] == "finished"
    assert hp["B_seqs"] > 0 and hp["T_tokens"] > 0 and hp["recompute_activations"] is True
    hp = _hparams(exact)
    assert hp["estimator"] == "exact" and hp["lr"] == pytest.approx(0.05) and hp["seed"] == 1
    assert "rank" not in hp and "lam" not in hp and "R_rows" not in hp  # an exact run has none
    assert _hparams(queued)["model.width"] == 64 and _hparams(queued)["layers"] == "[1, 2]"  # nested and list fields
    ends = [hp_metadata.parse_session_end_info_plugin_data(_content(a, hp_metadata.SESSION_END_INFO_TAG)).status
            for a in (basis, exact, queued)]
    assert ends == [api_pb2.STATUS_SUCCESS, api_pb2.STATUS_FAILURE, api_pb2.STATUS_UNKNOWN]  # the last one is queued


def _tensorboard_app(logdir):
    """TensorBoard's own WSGI app over ``logdir``, loaded once (what `tensorboard --logdir` serves)."""
    from tensorboard import default, program
    from tensorboard.backend import application
    from tensorboard.backend.event_processing import data_ingester
    from werkzeug.test import Client

    board = program.TensorBoard(plugins=default.get_plugins())
    board.configure(logdir=str(logdir), load_fast="false", reload_interval=0, reload_task="blocking")
    ingester = data_ingester.LocalDataIngester(board.flags)
    ingester.start()
    return Client(application.TensorBoardWSGIApp(board.flags, board.plugin_loaders, ingester.data_provider, None,
                                                 ingester.deprecated_multiplexer))


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # TensorBoard's own vendored html5lib, loaded with its plugins
def test_tensorboards_hparams_view_lists_the_runs_with_their_hyperparameters_and_final_metrics(lab, tmp_path):
    url, store, ids = lab
    tb.export_tensorboard(store, ids[:2], tmp_path / "tb")
    client = _tensorboard_app(tmp_path / "tb")
    experiment = client.post("/data/plugin/hparams/experiment", json={"experimentName": ""}).get_json()
    assert {"estimator", "rank", "lam", "seed", "lr", "status"} <= {h["name"] for h in experiment["hparamInfos"]}
    assert {"val_loss", "train_loss", "sys/rss_mib"} <= {m["name"]["tag"] for m in experiment["metricInfos"]}
    statuses = ["STATUS_UNKNOWN", "STATUS_SUCCESS", "STATUS_FAILURE", "STATUS_RUNNING"]
    groups = client.post("/data/plugin/hparams/session_groups", json={
        "experimentName": "", "allowedStatuses": statuses, "colParams": [], "startIndex": 0, "sliceSize": 10,
    }).get_json()["sessionGroups"]
    final = store.metrics.final_metrics(ids[:2], names=["val_loss"])
    want = {tb.folder_name(store.runs.get_run(r)): np.float32(v) for r, v in zip(final["run_id"], final["value"])}
    got = {g["name"]: next(m["value"] for m in g["metricValues"] if m["name"]["tag"] == "val_loss") for g in groups}
    assert got == want
    assert {g["name"]: g["hparams"]["estimator"] for g in groups} == dict(zip(want, ("basis", "exact")))


def test_the_run_selection_is_the_csv_exports(lab, tmp_path, capsys):
    url, store, ids = lab
    assert _export(url, tmp_path / "exact", "--where", "estimator == exact") == 0
    assert [p.name for p in (tmp_path / "exact").iterdir()] == [f"{ids[1]}-exact_s1"]
    assert main(["export", "--db", url, "--format", "tensorboard", "--out", str(tmp_path / "two"),
                 "--runs", str(ids[2]), "basis R=32 s0"]) == 0
    assert sorted(p.name for p in (tmp_path / "two").iterdir()) == [f"{ids[0]}-basis_R=32_s0", f"{ids[2]}-a_b_c"]
    assert _export(url, tmp_path / "none", "--where", "rank > 1000") == 2
    assert "no run matches --where" in capsys.readouterr().err and not (tmp_path / "none").exists()


def _listing(root) -> dict:
    return {p.relative_to(root).as_posix(): (p.read_bytes() if p.is_file() and not p.is_symlink() else None)
            for p in sorted(root.rglob("*")) if p.name != "lab.db" and not p.name.startswith("lab.db-")}


@pytest.mark.parametrize("case", ["file", "dev-null", "fifo", "non-empty", "no-parent", "no-output", "two-outputs"])
def test_a_bad_dir_is_refused_in_one_line_and_nothing_is_written(lab, tmp_path, capsys, case):
    url, store, ids = lab
    target = {"file": tmp_path / "runs.txt", "dev-null": "/dev/null", "fifo": tmp_path / "pipe",
              "non-empty": tmp_path / "full", "no-parent": tmp_path / "missing" / "tb"}.get(case, tmp_path / "tb")
    if case == "file":
        target.write_text("keep me")
    elif case == "fifo":
        os.mkfifo(target)
    elif case == "non-empty":
        target.mkdir()
        (target / "notes.txt").write_text("keep me")
    before = _listing(tmp_path)
    argv = ["export", "--db", url, "--format", "tensorboard"]
    argv += {"no-output": [], "two-outputs": [str(target), "--out", str(tmp_path / "other")]}.get(case, [str(target)])
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    fix = {"file": "it is a file; give a directory", "dev-null": "it is a character device, not a directory",
           "fifo": "it is a FIFO (named pipe), not a directory", "non-empty": "is not empty; pass --force",
           "no-parent": "does not exist; create it", "no-output": "no output given",
           "two-outputs": "two outputs given"}[case]
    assert fix in err
    assert _listing(tmp_path) == before  # nothing written, no temporary folder left
    assert case != "dev-null" or stat.S_ISCHR(os.stat("/dev/null").st_mode)
    assert case != "fifo" or stat.S_ISFIFO(os.lstat(target).st_mode)


def test_force_replaces_the_runs_folders_and_leaves_the_rest(lab, tmp_path, capsys):
    url, store, ids = lab
    out = tmp_path / "tb"
    assert _export(url, out, "--runs", str(ids[0])) == 0
    old = out / f"{ids[0]}-basis_R=32_s0" / "stale.txt"
    old.write_text("from an earlier export")
    (out / "notes.txt").write_text("mine")
    assert _export(url, out) == 2 and "is not empty" in capsys.readouterr().err
    assert _export(url, out, "--force") == 0
    assert (out / "notes.txt").read_text() == "mine" and not old.exists()  # the old folder was replaced whole
    assert sorted(p.name for p in out.iterdir()) == sorted(["notes.txt", *(tb.folder_name(store.runs.get_run(i)) for i in ids)])
    assert [p.name for p in out.iterdir() if p.name.startswith(".")] == []
    # a run's folder name taken by a file (or a link) is refused, --force or not, before anything is written
    folder = out / tb.folder_name(store.runs.get_run(ids[1]))
    for p in sorted(folder.iterdir()):
        p.unlink()
    folder.rmdir()
    folder.write_text("not a folder")
    before = _listing(tmp_path)
    assert _export(url, out, "--force") == 2
    assert "is not a folder" in capsys.readouterr().err and _listing(tmp_path) == before


def test_the_rows_are_read_a_chunk_at_a_time(lab, tmp_path, monkeypatch):
    url, store, ids = lab
    sizes: list[int] = []
    made = stream.metrics_frame

    def recorded(rows):
        sizes.append(len(rows))
        return made(rows)

    monkeypatch.setattr(stream, "metrics_frame", recorded)
    folders = tb.export_tensorboard(store, ids, tmp_path / "tb", size=7)
    total = len(store.metrics(ids))
    assert sum(sizes) == total and max(sizes) == 7 and len(sizes) >= total // 7  # never the whole table at once
    acc = _read(folders[0])
    assert sum(len(acc.Scalars(t)) for t in acc.Tags()["scalars"]) == len(store.metrics([ids[0]]))


def test_a_failed_write_leaves_no_partial_export(lab, tmp_path, monkeypatch):
    url, store, ids = lab
    from tensorboardX.event_file_writer import EventsWriter

    written = [0]
    real = EventsWriter.write_event

    def full_disk(self, event):
        written[0] += 1
        if written[0] > 3:  # the first run's start and a few of its records, then the disk is full
            raise OSError(28, "No space left on device")
        return real(self, event)

    monkeypatch.setattr(EventsWriter, "write_event", full_disk)
    before = _listing(tmp_path)
    with pytest.raises(StorageError, match="No space left on device"):
        tb.export_tensorboard(store, ids, tmp_path / "tb")
    assert _listing(tmp_path) == before
    (tmp_path / "tb").mkdir()
    with pytest.raises(StorageError):
        written[0] = 0
        tb.export_tensorboard(store, ids, tmp_path / "tb")
    assert list((tmp_path / "tb").iterdir()) == []


def test_the_dashboards_zip_holds_the_run_folders(lab, tmp_path):
    url, store, ids = lab
    data = tb.tensorboard_zip(store, ids[:2])
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        names = z.namelist()
        assert {n.split("/")[1] for n in names} == {tb.folder_name(store.runs.get_run(i)) for i in ids[:2]}
        assert all(n.startswith("basis-runs-tensorboard/") and "/events.out.tfevents." in n for n in names)
        z.extractall(tmp_path / "unzipped")
    acc = _read(tmp_path / "unzipped" / "basis-runs-tensorboard" / tb.folder_name(store.runs.get_run(ids[0])))
    want = store.metrics([ids[0]], names=["val_loss"])["value"].astype(np.float32).tolist()
    assert [e.value for e in acc.Scalars("val_loss")] == want


def test_the_python_api_exports_what_the_cli_exports(lab, tmp_path):
    """``Lab.export`` writes the same run folders and event values as ``engine export``, CSV as
    the CLI's too; a bad format raises a ValueError and writes nothing."""
    from engine.api import Lab

    url, store, ids = lab
    assert _export(url, tmp_path / "cli") == 0
    with Lab(url) as api:
        assert api.export(str(tmp_path / "api"), format="tensorboard") == 3
        assert api.export(str(tmp_path / "exact"), where="estimator == exact", format="tensorboard") == 1
        assert api.export(str(tmp_path / "runs.csv"), format="wide") > 0
        with pytest.raises(ValueError, match="unknown export format 'parquet'"):
            api.export(str(tmp_path / "x"), format="parquet")
    assert sorted(p.name for p in (tmp_path / "api").iterdir()) == sorted(p.name for p in (tmp_path / "cli").iterdir())
    assert [p.name for p in (tmp_path / "exact").iterdir()] == [f"{ids[1]}-exact_s1"]
    folder = f"{ids[0]}-basis_R=32_s0"
    cli, api_read = _read(tmp_path / "cli" / folder), _read(tmp_path / "api" / folder)
    assert cli.Tags()["scalars"] == api_read.Tags()["scalars"]
    for tag in cli.Tags()["scalars"]:
        assert [(e.step, e.value) for e in cli.Scalars(tag)] == [(e.step, e.value) for e in api_read.Scalars(tag)]
    assert main(["export", "--db", url, "--format", "wide", "--out", str(tmp_path / "cli.csv")]) == 0
    assert (tmp_path / "runs.csv").read_bytes() == (tmp_path / "cli.csv").read_bytes()
    assert not (tmp_path / "x").exists()
