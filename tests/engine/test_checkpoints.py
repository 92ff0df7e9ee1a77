"""Checkpoints: the sampler's state, exact resumption, retention, damage, threads."""

import dataclasses
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from engine.data import BatchSampler, DataError
from engine.runner.paths import checkpoint_root
from engine.training.build import initial_params, model_config, optimizer_for, run_keys, sketch_key
from engine.training.checkpoints import CheckpointError, RunCheckpoints, run_dir
from engine.training.loop import RunConfig
from engine.training.steps import init_state, make_train_step
from storage import db

TINY = RunConfig(preset="tiny", rank=4, lr=0.05)
TOKENS = np.random.default_rng(0).integers(0, 50257, size=20_000).astype(np.uint16)


# --------------------------------------------------------------------------- sampler state


def test_sampler_state_restores_the_same_batches_in_a_fresh_sampler():
    sampler = BatchSampler(TOKENS, batch_size=4, seq_len=16, seed=3)
    for _ in range(5):
        sampler.next()
    state = json.loads(json.dumps(sampler.state()))  # survives a JSON round trip
    expected = np.stack([sampler.next() for _ in range(5)])
    fresh = BatchSampler(TOKENS, batch_size=4, seq_len=16, seed=99)
    fresh.set_state(state)
    np.testing.assert_array_equal(np.stack([fresh.next() for _ in range(5)]), expected)


def test_sampler_state_of_another_shape_or_garbage_is_a_clear_error():
    state = BatchSampler(TOKENS, batch_size=4, seq_len=16, seed=3).state()
    other = BatchSampler(TOKENS, batch_size=2, seq_len=16, seed=3)
    before = other.state()
    with pytest.raises(DataError, match="fix by resuming with the run's own"):
        other.set_state(state)
    with pytest.raises(DataError, match="fix by passing"):
        other.set_state({**before, "rng": {"bit_generator": "PCG64", "state": "x"}})
    with pytest.raises(DataError, match="fix by passing"):
        other.set_state("garbage")
    assert other.state() == before


# --------------------------------------------------------------------------- where


def test_root_is_the_env_var_else_beside_the_sqlite_database(monkeypatch, tmp_path):
    monkeypatch.setenv("BASIS_LAB_CHECKPOINTS", str(tmp_path / "ck"))
    assert checkpoint_root() == tmp_path / "ck"
    monkeypatch.delenv("BASIS_LAB_CHECKPOINTS")
    assert checkpoint_root() == tmp_path / "checkpoints"  # conftest points the DB URL at tmp_path/lab.db
    assert checkpoint_root(str(tmp_path / "x" / "runs.db")) == tmp_path / "x" / "checkpoints"
    monkeypatch.delenv("BASIS_LAB_DB_URL")
    assert checkpoint_root() == db.DEFAULT_DB_PATH.parent / "checkpoints"
    assert checkpoint_root("postgresql+psycopg://u@h/db") == db.DEFAULT_DB_PATH.parent / "checkpoints"
    assert run_dir(tmp_path, 12) == tmp_path / "run-12"
    with pytest.raises(CheckpointError, match="fix by"):
        run_dir(tmp_path, "../12")


# --------------------------------------------------------------------------- exact resumption


def _fresh(config: RunConfig, step_fn):
    """What a run builds at its start: state, sampler, sketch root (and the step
    function, shared so the test compiles it once)."""
    state = init_state(initial_params(config), optimizer_for(config))
    sampler = BatchSampler(TOKENS, config.effective_batch_size, config.effective_seq_len, config.seed)
    return state, sampler, step_fn, run_keys(config.seed)[1]


def _train(state, sampler, step_fn, root, first: int, last: int):
    for step in range(first, last + 1):
        state, _ = step_fn(state, jnp.asarray(sampler.next()), sketch_key(root, step))
    return state


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
@pytest.mark.parametrize("estimator", ["exact", "basis"])
def test_resumed_run_continues_the_exact_trajectory(tmp_path, estimator, optimizer):
    lr = 0.05 if optimizer == "sgd" else 1e-3
    config = dataclasses.replace(TINY, estimator=estimator, optimizer=optimizer, lr=lr)
    n, k = 6, 3
    step_fn = make_train_step(model_config(config), optimizer_for(config))
    straight = _train(*_fresh(config, step_fn), 1, n)

    state, sampler, _, root = _fresh(config, step_fn)
    state = _train(state, sampler, step_fn, root, 1, k)
    with RunCheckpoints(tmp_path / "run", keep=2) as ckpt:
        ckpt.save(k, state, {"sampler": sampler.state(), "config": config.to_dict()})
    del state, sampler

    state, sampler, _, root = _fresh(config, step_fn)  # a new process would build exactly these
    with RunCheckpoints(tmp_path / "run", keep=2) as ckpt:
        assert ckpt.latest_step() == k
        state, extra = ckpt.restore(state)
    assert RunConfig.from_dict(extra["config"]) == config
    sampler.set_state(extra["sampler"])
    assert int(state.step) == k
    resumed = _train(state, sampler, step_fn, root, k + 1, n)

    assert int(resumed.step) == int(straight.step) == n
    for a, b in zip(jax.tree.leaves(resumed), jax.tree.leaves(straight)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    start = jax.tree.leaves(initial_params(config))
    assert not any(np.array_equal(a, b) for a, b in zip(start, jax.tree.leaves(resumed.params)))


@pytest.mark.parametrize("model_dtype", ["float32", "bfloat16"])
def test_restored_arrays_have_the_targets_dtypes_and_shapes(tmp_path, model_dtype):
    config = dataclasses.replace(TINY, optimizer="adamw", dtype=model_dtype)
    state = init_state(initial_params(config), optimizer_for(config))
    half = state._replace(params=jax.tree.map(lambda x: x.astype(jnp.bfloat16), state.params))
    for i, saved in enumerate([state, half]):
        with RunCheckpoints(tmp_path / f"run{i}", keep=1) as ckpt:
            ckpt.save(1, saved, {})
            restored, _ = ckpt.restore(saved)
        assert jax.tree.structure(restored) == jax.tree.structure(saved)
        for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(saved)):
            assert (a.dtype, a.shape) == (b.dtype, b.shape)
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert {x.dtype for x in jax.tree.leaves(half.params)} == {jnp.dtype(jnp.bfloat16)}


# --------------------------------------------------------------------------- retention


def _small_state(value: float):
    return {"w": jnp.full((3, 4), value, jnp.float32), "step": jnp.int32(int(value))}


def _damage_array_files(step_dir: Path):
    files = [p for p in (step_dir / "state").rglob("*") if p.is_file() and p.stat().st_size > 0]
    assert files
    for p in files:
        p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])


def test_keeps_the_last_k_plus_the_final_step_and_delete_all_removes_the_run(tmp_path):
    directory = tmp_path / "run"
    with RunCheckpoints(directory, keep=2) as ckpt:
        assert ckpt.steps() == [] and ckpt.latest_step() is None
        for step in (10, 20, 30):
            ckpt.save(step, _small_state(step), {"at": step})
        ckpt.save(40, _small_state(40), {"at": 40}, final=True)
        assert ckpt.steps() == [30, 40]
    with RunCheckpoints(directory, keep=2) as ckpt:  # the final mark survives a new manager
        for step in (50, 60, 70):
            ckpt.save(step, _small_state(step), {"at": step})
        assert ckpt.steps() == [40, 60, 70]
        state, extra = ckpt.restore(_small_state(0), step=40)
        assert extra == {"at": 40} and float(state["w"][0, 0]) == 40.0
        state, extra = ckpt.restore(_small_state(0))
        assert extra == {"at": 70} and int(state["step"]) == 70
        ckpt.delete_all()
    assert not directory.exists()


def test_saving_a_step_again_replaces_it(tmp_path):
    with RunCheckpoints(tmp_path / "run", keep=3) as ckpt:
        ckpt.save(5, _small_state(1), {"v": 1})
        ckpt.save(5, _small_state(2), {"v": 2})
        assert ckpt.steps() == [5]
        assert ckpt.restore(_small_state(0))[1] == {"v": 2}


def test_metadata_that_is_not_json_is_refused_before_anything_is_written(tmp_path):
    with RunCheckpoints(tmp_path / "run", keep=3) as ckpt:
        ckpt.save(1, _small_state(1), {"v": 1})
        for bad in ({"v": object()}, {"v": float("nan")}, ["not", "a", "dict"]):
            with pytest.raises(CheckpointError, match="fix"):
                ckpt.save(2, _small_state(2), bad)
        assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["1"]
        assert ckpt.steps() == [1]


SAVER = """
import sys
import jax.numpy as jnp
from engine.training.checkpoints import RunCheckpoints
ckpt = RunCheckpoints(sys.argv[1], keep=3)
for step in range(1, 100_000):
    ckpt.save(step, {"w": jnp.full((1000, 1000), float(step))}, {"step": step})
"""


def test_kill_9_during_a_save_leaves_only_complete_checkpoints(tmp_path):
    directory = tmp_path / "run"
    root = Path(__file__).resolve().parents[2]
    saver = subprocess.Popen([sys.executable, "-c", SAVER, str(directory)], cwd=root, stderr=subprocess.DEVNULL)
    try:
        for _ in range(6000):  # until a save is in flight after at least two complete ones (at most ~10 min)
            names = [p.name for p in directory.iterdir()] if directory.exists() else []
            if sum(n.isdigit() for n in names) >= 2 and any(n.endswith(".orbax-checkpoint-tmp") for n in names):
                break
            time.sleep(0.1)
        else:
            pytest.fail("the saver never reached a save in flight")
    finally:
        saver.kill()
        saver.wait()
    with RunCheckpoints(directory, keep=3) as ckpt:
        steps = ckpt.steps()
        assert len(steps) >= 2
        for step in steps:
            state, extra = ckpt.restore({"w": jnp.zeros((1000, 1000))}, step)
            assert extra == {"step": step}
            np.testing.assert_array_equal(np.asarray(state["w"]), float(step))


def test_an_unwritable_directory_is_a_one_line_error(tmp_path):
    (tmp_path / "file").write_text("in the way")
    with RunCheckpoints(tmp_path / "file" / "run-1", keep=1) as ckpt:
        with pytest.raises(CheckpointError, match=r"cannot write the checkpoint at step 1 .*fix that path"):
            ckpt.save(1, _small_state(1), {})
        assert ckpt.steps() == []


def test_a_save_killed_midway_is_never_listed_and_is_cleaned_up(tmp_path):
    """A process killed mid-save leaves only orbax's ``<step>.orbax-checkpoint-tmp``
    directory (it renames it to ``<step>`` once complete); copy a complete
    checkpoint there, then cut its files short, to stand for one."""
    directory = tmp_path / "run"
    with RunCheckpoints(directory, keep=3) as ckpt:
        ckpt.save(1, _small_state(1), {"v": 1})
        ckpt.save(2, _small_state(2), {"v": 2})
    partial = directory / "2.orbax-checkpoint-tmp"
    (directory / "2").rename(partial)
    _damage_array_files(partial)
    with RunCheckpoints(directory, keep=3) as ckpt:
        assert ckpt.steps() == [1] and ckpt.latest_step() == 1
        assert ckpt.restore(_small_state(0))[1] == {"v": 1}
        assert partial.exists()  # a reader leaves what may be another process's save in progress
        ckpt.save(3, _small_state(3), {"v": 3})
        assert not partial.exists()  # the writer's first save removes it
        assert ckpt.steps() == [1, 3]


# --------------------------------------------------------------------------- damage


def _flip_a_byte_of_the_array_data(step_dir: Path):
    files = [p for p in (step_dir / "state" / "d").rglob("*") if p.is_file() and p.stat().st_size > 0]
    assert files
    for p in files:
        data = bytearray(p.read_bytes())
        data[len(data) // 2] ^= 0xFF
        p.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "damage",
    [
        _damage_array_files,
        _flip_a_byte_of_the_array_data,
        lambda d: __import__("shutil").rmtree(d / "state"),
        lambda d: [p.write_text("garbage{") for p in (d / "meta").rglob("*") if p.is_file()],
        lambda d: [p.write_bytes(os.urandom(64)) for p in d.rglob("*") if p.is_file()],
    ],
    ids=["truncated", "bit-flip", "missing-dir", "garbage-json", "garbage-everywhere"],
)
def test_damaged_checkpoint_is_a_one_line_error_and_latest_valid_falls_back(tmp_path, damage):
    directory = tmp_path / "run-12"
    with RunCheckpoints(directory, keep=3, name="run 12") as ckpt:
        ckpt.save(200, _small_state(200), {"at": 200})
        ckpt.save(300, _small_state(300), {"at": 300})
    damage(directory / "300")
    with RunCheckpoints(directory, keep=3, name="run 12") as ckpt:
        with pytest.raises(CheckpointError) as e:
            ckpt.restore(_small_state(0), step=300)
        message = str(e.value)
        assert "\n" not in message and "step 300 of run 12" in message and "fix by deleting" in message
        step, state, extra, skipped = ckpt.restore_latest_valid(_small_state(0))
        assert (step, extra, int(state["step"])) == (200, {"at": 200}, 200)
        assert len(skipped) == 1 and "step 300" in skipped[0]


def test_checkpoint_of_another_model_is_a_clear_error(tmp_path):
    with RunCheckpoints(tmp_path / "run", keep=1) as ckpt:
        ckpt.save(1, _small_state(1), {})
        with pytest.raises(CheckpointError, match=r"not of this run's model \(.*\['w'\] is float32\[3, 4\] there"):
            ckpt.restore({"w": jnp.zeros((5, 4)), "step": jnp.int32(0)})
        with pytest.raises(CheckpointError, match=r"\['v'\] is absent there"):
            ckpt.restore({**_small_state(0), "v": jnp.zeros(2)})
        with pytest.raises(CheckpointError, match="no checkpoint at step 7"):
            ckpt.restore(_small_state(0), step=7)
    with RunCheckpoints(tmp_path / "empty", keep=1) as ckpt:
        with pytest.raises(CheckpointError, match="no checkpoint.*from step 0"):
            ckpt.restore_latest_valid(_small_state(0))
    with pytest.raises(CheckpointError, match="keep must be"):
        RunCheckpoints(tmp_path / "x", keep=0)


# --------------------------------------------------------------------------- threads


def test_two_runs_save_concurrently_from_two_threads(tmp_path):
    errors, barrier = [], threading.Barrier(2)

    def worker(run: int):
        try:
            with RunCheckpoints(run_dir(tmp_path, run), keep=2) as ckpt:
                barrier.wait()
                for step in range(1, 7):
                    ckpt.save(step, _small_state(100 * run + step), {"run": run, "step": step})
        except Exception as e:  # reported below, so a failure names its thread
            errors.append((run, repr(e)))

    threads = [threading.Thread(target=worker, args=(run,)) for run in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    for run in (1, 2):
        with RunCheckpoints(run_dir(tmp_path, run), keep=2) as ckpt:
            assert ckpt.steps() == [5, 6]
            for step in (5, 6):
                state, extra = ckpt.restore(_small_state(0), step=step)
                assert extra == {"run": run, "step": step}
                assert int(state["step"]) == 100 * run + step


# --------------------------------------------------------------------------- checksums and epochs


def _xor_64_bytes_of_the_largest_data_file(step_dir: Path):
    big = max((p for p in (step_dir / "state").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    data = bytearray(big.read_bytes())
    for i in range(64):
        data[len(data) // 2 + i] ^= 0x5A
    big.write_bytes(bytes(data))


def _random_state(seed: int):
    rng = np.random.default_rng(seed)
    return {"w": jnp.asarray(rng.normal(size=(256, 256)).astype(np.float32)), "step": jnp.int32(seed)}


def test_a_checksum_catches_damage_the_file_format_does_not(tmp_path, caplog):
    """XOR 64 bytes inside the array data of the newest checkpoint: orbax reads it back
    without complaint (other numbers), the saved SHA-256 does not match, and the restore
    falls back to the older checkpoint with one warning line naming the step."""
    directory = tmp_path / "run-7"
    with RunCheckpoints(directory, keep=3, name="run 7") as ckpt:
        ckpt.save(10, _random_state(10), {"at": 10})
        ckpt.save(20, _random_state(20), {"at": 20})
    _xor_64_bytes_of_the_largest_data_file(directory / "20")
    with RunCheckpoints(directory, keep=3, name="run 7") as ckpt:
        with pytest.raises(CheckpointError, match=r"step 20 of run 7 is damaged \(array \['w'\] does not match its checksum\)"):
            ckpt.restore(_random_state(0), step=20)
        caplog.clear()
        with caplog.at_level("WARNING", logger="engine.training.checkpoints"):
            step, state, extra, skipped = ckpt.restore_latest_valid(_random_state(0))
    assert (step, extra) == (10, {"at": 10})
    np.testing.assert_array_equal(np.asarray(state["w"]), np.asarray(_random_state(10)["w"]))
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "\n" not in warnings[0] and "step 20 of run 7 is damaged" in warnings[0]
    assert len(skipped) == 1


def test_saves_go_under_the_epoch_and_reads_see_every_epoch(tmp_path):
    directory = tmp_path / "run-3"
    with RunCheckpoints(directory, keep=2) as legacy:  # written before epochs: steps in the run folder
        legacy.save(5, _small_state(5), {"at": 5})
    with RunCheckpoints(directory, keep=4, epoch=1) as first:
        first.save(10, _small_state(10), {"at": 10})
        first.save(20, _small_state(20), {"at": 20})
    with RunCheckpoints(directory, keep=4, epoch=3) as stale:  # an owner that lost its lease, far ahead
        stale.save(90, _small_state(90), {"at": 90})
    with RunCheckpoints(directory, keep=2, epoch=4) as mine:
        assert mine.checkpoints() == [(5, -1), (10, 1), (20, 1), (90, 3)]
        assert mine.restore_latest_valid(_small_state(0), max_step=20)[0] == 20  # the recorded step bounds a resume
        mine.save(20, _small_state(20), {"at": 20, "again": True})
        assert mine.restore(_small_state(0), step=20)[1] == {"at": 20, "again": True}  # the newest epoch's
        # older epochs keep only what is among the newest `keep` of all; emptied epoch folders go
        assert mine.checkpoints() == [(20, 4), (90, 3)]
        assert sorted(p.name for p in directory.iterdir()) == ["epoch-3", "epoch-4"]
        mine.save(30, _small_state(30), {"at": 30})
        assert mine.checkpoints() == [(20, 4), (30, 4), (90, 3)] and mine.steps() == [20, 30, 90]
    with RunCheckpoints(directory, keep=2, epoch=3) as stale:
        stale.save(100, _small_state(100), {"at": 100})  # a stale writer never prunes a newer epoch
        assert (directory / "epoch-4" / "30").is_dir()


def _drop_the_checksum_record(step_dir: Path) -> None:
    """Rename the checksum key in the step's metadata file, keeping the JSON valid."""
    path = step_dir / "meta" / "metadata"
    meta = json.loads(path.read_text())
    meta["renamed"] = meta.pop("basis_lab_sha256")
    path.write_text(json.dumps(meta))


@pytest.mark.parametrize("epoch", [None, 1], ids=["run-folder", "epoch-folder"])
def test_a_current_checkpoint_without_its_checksum_record_is_damaged(tmp_path, epoch):
    """The checksum key renamed and the data changed: not restored unchecked (as a
    checkpoint from before checksums would be) but refused, and the older one is taken."""
    directory = tmp_path / "run-4"
    with RunCheckpoints(directory, keep=3, name="run 4", epoch=epoch) as ckpt:
        ckpt.save(10, _random_state(10), {"at": 10})
        ckpt.save(20, _random_state(20), {"at": 20})
    step_dir = directory / ("20" if epoch is None else f"epoch-{epoch}/20")
    _drop_the_checksum_record(step_dir)
    _xor_64_bytes_of_the_largest_data_file(step_dir)
    with RunCheckpoints(directory, keep=3, name="run 4", epoch=epoch) as ckpt:
        with pytest.raises(CheckpointError, match=r"step 20 of run 4 is damaged \(its checksum record .* is missing\)"):
            ckpt.restore(_random_state(0), step=20)
        step, state, extra, skipped = ckpt.restore_latest_valid(_random_state(0))
    assert (step, extra) == (10, {"at": 10}) and len(skipped) == 1
    np.testing.assert_array_equal(np.asarray(state["w"]), np.asarray(_random_state(10)["w"]))


def test_a_checkpoint_of_the_format_before_checksums_is_restored_unchecked(tmp_path):
    """Written as before checksums (orbax alone, no record, no declared format, in the run
    folder): it is still restored."""
    import orbax.checkpoint as ocp

    from engine.training.checkpoints import folders

    directory = tmp_path / "run-5"
    old = folders.open_manager(directory)
    old.save(7, args=ocp.args.Composite(state=ocp.args.StandardSave(_small_state(7)), meta=ocp.args.JsonSave({"at": 7})),
             custom_metadata={"basis_lab_final": False}, force=True)
    old.wait_until_finished()
    old.close()
    with RunCheckpoints(directory, keep=3) as ckpt:
        state, extra = ckpt.restore(_small_state(0))
    assert extra == {"at": 7} and int(state["step"]) == 7


def _remove(step_dir: Path, *names: str) -> None:
    for name in names:
        path = step_dir / name
        __import__("shutil").rmtree(path) if path.is_dir() else path.unlink()


@pytest.mark.parametrize("damage", [
    lambda d: _remove(d, *[f"state/ocdbt.process_0/d/{p.name}" for p in (d / "state/ocdbt.process_0/d").iterdir()]),
    lambda d: _remove(d, "state/ocdbt.process_0"),
    lambda d: _remove(d, "state/manifest.ocdbt"),
    lambda d: _remove(d, "state/_METADATA"),
    _damage_array_files,
], ids=["data-files-deleted", "process-folder-deleted", "manifest-deleted", "array-metadata-deleted", "truncated"])
def test_deleted_or_truncated_files_are_one_line_and_nothing_of_orbax(tmp_path, damage, caplog, capfd, monkeypatch):
    """Whatever orbax logs or leaves behind while it fails to read the files (its reads
    still in flight: tracebacks Python prints as "Exception ignored in") is not shown: one
    warning line, ours, and nothing on stderr."""
    import gc

    leftovers = []
    monkeypatch.setattr(sys, "unraisablehook", leftovers.append)  # what Python would print
    directory = tmp_path / "run-6"
    with RunCheckpoints(directory, keep=3, name="run 6", epoch=2) as ckpt:
        ckpt.save(10, _random_state(10), {"at": 10})
        ckpt.save(20, _random_state(20), {"at": 20})
    damage(directory / "epoch-2" / "20")
    capfd.readouterr()
    caplog.clear()
    with caplog.at_level("WARNING"), RunCheckpoints(directory, keep=3, name="run 6", epoch=2) as ckpt:
        step, _, extra, skipped = ckpt.restore_latest_valid(_random_state(0))
        time.sleep(0.5)  # orbax's reads still in flight when it gave up finish meanwhile
        gc.collect()
    assert (step, extra) == (10, {"at": 10}) and len(skipped) == 1
    lines = [r.getMessage() for r in caplog.records if r.levelno >= 30]
    assert len(lines) == 1 and "\n" not in lines[0] and "step 20 of run 6" in lines[0], lines
    assert capfd.readouterr().err == "" and leftovers == []


def test_borrowed_folders_are_read_but_never_pruned_or_deleted(tmp_path):
    """A copy's run reads the checkpoints its original keeps (its own first for a step)
    and saves, prunes and deletes only in its own folder."""
    original, mine = tmp_path / "run-8", tmp_path / "db-copy" / "run-8"
    with RunCheckpoints(original, keep=2, epoch=1) as ckpt:
        for step in (10, 20, 30):
            ckpt.save(step, _small_state(step), {"at": step, "by": "original"})
    theirs = sorted(p.name for p in (original / "epoch-1").iterdir())
    assert theirs == ["20", "30"]
    with RunCheckpoints(mine, keep=1, epoch=2, borrowed=[original]) as ckpt:
        assert ckpt.steps() == [20, 30] and ckpt.checkpoints() == []
        assert ckpt.restore_latest_valid(_small_state(0), max_step=20)[2] == {"at": 20, "by": "original"}
        ckpt.save(30, _small_state(30), {"at": 30, "by": "copy"})
        ckpt.save(40, _small_state(40), {"at": 40, "by": "copy"})
        assert ckpt.checkpoints() == [(40, 2)] and ckpt.steps() == [20, 30, 40]  # its own 30 pruned (keep 1)
        assert ckpt.restore(_small_state(0), step=30)[1]["by"] == "original"
        ckpt.save(30, _small_state(30), {"at": 30, "by": "copy"}, final=True)
        assert ckpt.restore(_small_state(0), step=30)[1]["by"] == "copy"  # its own first
        ckpt.delete_all()
    assert not mine.exists() and sorted(p.name for p in (original / "epoch-1").iterdir()) == theirs


def test_an_owner_opens_them_as_it_trusts_them(tmp_path):
    """``resume_limit`` bounds what a resume sees (-1: nothing), ``guard`` may refuse a save
    (nothing is written then), ``on_saved`` hears of every complete save."""
    directory = tmp_path / "run-9"
    with RunCheckpoints(directory, keep=3, epoch=1) as ckpt:
        for step in (10, 20, 30):
            ckpt.save(step, _small_state(step), {"at": step})
    with RunCheckpoints(directory, keep=3, epoch=2, resume_limit=20) as ckpt:
        assert ckpt.steps() == [10, 20, 30] and ckpt.latest_step() == 20
        step, _, extra, _ = ckpt.restore_latest_valid(_small_state(0))
        assert (step, extra) == (20, {"at": 20})
    with RunCheckpoints(directory, keep=3, epoch=2, resume_limit=-1) as ckpt:
        assert ckpt.latest_step() is None

    class Refused(Exception):
        pass

    guarded, saved = [], []

    def guard(step):
        guarded.append(step)
        if step > 40:
            raise Refused(step)

    with RunCheckpoints(directory, keep=5, epoch=3, guard=guard, on_saved=saved.append) as ckpt:
        ckpt.save(40, _small_state(40), {"at": 40})
        with pytest.raises(Refused):
            ckpt.save(50, _small_state(50), {"at": 50})
        assert guarded == [40, 50] and saved == [40]
        assert ckpt.checkpoints()[-1] == (40, 3) and 50 not in ckpt.steps()
    assert not (directory / "epoch-3" / "50").exists()
