"""The dashboard's pages under Streamlit's AppTest, on the per-test database of conftest.py.

One test trains real tiny runs from the Launch form; the others write runs the way a
worker (or the CLI in another process) would, which is what the pages read.
"""

import dataclasses
import io
import re

import numpy as np
import pandas as pd
import pytest

from app import form, state
from app.text import plain
from engine.config import RunConfig
from engine.core.estimators import ESTIMATORS
from engine.reads.queries import run_summary
from storage import long_frame, wide_frame
from storage.metrics import MetricsRepository
from tests.support.pages import app, button, downloads, figures, page, plots, store, url  # noqa: F401  (fixtures)
from tests.support.runs import TINY, fake_run, wait_for

# ----------------------------------------------------------------------------- the main flow


def test_launch_from_the_form_watch_compare_and_export(url, store, downloads):
    at = app().run()
    assert not at.exception
    assert "No runs yet" in at.info[0].value
    assert at.get("page_link")[0].proto.page.endswith("launch")

    page(at, "launch")
    at.text_input(key="launch.ranks").input("2, 8")
    at.number_input(key="launch.steps").set_value(6)
    at.number_input(key="launch.eval_interval").set_value(3)
    at.number_input(key="launch.probe_interval").set_value(3)
    at.number_input(key="launch.val_batches").set_value(2)
    at.run()
    assert not at.error
    assert "3 runs to launch" in [s.value for s in at.subheader]
    assert at.dataframe[0].value["run"].tolist() == ["exact s0", "basis R=2 s0", "basis R=8 s0"]
    button(at, "Launch").click().run(timeout=600)
    assert not at.exception and not at.error
    assert at.success[0].value.startswith("Queued 3 runs")
    ids = [r.id for r in store.runs.list_runs()]
    assert len(ids) == 3 and at.session_state[state.SELECTED] == ids

    assert state._lab(url).manager.wait(ids, timeout=900)
    assert [store.runs.get_run(i).status for i in ids] == ["finished"] * 3

    page(at, "runs")
    table = at.dataframe[0].value
    assert table["name"].tolist() == ["basis R=8 s0", "basis R=2 s0", "exact s0"]  # newest first
    assert table["status"].tolist() == ["✓ finished"] * 3 and table["progress"].tolist() == [1.0] * 3
    assert table["steps_done"].tolist() == [6] * 3 and np.isfinite(table["val_loss"]).all()

    page(at, "compare")
    figs = figures(at)
    val = figs["Validation loss"]
    assert [t["name"] for t in val["data"]] == ["exact s0", "basis R=2 s0", "basis R=8 s0"]
    for trace, run_id in zip(val["data"], ids):
        rows = store.metrics([run_id], names=["val_loss"])
        assert trace["x"] == rows["step"].tolist() == [0, 3, 6]
        np.testing.assert_allclose(trace["y"], rows["value"])
    cos = figs["Mean cosine over sketched layers"]
    assert [t["name"] for t in cos["data"]] == ["exact s0", "basis R=2 s0", "basis R=8 s0"]
    assert all(-1 <= y <= 1 for t in cos["data"] for y in t["y"])
    assert all(abs(y - 1) < 1e-5 for y in cos["data"][0]["y"])  # exact: the reference line
    memory = figs["Activation memory per train step, against exact backprop of the same config"]
    ratios = [text for t in memory["data"] for text in t.get("text", []) or [] if text]
    assert ratios and all(re.fullmatch(r"\d\.\d{3}×", text) for text in ratios)
    summary = at.dataframe[0].value
    expected = run_summary(store, ids)
    assert summary["method"].tolist() == ["exact", "basis", "basis"]
    assert summary["rank"].tolist()[1:] == ["2", "8"]
    # Table 3 reads the held-out test split where every run recorded it (at its last step), as these runs did
    assert expected["test_loss"].notna().all() and summary["split"].tolist() == ["test"] * 3
    assert [float(v) for v in summary["test loss"]] == pytest.approx(expected["test_loss"].round(3).tolist(), abs=1e-3)
    assert summary["Δ test vs exact"].iloc[0] == "—" and summary["verdict"].iloc[0] == "reference"
    assert summary["verdict"].tolist()[1:] == ["one seed", "one seed"]  # one seed: no interval

    page(at, "runs")  # the launched runs are still selected: export them
    assert [d.label for d in at.get("download_button")] == ["Back up the database", "CSV of 3 runs (long)",
                                                              "TensorBoard (zip)"]
    got = pd.read_csv(io.BytesIO(downloads["basis-runs-long.csv"]()))
    want = long_frame(store, ids)
    assert len(got) == len(want) > 0
    pd.testing.assert_frame_equal(got[["run_id", "step", "metric", "value"]], want[["run_id", "step", "metric", "value"]],
                                  check_dtype=False)
    at.radio(key="runs.csv_format").set_value("wide").run()
    got = pd.read_csv(io.BytesIO(downloads["basis-runs-wide.csv"]()))
    want = wide_frame(store, ids)
    assert list(got.columns) == list(want.columns) and len(got) == len(want)
    assert got["B_seqs"].notna().all() and got["status"].eq("finished").all()  # the dashboard fills the shape
    assert got.loc[got["estimator"] == "exact", "R_rows"].isna().all()
    assert "wall_time_s" in at.get("download_button")[1].help.replace("\\", "")  # the column dictionary is its help
    np.testing.assert_allclose(got["val_loss"], want["val_loss"].astype(float))


# ----------------------------------------------------------------------------- stop and delete


def test_stop_then_delete_a_running_run(url, store):
    manager = state._lab(url).manager
    [run_id] = manager.submit([dataclasses.replace(TINY, steps=100_000, eval_interval=1000, val_batches=1)])
    wait_for(lambda: store.runs.get_run(run_id).status == "running" and store.runs.get_run(run_id).steps_done > 0)
    at = app(selected=[run_id]).run()
    assert at.dataframe[0].value["status"].tolist() == ["▶ running"]
    button(at, "Delete").click().run()
    assert "stop them first" in at.error[0].value
    button(at, "Stop").click().run()
    assert any(f"#{run_id}" in m.value and "(running)" in m.value for m in at.markdown)  # names the run
    assert store.runs.get_run(run_id).status == "running"  # nothing happens before the confirmation
    at.button(key="confirm.stop.ok").click().run()
    wait_for(lambda: store.runs.get_run(run_id).status == "cancelled", timeout=120)
    at.run()
    assert at.dataframe[0].value["status"].tolist() == ["■ cancelled"]

    button(at, "Delete").click().run()
    assert any("Delete 1 run and all their metrics" in m.value for m in at.markdown)
    button(at, "Cancel").click().run()
    assert [r.id for r in store.runs.list_runs()] == [run_id]
    button(at, "Delete").click().run()
    at.button(key="runs.delete.confirm").click().run()
    assert store.runs.list_runs() == [] and store.metrics([run_id]).empty
    assert at.session_state[state.SELECTED] == []
    assert "No runs yet" in at.info[0].value


def test_rename_and_notes(store, url):
    run_id = fake_run(store, TINY)
    at = app(selected=[run_id]).run()
    button(at, "Rename").click().run()
    next(t for t in at.text_input if t.label == "Name").input("warm-up check")
    at.text_area[0].input("lr too high?")
    button(at, "Save").click().run()
    record = store.runs.get_run(run_id)
    assert (record.name, record.notes) == ("warm-up check", "lr too high?")
    assert at.dataframe[0].value["name"].tolist() == ["warm-up check"]


def test_runs_buttons_open_compare_and_detail_and_the_picker_can_be_emptied(url, store):
    ids = [fake_run(store, TINY), fake_run(store, dataclasses.replace(TINY, rank=8))]
    at = app(selected=[ids[1]]).run()
    button(at, "Compare").click().run()
    assert at.title[0].value == "Compare"
    assert at.multiselect(key="compare.pick").value == [ids[1]]
    at.multiselect(key="compare.pick").set_value([]).run()
    assert "Pick one or more runs" in at.info[0].value and at.session_state[state.SELECTED] == []
    at.multiselect(key="compare.pick").set_value(ids).run()
    assert len([t for t in figures(at)["Validation loss"]["data"]]) == 2
    at.multiselect(key="compare.pick").set_value([ids[0]]).run()
    page(at, "runs")  # the table shows the selection made on Compare
    assert at.session_state[state.SELECTED] == [ids[0]]
    button(at, "Details").click().run()
    assert at.title[0].value == "Run detail" and at.selectbox(key="detail.pick").value == ids[0]


# ----------------------------------------------------------------------------- the launch form


def _group(at, label):
    return next(e for e in at.expander if e.label == label)


def test_the_estimators_field_wraps_its_chips_and_lists_each_estimator_in_its_help(url, store):
    """The Estimators multiselect has the Method group's width to itself and wraps its chips
    (a column a third wide clipped the second chip at 1,400 px); its help is the registry's
    list, one line per estimator."""
    at = page(app().run(), "launch")
    estimators = at.multiselect(key="launch.estimators")
    assert estimators.proto.wrap
    assert estimators.help == form.estimators_help()
    assert sum(line.startswith("- **") for line in estimators.help.splitlines()) == len(ESTIMATORS)


def test_bad_form_values_show_the_config_message_under_the_fields_label_beside_it(url, store):
    at = page(app().run(), "launch")
    at.text_input(key="launch.lams").input("1.5").run()
    beside = plain("Shrink λ must be in [0, 1) (got 1.5)")
    assert [e.value for e in _group(at, "Method").error] == [beside]  # in the field's group, under the field
    assert any(beside in e.value for e in at.error[1:])  # and named in the preview
    assert not [b for b in at.button if b.label.startswith("Launch")]
    at.text_input(key="launch.lams").input("0")
    at.text_input(key="launch.seeds").input("zero").run()
    assert [e.value for e in _group(at, "Method").error] == [plain("Seeds: 'zero' is not a seed (integers >= 0: 0,1,2 or 0-4)")]
    at.text_input(key="launch.seeds").input("0")
    at.number_input(key="launch.steps").set_value(0).run()
    assert [e.value for e in _group(at, "Training").error] == [plain("Steps must be an integer >= 1 (got 0)")]
    at.number_input(key="launch.steps").set_value(10)
    at.selectbox(key="launch.dataset").set_value("files").run()
    assert plain("source 'files' needs path=") in at.error[0].value
    at.text_input(key="launch.path").input("/no/such/corpus.txt").run()
    assert not at.error  # a typed path is looked up only on request
    button(at, "Check data").click().run()
    assert plain("no file matches path='/no/such/corpus.txt'") in at.error[0].value and not at.exception
    at.selectbox(key="launch.dataset").set_value("classics").run()
    assert not at.error and button(at, "Launch")
    assert store.runs.list_runs() == []


def test_launch_guardrails_a_large_launch_is_confirmed_and_a_long_eval_interval_warned(url, store):
    at = page(app().run(), "launch")
    at.text_input(key="launch.seeds").input("0-999").run()
    assert "4,000 runs to launch" in [h.value for h in at.subheader]
    assert any("4,000 runs is more than 100 in one launch" in w.value for w in at.warning)
    advice = [i.value for i in at.info if "cannot decide" in i.value]
    assert len(advice) == 1 and "3 seeds" in advice[0]  # the reproduction's 3 seeds only: 1,000 seeds decide
    launch = button(at, "Launch 4,000 runs")
    assert launch.disabled
    [confirm] = [c for c in at.checkbox if c.key == "launch.confirm_large"]
    assert "estimated total time" in confirm.label
    confirm.check().run()
    assert not button(at, "Launch 4,000 runs").disabled
    at.text_input(key="launch.seeds").input("0").run()
    assert not button(at, "Launch").disabled and not [c for c in at.checkbox if c.key == "launch.confirm_large"]
    # one seed cannot decide whether a method matches exact: said before anything starts (advice, not a block)
    assert any(i.value.startswith(plain("Seeds: 1 seed cannot decide whether a method matches exact backprop"))
               for i in at.info)

    at.number_input(key="launch.steps").set_value(30)
    at.number_input(key="launch.eval_interval").set_value(50).run()
    beside = plain("Eval interval 50 is more than the 30 steps: the run validates only at step 0 and at its last step")
    assert beside in [w.value for w in _group(at, "Training").warning]
    assert beside in [w.value for w in at.warning]  # also in the preview
    assert store.runs.list_runs() == []


def test_paper_button_fills_the_papers_settings_and_history_gives_an_estimate(url, store):
    paper = RunConfig(preset="paper", steps=40, eval_interval=10, probe_interval=10, lam=0.01)
    for config in [dataclasses.replace(paper, estimator="exact", lam=0.0)] + [dataclasses.replace(paper, rank=r) for r in (1, 8, 16, 32, 64)]:
        fake_run(store, config)
    at = page(app().run(), "launch")
    button(at, "Paper settings").click().run()
    s = at.session_state
    assert (s["launch.preset"], s["launch.lams"], s["launch.lr"], s["launch.momentum"], s["launch.optimizer"]) == ("paper", "0.01", 0.01, 0.9, "sgd")
    assert (s["launch.steps"], s["launch.eval_interval"], s["launch.ranks"]) == (50_000, 1000, "1, 8, 16, 32, 64")
    assert "18 runs to launch" in [h.value for h in at.subheader]  # the paper's grid over seeds 0, 1, 2
    estimate = next(m.value for m in at.markdown if m.value.startswith("Estimated time"))
    assert "≈" in estimate and "h" in estimate  # 50,000 steps a run at 64 ms a step
    assert any("(timed by earlier runs)" in c.value for c in at.caption)


def test_form_values_survive_a_page_switch(url):
    at = page(app().run(), "launch")
    at.number_input(key="launch.steps").set_value(123).run()
    page(at, "runs")
    page(at, "launch")
    assert at.number_input(key="launch.steps").value == 123


# ----------------------------------------------------------------------------- compare, detail, empty states


def test_compare_pools_seeds_and_draws_the_memory_breakdown(url, store):
    ids = [fake_run(store, dataclasses.replace(TINY, estimator="exact", seed=s), breakdown=True) for s in (0, 1)]
    ids += [fake_run(store, dataclasses.replace(TINY, rank=8, seed=s), breakdown=True) for s in (0, 1)]
    at = page(app(selected=ids).run(), "compare")
    figs = figures(at)
    val = figs["Validation loss"]
    lines = [t for t in val["data"] if t.get("showlegend") is not False]
    assert [t["name"] for t in lines] == ["exact · mean of 2 seeds", "basis R=8 · mean of 2 seeds"]
    assert sum(t.get("fill") == "tonexty" for t in val["data"]) == 2
    assert "Saved for backward, by category" in figs
    summary = at.dataframe[0].value
    assert summary["seeds"].tolist() == [2, 2] and "±" in summary["val loss"].iloc[1]
    at.toggle(key="compare.pool").set_value(False).run()
    lines = figures(at)["Validation loss"]["data"]
    assert [t["name"] for t in lines] == ["exact s0", "exact s1", "basis R=8 s0", "basis R=8 s1"]
    at.toggle(key="compare.per_layer").set_value(True).run()
    layers = next(f for f in figures(at).values() if len(f["layout"].get("annotations", [])) == 3)
    titles = [a["text"].replace("<br>", "") for a in layers["layout"]["annotations"]]  # wrapped at "/" to fit 420 px
    assert titles == ["block_0/mlp/fc", "block_0/mlp/proj", "head"]


def test_compare_reads_only_new_metric_rows_on_refresh(url, store, monkeypatch):
    ids = [fake_run(store, dataclasses.replace(TINY, seed=s)) for s in range(3)]
    reads = []
    original = MetricsRepository.metrics_after

    def spy(self, marks, *, names=None):
        rows = original(self, marks, names=names)
        reads.append((dict(marks), len(rows)))
        return rows

    total = len(store.metrics(ids))
    marks = {i: int(store.metrics([i])["id"].max()) for i in ids}
    monkeypatch.setattr(MetricsRepository, "metrics_after", spy)  # store.metrics reads through it too: ask before
    at = page(app(selected=ids).run(), "compare")
    # the first read takes the metrics the page draws, not every stored row (tests/app/test_compare_reads.py)
    assert len(reads) == 1 and reads[0][0] == {i: 0 for i in ids} and 0 < reads[0][1] < total
    store.metrics.add_metrics(ids[0], [(41, 1.0, "val_loss", 5.0)])
    newest = int(original(store.metrics, {ids[0]: marks[ids[0]]})["id"].max())
    at.run()
    at.select_slider(key="compare.at").set_value(20).run()
    # a refresh reads only rows past those it holds (its marks: the newest drawn row of each run); the step none
    assert [n for _, n in reads[1:]] == [1, 0] and reads[2][0][ids[0]] == newest
    assert all(reads[1][0][i] <= marks[i] for i in ids) and reads[2][0] == {**reads[1][0], ids[0]: newest}
    assert at.dataframe[0].value["step"].tolist() == ["20"]


def test_detail_shows_the_error_config_and_environment(url, store):
    run_id = fake_run(store, TINY, status="failed", steps_done=20,
                      error="TrainingDiverged: training loss became nan at step 21; lower lr (now 0.01)\ntraceback line")
    at = app().run()
    at.session_state["detail.run"] = run_id
    page(at, "detail")
    assert "training loss became nan at step 21" in at.error[0].value
    assert "traceback line" in at.code[0].value
    config, env = (d.value for d in at.dataframe)
    assert dict(zip(config["field"], config["value"]))["rank"] == "32"
    assert dict(zip(env["item"], env["value"]))["jax version"] == "0.10.2"
    assert len(plots(at)) >= 4


def test_empty_states_point_to_launch(url):
    at = app().run()
    for name in ("runs", "compare", "detail", "diagnosis"):
        page(at, name)
        assert "No runs yet" in at.info[0].value
        assert at.get("page_link")[0].proto.page.endswith("launch")


def test_fifty_runs_and_a_hundred_thousand_rows_render(url, store):
    layers = [f"block_{b}/mlp/{k}" for b in range(4) for k in ("fc", "proj")] + ["head"]
    for i in range(50):
        config = RunConfig(preset="tiny", estimator="exact" if i % 5 == 0 else "basis", rank=[1, 8, 16, 32][i % 4],
                           seed=i // 10, steps=2000, eval_interval=50, probe_interval=10)
        run_id = store.runs.create_run(name=config.label(), config=config.to_dict(), estimator=config.estimator,
                                  rank=config.rank, lam=0.0, seed=config.seed, preset="tiny", steps=2000, status="finished")
        rows = [(s, s / 20, "val_loss", 6 + 4 * np.exp(-s / 400)) for s in range(0, 2001, 50)]
        if not config.is_exact:
            rows += [(s, s / 20, f"{m}/{layer}", 0.5) for s in range(10, 2001, 10) for layer in layers for m in ("cos", "rel_err")]
        store.metrics.add_metrics(run_id, rows)
    ids = [r.id for r in store.runs.list_runs()]
    assert len(store.metrics(ids)) > 100_000
    at = app(selected=ids).run()
    assert len(at.dataframe[0].value) == 50
    page(at, "compare")
    lines = [t["name"] for t in figures(at)["Validation loss"]["data"] if t.get("showlegend") is not False]
    # two runs per method and seed: one stands for each seed (the other is named a duplicate), five seeds pooled
    assert lines == [f"{m} · mean of 5 seeds" for m in ("exact", "basis R=1", "basis R=8", "basis R=16", "basis R=32")]
