"""Diagnoses of stored runs (engine.runner.diagnosis, `python -m engine diagnose`, the Diagnosis page):
the right state and batches are measured, the numbers are stored and exported, bad input
writes nothing.

One tiny run (MLP layers sketched, so each diagnosis takes seconds) is trained once for
the module with checkpoints at steps 10 and 20.
"""

import os
import threading
from pathlib import Path

import jax
import numpy as np
import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from app import diagnosis_charts as est
from app import state
from engine import data
from engine.analysis.diagnostics import COLUMNS, diagnose
from engine.cli.main import main
from engine.config import ConfigError, RunConfig
from engine.runner import diagnosis
from engine.training.build import initial_params, model_config, optimizer_for
from engine.training.checkpoints import CheckpointError, RunCheckpoints, run_dir
from engine.training.inputs import load_data
from engine.training.steps import init_state
from storage import RunStore
from tests.support.pages import button, figures
from tests.support.runs import fake_run, wait_for

APP = Path(__file__).resolve().parents[2] / "app" / "main.py"
SMALL = dict(estimators=["basis", "crs"], ranks=[4], keys=8, batches=2, chunk=4)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, token_cache):
    """(db url, checkpoint root, run id, config) of a 20-step tiny run checkpointed at 10 and 20."""
    root = tmp_path_factory.mktemp("diagnosis")
    url, ckpt = f"sqlite:///{root / 'lab.db'}", root / "checkpoints"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("BASIS_LAB_CACHE", str(token_cache))
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setenv("BASIS_LAB_CHECKPOINTS", str(ckpt))
        assert main(["run", "--db", url, "--preset", "tiny", "--steps", "20", "--eval-interval", "10",
                     "--checkpoint-interval", "10", "--probe-interval", "0", "--val-batches", "1",
                     "--sketched-layers", "mlp", "--name", "=tiny"]) == 0
    store = RunStore(url)
    run = store.runs.list_runs()[0]
    store.close()
    return url, ckpt, run.id, RunConfig.from_dict(run.config)


@pytest.fixture
def store(trained, monkeypatch):
    url, ckpt, _, _ = trained
    monkeypatch.setenv("BASIS_LAB_DB_URL", url)
    monkeypatch.setenv("BASIS_LAB_CHECKPOINTS", str(ckpt))
    s = RunStore(url)
    yield s
    s.close()


def _direct(config, params, batches, settings):
    return diagnose(model_config(config), params, batches, estimators=settings["estimators"],
                    ranks=settings["ranks"], lams=[config.lam], keys=settings["keys"],
                    key=jax.random.key(0), chunk=settings["chunk"])


def _restored(trained, step):
    """Parameters and sampler of the checkpoint at ``step``, read independently of engine.runner.diagnosis."""
    _, ckpt, run_id, config = trained
    store = RunStore(trained[0])
    uid = store.runs.get_run(run_id).uid
    store.close()
    sampler = data.BatchSampler(load_data(config)[0], config.effective_batch_size, config.effective_seq_len,
                                config.seed)
    with RunCheckpoints(run_dir(ckpt, uid), keep=3) as c:
        state_, extra = c.restore(init_state(initial_params(config), optimizer_for(config)), step)
    sampler.set_state(extra["sampler"])
    return state_.params, sampler


def _same(a: pd.DataFrame, b: pd.DataFrame) -> None:
    a, b = a.reset_index(drop=True), b.reset_index(drop=True)
    assert list(a["layer"]) == list(b["layer"]) and list(a["estimator"]) == list(b["estimator"])
    for c in ("bias2", "bias2_se", "variance", "mse", "cos_mean"):
        np.testing.assert_allclose(a[c].astype(float), b[c].astype(float), rtol=1e-6, err_msg=c)


def test_a_checkpoint_is_measured_on_the_batches_the_run_drew_after_it(trained, store):
    _, _, run_id, config = trained
    results = {}
    for step, used in ((None, 20), (10, 10)):
        diag_id, frame = diagnosis.run_diagnosis(store, run_id, step=step, **SMALL)
        row = store.frames.diagnostics_frame(run_id).set_index("id").loc[diag_id]
        assert row["status"] == "finished" and row["step"] == used
        assert row["settings"]["step"] == used and row["settings"]["initial"] is False
        stored = store.diagnostics.diagnostic_results(diag_id)
        assert set(stored["batches"]) == {2} and set(stored["keys"]) == {8}
        assert list(stored.columns) == list(COLUMNS)
        _same(stored, frame)
        # the same numbers from the checkpoint and sampler restored by hand
        params, sampler = _restored(trained, used)
        batches = [sampler.next() for _ in range(2)]
        _same(frame, _direct(config, params, batches, SMALL))
        results[used] = frame
    # the batches after step 10 are batches 11 and 12 of the run's own sequence
    fresh = data.BatchSampler(load_data(config)[0], config.effective_batch_size, config.effective_seq_len, config.seed)
    for _ in range(10):
        fresh.next()
    _, sampler = _restored(trained, 10)
    for _ in range(2):
        np.testing.assert_array_equal(sampler.next(), fresh.next())
    # and the state matters: step 10 and step 20 differ
    assert not np.allclose(results[10]["mse"], results[20]["mse"], rtol=1e-3)


def test_initial_parameters_when_asked_or_when_there_is_no_checkpoint(trained, store):
    _, _, run_id, config = trained
    other = fake_run(store, RunConfig(preset="tiny", steps=20, sketched_layers="mlp", seed=3))
    settings = dict(estimators=["countsketch", "crs"], ranks=[4], keys=64, batches=1, chunk=32)
    for rid, step, cfg in ((run_id, 0, config), (other, None, RunConfig.from_dict(store.runs.get_run(other).config))):
        plan = diagnosis.plan_diagnosis(store, rid, step=step, **settings)
        assert plan.initial and plan.step == 0
        if step is None:
            assert any("no checkpoint" in n for n in plan.notes)
        diag_id, frame = diagnosis.run_diagnosis(store, rid, step=step, **settings)
        row = store.frames.diagnostics_frame(rid).set_index("id").loc[diag_id]
        assert row["step"] == 0 and row["settings"]["initial"] is True
        fresh = data.BatchSampler(load_data(cfg)[0], cfg.effective_batch_size, cfg.effective_seq_len, cfg.seed)
        _same(frame, _direct(cfg, initial_params(cfg), [fresh.next()], settings))
        # unbiased estimators: b² is zero within 4 of its conservative standard errors
        layers = frame[frame["layer"] != "all"]
        assert (layers["variance"] > 0).all()
        assert (layers["bias2"].abs() <= 4 * layers["bias2_se"]).all(), layers


def test_defaults_validate_and_clip(trained, store):
    _, _, run_id, config = trained
    plan = diagnosis.plan_diagnosis(store, run_id)
    assert plan.step == 20 and plan.estimators == diagnosis.SKETCHED and plan.lams == (config.lam,)
    assert plan.ranks == (1, 4, 16, 64)  # B·T = 64: nothing to clip
    plan = diagnosis.plan_diagnosis(store, run_id, ranks="4, 100, 64, 200")
    assert plan.ranks == (4, 64) and any("clipped" in n for n in plan.notes)
    before = len(store.frames.diagnostics_frame())
    for bad, error in ((dict(step=15), CheckpointError), (dict(estimators="exact"), ConfigError),
                       (dict(estimators="nope"), ConfigError), (dict(ranks="0"), ConfigError),
                       (dict(lams="1.5"), ConfigError), (dict(keys=1), ConfigError), (dict(batches=0), ConfigError)):
        with pytest.raises(error) as e:
            diagnosis.run_diagnosis(store, run_id, **bad)
        assert "\n" not in str(e.value)
    with pytest.raises(CheckpointError, match=r"saved: 10, 20"):
        diagnosis.plan_diagnosis(store, run_id, step=15)
    assert len(store.frames.diagnostics_frame()) == before


def test_a_failure_is_stored_as_one_line_and_a_dead_process_interrupts(trained, store, tmp_path):
    _, _, run_id, _ = trained
    plan = diagnosis.plan_diagnosis(store, run_id, step=10, **SMALL)
    moved = plan.checkpoints.own.parent / "elsewhere"
    plan.checkpoints.own.rename(moved)
    try:
        diag_id = diagnosis.start(store, plan)
        with pytest.raises(CheckpointError):
            diagnosis.execute(store, diag_id, plan)
    finally:
        moved.rename(plan.checkpoints.own)
    row = store.frames.diagnostics_frame(run_id).set_index("id").loc[diag_id]
    assert row["status"] == "failed" and "\n" not in row["error"] and "gone" in row["error"]
    dead = diagnosis.start(store, plan)
    assert store.diagnostics.claim_diagnostic(dead, f"{os.uname().nodename}:999999999")
    assert dead in diagnosis.check_stale_diagnoses(store)
    assert store.frames.diagnostics_frame().set_index("id").loc[dead, "status"] == "interrupted"


def test_cli_diagnose_prints_stores_and_exports_neutralised_csv(trained, store, tmp_path, capsys):
    url, _, run_id, _ = trained
    out = tmp_path / "d.csv"
    argv = ["diagnose", "--db", url, str(run_id), "--step", "10", "--estimators", "basis,crs", "--ranks", "4",
            "--keys", "8", "--batches", "2", "--chunk", "4"]
    assert main([*argv, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "block_0/mlp/fc" in printed and "stored as diagnosis" in printed
    diag_id = int(store.frames.diagnostics_frame(run_id)["id"].max())
    csv = pd.read_csv(out)
    assert set(csv["run_name"]) == {"'=tiny"}  # the run's name starts with '=': neutralised
    assert set(csv["step"]) == {10} and set(csv["diagnostic_id"]) == {diag_id}
    _same(csv[list(COLUMNS)], store.diagnostics.diagnostic_results(diag_id))
    # an existing --out, a bad step, a bad estimator: one line, exit 2, nothing stored
    before = len(store.frames.diagnostics_frame())
    for extra, message in ((["--out", str(out)], "already exists"), (["--step", "15"], "saved: 10, 20"),
                           (["--estimators", "exact"], "exact has no sketch")):
        assert main([*argv, *extra]) == 2  # a repeated flag: argparse keeps the last
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1, err
    assert len(store.frames.diagnostics_frame()) == before
    assert main(["diagnose", "--db", url, "--list", str(run_id)]) == 0
    assert "finished" in capsys.readouterr().out


def test_frames_and_figures(trained, store):
    _, _, run_id, _ = trained
    diag_id, frame = diagnosis.run_diagnosis(store, run_id, estimators=["basis", "proj"], ranks=[1, 64], keys=8,
                                             batches=1, chunk=8)
    assert est.layers(frame) == ["all", "block_0/mlp/fc", "block_0/mlp/proj"]
    curve = est.curve_frame(frame, "all", "bias2")
    bound = curve["value"] <= 2 * curve["se"]
    assert (curve["bound"] == bound).all()
    drawn = curve["value"].clip(lower=0) + 2 * curve["se"]
    drawn = drawn.where(bound, curve["value"])  # the upper bound, or the significant value itself
    assert (curve["y"].isna() == (drawn <= est.ROUND_OFF)).all()  # float32 round-off is off the log axis
    np.testing.assert_allclose(curve["y"].dropna(), drawn[curve["y"].notna()])
    # proj keeps X whole at R = B·T = 64 (k ≥ N): zero variance, left off the log axis
    var = est.curve_frame(frame, "all", "variance").set_index(["estimator", "rank"])
    assert var.loc[("proj", 64), "value"] == 0 and np.isnan(var.loc[("proj", 64), "y"])
    fig = est.mse_figure(frame, "all", split=False)
    assert {t.name for t in fig.data} == {"basis", "proj"} and fig.layout.xaxis.type == "log"
    assert fig.layout.yaxis.ticktext and all("10" in t for t in fig.layout.yaxis.ticktext)  # no bare "2", "5"
    split = est.mse_figure(frame, "block_0/mlp/fc", split=True)
    assert {t.xaxis for t in split.data} == {"x", "x2"}
    table = est.table_at(frame, "all", 1)
    assert list(table.columns) == list(est.TABLE_COLUMNS) and list(table["MSE"]) == sorted(table["MSE"])
    np.testing.assert_allclose(table["MSE"], table["bias²"] + table["variance"], rtol=1e-4)


def test_diagnosis_page_shows_a_diagnosis_and_starts_one_in_the_background(trained, store):
    url, _, run_id, _ = trained
    diag_id, _ = diagnosis.run_diagnosis(store, run_id, step=20, **SMALL)
    try:
        at = AppTest.from_file(str(APP), default_timeout=120)
        at.switch_page("views/diagnosis.py").run()
        assert not at.exception, [e.value for e in at.exception]
        at.selectbox(key="diagnosis.run").set_value(run_id).run()
        at.selectbox(key="diagnosis.diag").set_value(diag_id).run()
        assert not at.exception, [e.value for e in at.exception]
        assert any("at its checkpoint at step 20" in m.value for m in at.markdown)
        assert any("Relative MSE against R" in t for t in figures(at))
        table = at.dataframe[0].value
        assert set(table["estimator"]) == {"basis", "crs"}
        before = set(store.frames.diagnostics_frame(run_id)["id"])
        at.selectbox(key=f"diagnosis.step.{run_id}").set_value(10)
        at.multiselect(key=f"diagnosis.which.{run_id}").set_value(["crs"])
        at.text_input(key=f"diagnosis.ranks.{run_id}").set_value("2")
        at.number_input(key=f"diagnosis.keys.{run_id}").set_value(8)
        at.number_input(key=f"diagnosis.batches.{run_id}").set_value(1)
        button(at, "Run diagnosis").click().run()
        assert not at.exception and not at.error, [e.value for e in at.error]
        new = set(store.frames.diagnostics_frame(run_id)["id"]) - before
        assert len(new) == 1
        new_id = new.pop()
        wait_for(lambda: store.frames.diagnostics_frame(run_id).set_index("id").loc[new_id, "status"] == "finished", 300)
        at.run()
        assert at.selectbox(key="diagnosis.diag").value == new_id
        assert any("at its checkpoint at step 10" in m.value for m in at.markdown)
        assert set(at.dataframe[0].value["estimator"]) == {"crs"}
        at.text_input(key=f"diagnosis.ranks.{run_id}").set_value("0")
        n = len(store.frames.diagnostics_frame(run_id))
        button(at, "Run diagnosis").click().run()
        assert any("ranks" in e.value for e in at.error)
        assert len(store.frames.diagnostics_frame(run_id)) == n
    finally:
        state._lab(url).close(cancel_running=True)
        state._lab.clear()


# ----------------------------------------------------------------------------- cost, cancel, delete, run again


def test_a_cancelled_diagnosis_keeps_its_partial_results_equal_to_the_batches_done(trained, store):
    """Cancelled after 2 of 6 (batch, setting) steps: both settings have done batch 1,
    and the stored rows are exactly a diagnosis of that one batch."""
    _, _, run_id, config = trained
    plan = diagnosis.plan_diagnosis(store, run_id, step=10, **{**SMALL, "batches": 3})
    assert (plan.work, plan.sketches) == (6, 6 * 8)
    assert plan.cost_text() == "2 estimators × 1 rank × 1 λ × 8 keys × 3 batches = 48 sketched dW per sketched layer"
    diag_id = diagnosis.start(store, plan)
    cancel = threading.Event()
    frame = diagnosis.execute(store, diag_id, plan, cancel=cancel,
                              on_progress=lambda done, total: cancel.set() if done == 2 else None)
    row = store.frames.diagnostics_frame(run_id).set_index("id").loc[diag_id]
    assert row["status"] == "cancelled" and "after 2 of 6" in row["error"]
    stored = store.diagnostics.diagnostic_results(diag_id)
    assert len(stored) == len(frame) > 0 and set(stored["batches"]) == {1}
    cfg, params, batches = diagnosis.load_inputs(store, plan)
    one = diagnose(cfg, params, batches[:1], estimators=plan.estimators, ranks=plan.ranks, lams=plan.lams,
                   keys=plan.keys, key=jax.random.key(plan.seed), chunk=plan.chunk)
    _same(stored, one)


def test_cli_cancels_a_diagnosis_another_process_computes_then_runs_it_again_and_deletes_it(trained, store, capsys):
    from engine.runner.jobs import JobManager

    url, _, run_id, _ = trained
    manager = JobManager(store)
    try:
        diag_id = manager.diagnose(run_id, step=20, estimators=["basis"], ranks=[2], keys=8, batches=200, chunk=4)
        wait_for(lambda: (manager.diagnosis_progress(diag_id) or (0, 0))[0] >= 1, 300)
        assert main(["diagnose", "--db", url, "--cancel", str(diag_id)]) == 0
        assert "cancel requested" in capsys.readouterr().out
        wait_for(lambda: store.frames.diagnostics_frame(run_id).set_index("id").loc[diag_id, "status"] == "cancelled", 120)
    finally:
        manager.shutdown()
    kept = store.diagnostics.diagnostic_results(diag_id)
    assert not kept.empty and 1 <= kept["batches"].max() < 200  # what it measured before it stopped
    assert main(["diagnose", "--db", url, "--cancel", str(diag_id)]) == 0
    assert "already ended" in capsys.readouterr().out

    before = set(store.frames.diagnostics_frame()["id"])
    small = diagnosis.plan_diagnosis(store, run_id, step=10, **SMALL)
    original = diagnosis.start(store, small)
    diagnosis.execute(store, original, small)
    assert main(["diagnose", "--db", url, "--rerun", str(original)]) == 0
    captured = capsys.readouterr()
    assert "cost: 2 estimators × 1 rank × 1 λ × 8 keys × 2 batches" in captured.err
    [again] = set(store.frames.diagnostics_frame()["id"]) - before - {original}
    settings = store.frames.diagnostics_frame().set_index("id")["settings"]
    assert settings[again] == settings[original]
    _same(store.diagnostics.diagnostic_results(again), store.diagnostics.diagnostic_results(original))  # same keys, same numbers

    assert main(["diagnose", "--db", url, "--delete", str(again)]) == 0
    assert again not in set(store.frames.diagnostics_frame()["id"]) and store.diagnostics.diagnostic_results(again).empty
    assert main(["diagnose", "--db", url, "--delete", str(again)]) == 2
    assert "no diagnosis" in capsys.readouterr().err
