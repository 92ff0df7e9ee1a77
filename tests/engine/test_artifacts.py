"""A run's checkpoints as files (``engine.runner.artifacts``): listed with step, epoch and
size from the run's folders, and the newest archived as a tar of its folder."""

from __future__ import annotations

import tarfile

import jax.numpy as jnp
import numpy as np
import pytest

from engine.runner.artifacts import archive, archive_bytes, folder_bytes, run_checkpoints
from engine.runner.paths import run_folders
from engine.training.checkpoints import CheckpointError
from tests.support.runs import new_run


def _state(value: float):
    noise = np.random.default_rng(int(value)).standard_normal((64, 64)).astype(np.float32)  # incompressible
    return {"w": jnp.asarray(noise), "step": jnp.int32(int(value))}


def test_checkpoints_are_listed_by_step_with_their_size_and_the_newest_archives(store, tmp_path):
    run = store.runs.get_run(new_run(store, "r"))
    assert run_checkpoints(store, run, tmp_path) == []  # never saved
    folders = run_folders(store, run.uid, tmp_path)
    with folders.open(keep=2, epoch=1) as ckpt:
        for step in (10, 20, 30):
            ckpt.save(step, _state(step), {"at": step})
    with folders.open(keep=2, epoch=2) as ckpt:
        ckpt.save(40, _state(40), {"at": 40})
    listed = run_checkpoints(store, run, tmp_path)
    # keep=2: the newest two, across leases (the writer of epoch 2 pruned step 20 of epoch 1)
    assert [(c.step, c.epoch, c.borrowed) for c in listed] == [(30, 1, False), (40, 2, False)]
    newest = listed[-1]
    assert newest.folder == folders.own / "epoch-2" / "40"
    files = [p for p in newest.folder.rglob("*") if p.is_file()]
    assert newest.bytes == sum(p.stat().st_size for p in files) == folder_bytes(newest.folder)
    assert newest.bytes > 64 * 64 * 4 * 0.9  # the array's 16 KiB of noise are in it
    with archive(newest.folder) as out, tarfile.open(fileobj=out) as tar:
        names = {m.name for m in tar.getmembers() if m.isfile()}
        assert names == {"40/" + str(p.relative_to(newest.folder)) for p in files}
        member = sorted(names)[0]
        assert tar.extractfile(member).read() == (newest.folder / member.removeprefix("40/")).read_bytes()
        out.seek(0)
        assert archive_bytes(newest.folder) == out.read()  # what the dashboard's download hands the browser


def test_archiving_a_pruned_checkpoint_says_so(tmp_path):
    with pytest.raises(CheckpointError, match="is gone .*reload the page"):
        archive(tmp_path / "run-x" / "epoch-1" / "10")
