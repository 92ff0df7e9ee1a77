"""The Runs page's TensorBoard download: the ticked runs' event folders as a zip, built only
on click (``engine.runner.tensorboard.tensorboard_zip``), that TensorBoard's own reader reads."""

import dataclasses
import io
import zipfile

import numpy as np
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from engine.runner.tensorboard import folder_name
from tests.support.pages import app, downloads, page, store, url  # noqa: F401 (fixtures)
from tests.support.runs import TINY, fake_run


def test_the_tensorboard_download_zips_the_ticked_runs_event_folders(url, store, downloads, tmp_path):
    ids = [fake_run(store, dataclasses.replace(TINY, rank=r)) for r in (4, 8)]
    fake_run(store, dataclasses.replace(TINY, rank=16))  # not ticked: not in the zip
    at = page(app(selected=ids).run(), "runs")
    assert "TensorBoard (zip)" in [d.label for d in at.get("download_button")]
    with zipfile.ZipFile(io.BytesIO(downloads["basis-runs-tensorboard.zip"]())) as z:
        assert {n.split("/")[1] for n in z.namelist()} == {folder_name(store.runs.get_run(i)) for i in ids}
        z.extractall(tmp_path / "unzipped")
    for run_id in ids:
        acc = EventAccumulator(str(tmp_path / "unzipped" / "basis-runs-tensorboard" / folder_name(store.runs.get_run(run_id))),
                               size_guidance={"scalars": 0})
        acc.Reload()
        want = store.metrics([run_id], names=["val_loss"])
        assert [(e.step, e.value) for e in acc.Scalars("val_loss")] == list(
            zip(want["step"].tolist(), want["value"].astype(np.float32).tolist()))
