"""The dashboard shows what a run trains on: device count and kind; memory per device."""

import os

import pandas as pd

from app import form, tables
from engine.config import RunConfig
from storage import RunStore
from tests.support.pages import app, page, plots, url  # noqa: F401 (fixtures)
from tests.support.runs import TINY, fake_run


def test_device_parts_read_count_and_kind():
    assert tables.device_parts("gpu: NVIDIA H200 × 4") == (4, "gpu: NVIDIA H200")
    assert tables.device_parts("cpu: cpu") == (1, "cpu: cpu")
    assert tables.device_parts(None) == (None, None)


def test_runs_view_has_device_count_and_kind():
    frame = pd.DataFrame({
        "id": [1, 2], "name": ["a", "b"], "sweep_id": [None, None], "tags": [[], []], "status": ["finished"] * 2,
        "estimator": ["exact"] * 2, "rank": [None, None], "lam": [0.0, 0.0], "seed": [0, 0], "preset": ["tiny"] * 2,
        "steps_done": [4, 4], "steps": [4, 4], "owner": ["h:1"] * 2, "worker_id": [None] * 2,
        "last_train_loss": [1.0, 1.0], "last_val_loss": [1.0, 1.0], "last_mean_cos": [None, None],
        "started_at": [pd.Timestamp("2026-01-01", tz="UTC")] * 2, "finished_at": [pd.Timestamp("2026-01-01", tz="UTC")] * 2,
        "checkpoint_step": [4, 4], "notes": ["", ""], "device": ["cpu: cpu", "gpu: NVIDIA H200 × 8"],
    })
    view = tables.runs_view(frame)  # newest first
    assert list(view["devices"]) == [8, 1]
    assert list(view["device"]) == ["gpu: NVIDIA H200", "cpu: cpu"]


def test_launch_form_has_the_devices_group():
    widgets = form.grouped(form.widgets(RunConfig))
    assert [w.name for w in widgets["devices"]] == ["devices", "shard_params", "dw_comm"]
    rank = next(w for ws in widgets.values() for w in ws if w.name == "ranks")
    assert "clipped to the rows on each device" in rank.help


def _on_four_devices(store: RunStore) -> int:
    run_id = fake_run(store, TINY.replace(batch_size=4, devices=4))
    store.runs.set_device(run_id, "cpu: cpu × 4")
    return run_id


def test_runs_page_and_detail_show_devices(url):  # noqa: F811
    store = RunStore(os.environ["BASIS_LAB_DB_URL"])
    try:
        run_id = _on_four_devices(store)
        at = page(app().run(), "runs")
        table = at.dataframe[0].value
        assert table.loc[table["id"] == run_id, "devices"].iloc[0] == 4
        assert table.loc[table["id"] == run_id, "device"].iloc[0] == "cpu: cpu"
        at.session_state["detail.run"] = run_id
        page(at, "detail")
        env = at.dataframe[1].value
        items = dict(zip(env["item"], env["value"]))
        assert items["devices"] == "4" and items["device"] == "cpu: cpu"
        titles = [c["spec"] for c in plots(at)]
        assert any("Activation memory per device" in t for t in titles)
    finally:
        store.close()
