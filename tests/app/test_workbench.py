"""What the pages show and keep (issue 29's defects): Compare's default is the latest sweep
alone, one run per seed, and says what holds its common step back; views that hold
across page switches and links; labels from the current state."""

import dataclasses

from app import state
from engine.analysis.summary import one_per_seed, table3
from storage import RunStore
from tests.support.pages import app, figures, page, store, url  # noqa: F401 (fixtures)
from tests.support.runs import SWEEP_A, SWEEP_B, TINY, InSweep, fake_run


def _texts(elements) -> list[str]:
    """The elements' text as the reader sees it (``plain`` escapes Markdown with backslashes)."""
    return [e.value.replace("\\", "") for e in elements]


LONG = dataclasses.replace(TINY, steps=300, eval_interval=30, probe_interval=30)


def _sweeps(store):
    """Sweep A: exact and basis R=8 at seeds 0-2, 300 steps; sweep B, launched later with
    the same config but 30 steps: exact and basis R=8 at seed 0 (duplicates of A's seed 0)."""
    a = [fake_run(InSweep(store, SWEEP_A), dataclasses.replace(LONG, estimator=e, rank=8, seed=s))
         for s in range(3) for e in ("exact", "basis")]
    b = [fake_run(InSweep(store, SWEEP_B), dataclasses.replace(LONG, estimator=e, rank=8, seed=0, steps=30))
         for e in ("exact", "basis")]
    return a, b


def test_one_run_stands_for_each_seed_the_furthest_trained(tmp_path):
    store = RunStore(f"sqlite:///{tmp_path / 'dup.db'}")
    a, b = _sweeps(store)
    records = store.runs.list_runs()
    kept, duplicates = one_per_seed(records)
    assert [r.id for r in kept] == a and duplicates == {b[0]: a[0], b[1]: a[1]}
    longer = fake_run(store, dataclasses.replace(LONG, estimator="exact", seed=0, steps=600))  # trains further
    kept, duplicates = one_per_seed(store.runs.list_runs())
    assert longer in {r.id for r in kept} and duplicates[a[0]] == longer and duplicates[b[0]] == longer
    store.close()


def test_table3_names_the_runs_that_hold_its_step_down(tmp_path):
    store = RunStore(f"sqlite:///{tmp_path / 'held.db'}")
    done = [fake_run(store, dataclasses.replace(LONG, estimator=e, rank=8, seed=0)) for e in ("exact", "basis")]
    behind = fake_run(store, dataclasses.replace(LONG, estimator="basis", rank=8, seed=1), status="running",
                      steps_done=95)
    records = store.runs.list_runs()
    metrics = store.metrics([r.id for r in records])
    t = table3(records, metrics)
    assert set(t["read"]) == {f"Read at step 90, not 300; held back by #{behind} (running, validated to step 90); "
                              "validated there on the interim batches (32 of 256; a run's last step reads them all)."}
    assert not t["read_whole"].any()
    t = table3([r for r in records if r.id in done], metrics)
    assert set(t["read"]) == {"Read at step 300, the furthest any run validated at."} and t["read_whole"].all()
    store.close()


def test_compare_by_default_shows_the_latest_sweep_alone(url, store):
    a, b = _sweeps(store)
    at = page(app().run(), "compare")
    assert at.session_state[state.SELECTED] == b  # not sweep A's runs of the same config
    assert at.session_state["compare.sweep"] == SWEEP_B
    assert any(SWEEP_B in c and "latest sweep" in c for c in _texts(at.caption))
    assert dict(at.query_params).get("sweep") in (SWEEP_B, [SWEEP_B])  # the default is a link too


def test_compare_counts_each_seed_once_and_reads_table3_where_the_runs_reached(url, store):
    """All eight runs selected: sweep B's two are duplicates of A's seed 0, named and left
    out, so each curve pools 3 seeds (not "3/3 runs" with a duplicate) and Table 3 reads
    every method at step 300, not at B's step 30."""
    a, b = _sweeps(store)
    at = page(app(selected=a + b).run(), "compare")
    assert any(f"#{b[0]} (see #{a[0]})" in c and f"#{b[1]} (see #{a[1]})" in c for c in _texts(at.caption))
    val = figures(at)["Validation loss"]
    names = sorted(t["name"] for t in val["data"] if t.get("showlegend") is not False)
    assert names == ["basis R=8 · mean of 3 seeds", "exact · mean of 3 seeds"], names
    table = at.dataframe[0].value
    assert table["step"].tolist() == ["300", "300"] and table["seeds"].tolist() == [3, 3], table
    assert not any("Read at step" in i for i in _texts(at.info))


def test_compare_says_which_runs_hold_the_common_step_back(url, store):
    a, _ = _sweeps(store)
    behind = fake_run(InSweep(store, SWEEP_A), dataclasses.replace(LONG, estimator="basis", rank=8, seed=3),
                      status="running", steps_done=100)
    at = page(app(selected=[*a, behind]).run(), "compare")
    note = next(i for i in _texts(at.info) if "Read at step" in i)
    assert "Read at step 90, not 300" in note and f"#{behind} (running, validated to step 90)" in note, note
    assert at.dataframe[0].value["step"].tolist() == ["90", "90"]


def test_compare_reads_no_verdict_while_a_run_has_only_its_step_0(url, store):
    """A live sweep: one basis run has validated only its initial parameters. Compare says the
    table is not trained yet and which run holds it, and no row reads a verdict."""
    a, _ = _sweeps(store)
    starting = fake_run(InSweep(store, SWEEP_A), dataclasses.replace(LONG, estimator="basis", rank=8, seed=3),
                        status="running", steps_done=0)
    at = page(app(selected=[*a, starting]).run(), "compare")
    note = next(i for i in _texts(at.info) if "Not trained yet" in i)
    assert f"#{starting} (running, validated to step 0)" in note, note
    table = at.dataframe[0].value
    assert table["step"].tolist() == ["0", "0"] and table["verdict"].tolist() == ["reference", "not trained yet"]
    assert table["Δ val vs exact"].tolist() == ["—", "—"]


def test_a_compare_link_keeps_the_step_the_quantity_and_per_layer(url, store):
    """The rank figure's step and quantity and the per-layer cosine chart go into the URL
    when changed, and a link with them opens the page showing exactly that."""
    a, _ = _sweeps(store)
    behind = fake_run(InSweep(store, SWEEP_A), dataclasses.replace(LONG, estimator="basis", rank=8, seed=3),
                      status="running", steps_done=100)
    at = app()
    at.query_params.update({"runs": ",".join(map(str, [*a, behind]))})
    at.switch_page("views/compare.py").run()
    at.select_slider(key="compare.at").set_value(300).run()
    at.radio(key="compare.rank_quantity").set_value("cos_mean").run()
    at.toggle(key="compare.per_layer").set_value(True).run()
    assert not at.exception, [e.value for e in at.exception]
    written = {k: (v[0] if isinstance(v, list) else v) for k, v in dict(at.query_params).items()}
    assert {k: written.get(k) for k in ("at", "q", "layers")} == {"at": "300", "q": "cos_mean", "layers": "1"}
    assert at.dataframe[0].value["step"].tolist() == ["300", "300"]

    shared = app()  # a colleague opens the link
    shared.query_params.update(written)
    shared.switch_page("views/compare.py").run()
    assert not shared.exception, [e.value for e in shared.exception]
    assert shared.select_slider(key="compare.at").value == 300
    assert shared.radio(key="compare.rank_quantity").value == "cos_mean"
    assert shared.toggle(key="compare.per_layer").value is True
    assert "Cosine per sketched layer" in figures(shared) and "Mean cosine against rank R" in figures(shared)
    assert shared.dataframe[0].value["step"].tolist() == ["300", "300"]


def test_the_diagnosis_selector_shows_no_status_that_can_go_stale(url, store):
    """The selector's choices are drawn with the page; a status in them stayed "queued"
    above finished results. They name what each diagnosis measures; the status is the live
    part's, read from the current state."""
    from tests.app.test_diagnosis_page import RESULT

    run_id = fake_run(store, TINY)
    diag = store.diagnostics.create_diagnostic(run_id, 0, {"step": 0, "initial": True, "estimators": ["basis"], "ranks": [4],
                                               "lams": [0.0], "keys": 8, "batches": 1})
    at = page(app(selected=[run_id]).run(), "diagnosis")
    selector = at.selectbox(key="diagnosis.diag")
    assert selector.value == diag
    assert not any(word in option for option in selector.options
                   for word in ("queued", "running", "finished", "cancelled", "failed")), selector.options
    assert any("○ queued" in m for m in _texts(at.markdown))

    store.diagnostics.claim_diagnostic(diag, "elsewhere:1")
    store.diagnostics.add_diagnostic_results(diag, [RESULT])
    store.diagnostics.set_diagnostic_status(diag, "finished")
    at.run()
    assert any("✓ finished" in m for m in _texts(at.markdown)) and not any("queued" in m for m in _texts(at.markdown))
