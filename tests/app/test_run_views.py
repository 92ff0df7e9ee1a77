"""Run detail's tags, log and checkpoints (``app.runfiles``), tags in the Runs page's edit
dialog, and the alert toast every page raises once per session for a failed run
(``app.alerts``)."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from app import alerts
from engine.runner.paths import run_folders
from engine.runner.tags import edit_tags
from storage import ALERT
from storage.limits import TAG_MAX
from tests.support.pages import app, button, page, store, url  # noqa: F401 (fixtures)
from tests.support.runs import TINY, fake_run


def _detail(run_id: int):
    at = app(selected=[run_id])
    at.query_params["run"] = str(run_id)
    return page(at, "detail")


def test_tags_are_edited_on_run_detail_and_a_bad_one_is_refused_in_one_line(store):
    run_id = fake_run(store, TINY)
    at = _detail(run_id)
    tags = at.multiselect(key=f"detail.tags.{run_id}")
    tags.set_value(["pilot", "ablation"]).run()
    assert store.runs.get_run(run_id).tags == ["pilot", "ablation"] and not at.error
    at.multiselect(key=f"detail.tags.{run_id}").set_value(["pilot", "x" * (TAG_MAX + 1)]).run()
    [error] = at.error
    assert error.value.startswith("Tags not saved\\: tags\\: ") and f"the most is {TAG_MAX}" in error.value
    assert store.runs.get_run(run_id).tags == ["pilot", "ablation"]  # nothing stored, and the box shows so
    assert at.multiselect(key=f"detail.tags.{run_id}").value == ["pilot", "ablation"]
    store.runs.set_tags(run_id, ["from-the-cli"])  # an edit elsewhere shows on the next run
    at.run()
    assert at.multiselect(key=f"detail.tags.{run_id}").value == ["from-the-cli"]


def test_run_details_config_shows_what_acts_not_the_schemas_placeholders(store):
    """An exact run stores the schema's rank (32) and λ, which it never uses; None means the
    preset's or the schema's default. The table says so, as the report's setup does."""
    run_id = fake_run(store, dataclasses.replace(TINY, estimator="exact", rank=32, lam=0.01))
    at = _detail(run_id)
    config = next(df.value for df in at.dataframe if list(df.value.columns) == ["field", "value"])
    shown = dict(zip(config["field"], config["value"]))
    assert shown["estimator"] == "exact"
    assert shown["rank"] == shown["lam"] == "— (exact backprop sketches nothing)"
    assert shown["batch_size"] == "default (the preset's)" and shown["lr"] == "0.01"
    assert shown["dataset_options"] == "—"


def test_the_runs_edit_dialog_edits_tags(store):
    run_id = fake_run(store, TINY)
    at = app(selected=[run_id]).run()
    button(at, "Rename").click().run()
    box = next(t for t in at.text_input if t.label == "Tags")
    box.input("pilot, , lr-sweep")
    button(at, "Save").click().run()
    assert not at.exception
    assert store.runs.get_run(run_id).tags == ["pilot", "lr-sweep"]


def test_run_details_tag_box_keeps_a_tag_added_elsewhere_meanwhile(store):
    run_id = fake_run(store, TINY)
    at = _detail(run_id)
    edit_tags(store, run_id, add=["from-the-cli"])  # after the page drew the box, before the user picks
    at.multiselect(key=f"detail.tags.{run_id}").set_value(["pilot"]).run()
    assert store.runs.get_run(run_id).tags == ["from-the-cli", "pilot"] and not at.error
    assert at.multiselect(key=f"detail.tags.{run_id}").value == ["from-the-cli", "pilot"]


def test_the_runs_edit_dialog_keeps_a_tag_added_elsewhere_meanwhile(store):
    run_id = fake_run(store, TINY)
    at = app(selected=[run_id]).run()
    button(at, "Rename").click().run()
    edit_tags(store, run_id, add=["from-the-cli"])  # while the dialog is open
    next(t for t in at.text_input if t.label == "Tags").input("pilot")
    button(at, "Save").click().run()
    assert not at.exception
    assert store.runs.get_run(run_id).tags == ["from-the-cli", "pilot"]


def test_run_detail_shows_the_log_from_a_level_up(store):
    run_id = fake_run(store, TINY)
    at = _detail(run_id)
    assert any("No log lines yet" in c.value for c in at.caption)
    store.logs.add_run_logs(run_id, [("info", "claimed by host:1 (lease 1)"), ("warning", "engine.data: slow disk"),
                                (ALERT, "failed: nan at step 5")])
    at.run()
    [code] = [c for c in at.code if "claimed by" in c.value]
    assert [line.split("  ", 1)[1].split()[0] for line in code.value.splitlines()] == ["INFO", "WARNING", "ALERT"]
    at.segmented_control(key="detail.log_level").set_value("error").run()
    [code] = [c for c in at.code if "nan at step" in c.value]
    assert "slow disk" not in code.value and "claimed" not in code.value


def test_run_detail_lists_checkpoints_when_opened_with_the_newest_to_download(store, url, monkeypatch):
    monkeypatch.delenv("BASIS_LAB_CHECKPOINTS", raising=False)
    run_id = fake_run(store, TINY)
    run = store.runs.get_run(run_id)
    with run_folders(store, run.uid).open(keep=3, epoch=1) as ckpt:
        for step in (10, 20):
            ckpt.save(step, {"w": jnp.asarray(np.ones((8, 8), np.float32) * step)}, {})
    at = _detail(run_id)
    assert not any(b.label.startswith("Download the newest") for b in at.get("download_button"))  # closed: not read
    at.session_state["detail.checkpoints"] = True
    at.run()
    frame = next(df.value for df in at.dataframe if "lease" in df.value.columns)
    assert frame["step"].tolist() == [20, 10] and frame["lease"].tolist() == [1, 1]
    labels = [b.proto.label for b in at.get("download_button")]
    assert any(label.startswith("Download the newest (step 20, ") and label.endswith("tar)") for label in labels)


def test_a_failed_run_raises_one_toast_per_session_on_any_page(store):
    old = fake_run(store, TINY)
    store.logs.add_run_logs(old, [(ALERT, "failed: an old failure")])
    at = page(app(), "runs")
    assert not at.toast  # what failed before the session opened is not announced
    bad = fake_run(store, TINY)
    store.logs.add_run_logs(bad, [("info", "claimed"), (ALERT, "failed: training loss became nan at step 5")])
    page(at, "compare")
    [toast] = [t.value for t in at.toast]
    assert f"Run \\#{bad}" in toast and "nan at step 5" in toast and "old failure" not in toast
    page(at, "launch")
    assert not at.toast  # once per session
    assert at.session_state[alerts.SEEN] == store.logs.last_log_id()
