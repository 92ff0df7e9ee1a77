"""Issue 43, items 3, 9, 10, 11 and 15, under AppTest: every filter of Runs and the choices of
Diagnosis and Report live in the URL (a link opens the page as its sender left it); the Runs
count is of the rows shown; a link's unusable value is one visible line naming it and the
fix, and leaves the URL; an address that names no page says so and lists the pages; the
interrupted runs are announced beside Resume all, those that never trained a step as such;
Run detail tells the first start from the last resume."""

import dataclasses
from datetime import datetime, timedelta, timezone

import pandas as pd
import pytest

from app import tables, viewstate
from engine.reads import reports
from storage.logs import INFO
from tests.support.pages import app, button, read, store, url  # noqa: F401  (fixtures)
from tests.support.runs import SWEEP_A, SWEEP_B, TINY, InSweep, fake_run

RESULT = {"layer": "all", "estimator": "basis", "rank": 4, "lam": 0.0, "bias2": 1e-3, "bias2_se": 1e-3,
          "variance": 0.5, "mse": 0.5, "cos_mean": 0.7, "keys": 8, "batches": 1}


def _ids(at) -> list[int]:
    return at.dataframe[0].value["id"].tolist()


def _opened(page: str, query: dict):
    at = app()
    at.query_params.update(query)
    at.switch_page(f"views/{page}.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _warnings(at) -> list[str]:
    return [read(w.value) for w in at.warning]


def _lab(store) -> dict[str, int]:
    """Five runs over two sweeps, two estimators, two tags, three statuses."""
    pilot, ablation = InSweep(store, SWEEP_A, ["pilot"]), InSweep(store, SWEEP_B, ["ablation"])
    return {
        "exact": fake_run(pilot, dataclasses.replace(TINY, estimator="exact")),
        "r8": fake_run(pilot, dataclasses.replace(TINY, rank=8), status="failed", steps_done=20, error="boom"),
        "r32": fake_run(pilot, TINY),
        "b8": fake_run(ablation, dataclasses.replace(TINY, rank=8)),
        "b2": fake_run(ablation, dataclasses.replace(TINY, rank=2), status="cancelled", steps_done=10),
    }


# ----------------------------------------------------------------------------- item 3: Runs filters in the URL


def test_every_runs_filter_is_in_the_url_and_a_link_opens_the_same_table(url, store):
    runs = _lab(store)
    at = app().run()
    at.multiselect(key="runs.status").set_value(["finished", "failed"])
    at.multiselect(key="runs.estimator").set_value(["basis"])
    at.multiselect(key="runs.sweep").set_value([SWEEP_A])
    at.multiselect(key="runs.tag").set_value(["pilot"])
    at.text_input(key="runs.search").set_value("R=")
    at.text_input(key="runs.where").set_value("rank >= 8").run()
    assert not at.exception and _ids(at) == [runs["r32"], runs["r8"]]
    link = dict(at.query_params)
    assert link == {"status": ["finished", "failed"], "estimator": "basis", "sweep": SWEEP_A, "tag": "pilot",
                    "search": "R=", "where": "rank >= 8"}, link

    opened = _opened("runs", link)  # a fresh session: what the recipient of the link sees
    assert _ids(opened) == [runs["r32"], runs["r8"]] and not opened.warning
    for key in ("runs.status", "runs.estimator", "runs.sweep", "runs.tag", "runs.search", "runs.where"):
        assert opened.session_state[key] == at.session_state[key], key

    at.multiselect(key="runs.status").set_value([])
    at.multiselect(key="runs.tag").set_value([])
    at.text_input(key="runs.search").set_value("").run()  # a cleared filter leaves the URL
    assert dict(at.query_params) == {"estimator": "basis", "sweep": SWEEP_A, "where": "rank >= 8"}


def test_the_url_holds_a_value_with_a_comma_whole():
    values, problems = viewstate.read_params({"tag": ["a,b", "c"], "status": ["failed"]}, viewstate.RUNS_PARAMS,
                                             {"tag": ["a,b"], "status": ["failed"]})
    assert values["runs.tag"] == ["a,b"] and values["runs.status"] == ["failed"]
    assert problems == ["tag 'c' is on no run"]


def test_compares_group_and_metrics_that_its_runs_lack_are_named_for_compare_to_say():
    view = viewstate.decode({"group": "nonexistent", "metrics": "tokens_per_s,not_a_metric"})
    assert viewstate.unknown_in(view, ["rank", "seed"], ["tokens_per_s", "val_loss"]) == [
        "group='nonexistent' is not a field to colour by; the choices are rank, seed",
        "metrics: 'not_a_metric' is not a metric of these runs; the choices are tokens_per_s, val_loss"]
    assert viewstate.unknown_in(viewstate.decode({"group": "rank"}), ["rank"], []) == []


# ----------------------------------------------------------------------------- item 9: the count is of the rows shown


def test_the_runs_count_is_of_the_rows_the_filter_shows(url, store):
    _lab(store)
    at = app().run()
    assert "3 finished · 1 failed · 1 cancelled · 5 in all" in [c.value for c in at.caption]
    at.multiselect(key="runs.sweep").set_value([SWEEP_B]).run()
    counts = [c.value for c in at.caption if "match the filters" in c.value]
    assert counts == ["1 finished · 1 cancelled · 2 of 5 runs match the filters"], [c.value for c in at.caption]
    assert len(_ids(at)) == 2
    assert tables.count_text(tables.runs_view(store.frames.runs_frame()), 5).endswith("· 5 in all")


# ----------------------------------------------------------------------------- item 10: bad links said, and dropped


@pytest.mark.parametrize("query,said", [
    ({"status": "bogus"}, "The link's status 'bogus' is not a run status; the statuses are queued, running, "
                          "finished, failed, cancelled, interrupted; shown without it."),
    ({"sweep": "nope"}, "The link's sweep 'nope' is not in the database; shown without it."),
    ({"tag": "nope"}, "The link's tag 'nope' is on no run; shown without it."),
    ({"estimator": "nope"}, "The link's estimator 'nope' is no run's estimator; they are basis, exact; shown without it."),
])
def test_a_runs_link_value_that_matches_nothing_is_said_and_dropped(url, store, query, said):
    runs = _lab(store)
    at = _opened("runs", query)
    assert _warnings(at) == [said]
    assert sorted(_ids(at)) == sorted(runs.values())  # the table unfiltered
    assert not set(query) & set(at.query_params)  # and the URL no longer holds it


def test_an_address_that_names_no_page_says_so_and_lists_the_pages(url, store):
    at = app()
    at.context["url"] = "http://localhost:8501/nosuchpage"
    at.run()
    assert not at.exception
    [said] = _warnings(at)
    assert said.startswith("There is no page 'nosuchpage'; the pages are /launch (Launch), /runs (Runs),"), said
    assert not at.title  # not the Runs page, silently
    home = app()
    home.context["url"] = "http://localhost:8501/"
    assert home.run().title[0].value == "Runs"


def test_a_diagnosis_link_opens_its_run_state_and_diagnosis_and_a_bad_one_is_said(url, store):
    a, b = fake_run(store, TINY), fake_run(store, dataclasses.replace(TINY, rank=8))
    diag = store.diagnostics.create_diagnostic(a, 0, {"estimators": ["basis"], "ranks": [4], "lams": [0.0], "keys": 8, "batches": 1})
    store.diagnostics.add_diagnostic_results(diag, [RESULT, {**RESULT, "rank": 8}, {**RESULT, "layer": "head"}])
    store.diagnostics.set_diagnostic_status(diag, "finished")
    at = _opened("diagnosis", {"run": str(a), "state": "0", "diag": str(diag), "layer": "head", "rank": "8",
                               "split": "1"})
    assert not at.warning, _warnings(at)
    assert at.selectbox(key="diagnosis.run").value == a and at.selectbox(key="diagnosis.diag").value == diag
    assert (at.session_state["diagnosis.layer"], at.session_state["diagnosis.rank"],
            at.session_state["diagnosis.split"]) == ("head", 8, True)
    assert dict(at.query_params) == {"run": str(a), "state": "0", "diag": str(diag), "layer": "head", "rank": "8",
                                     "split": "1"}
    at.selectbox(key="diagnosis.layer").set_value("all").run()
    assert at.query_params["layer"] == "all"  # what the page shows now is what a link opens

    gone = _opened("diagnosis", {"run": "99"})
    assert _warnings(gone) == [f"The link's run 99 is not in the database; showing run #{b} instead."]
    assert gone.query_params["run"] == str(b)  # the URL names the run shown, not the missing one
    stateless = _opened("diagnosis", {"run": str(b), "state": "500"})
    assert _warnings(stateless) == [f"The link's state='500' is not a saved state of run #{b}; the choices are 0; "
                                    "New diagnosis starts from its latest state instead."]
    assert stateless.query_params["state"] == "0"


# ----------------------------------------------------------------------------- item 3 and 10: Report


def test_a_report_link_opens_the_build_form_as_left_and_a_bad_sweep_is_said_outside_it(url, store):
    ids = [fake_run(InSweep(store, SWEEP_A, ["pilot"]), dataclasses.replace(TINY, rank=r)) for r in (1, 8)]
    reports.save(store, reports.build(store, reports.selection_of(runs=ids)))  # a stored report: the form is collapsed
    at = _opened("report", {"sweep": SWEEP_A, "at": "20", "margin": "0.05"})
    assert not at.warning, _warnings(at)
    assert (at.session_state["report.how"], at.session_state["report.sweep"], at.session_state["report.at_step"],
            at.session_state["report.margin"]) == ("A sweep", SWEEP_A, 20, 0.05)
    assert {k: at.query_params[k] for k in ("sweep", "at", "margin")} == {"sweep": SWEEP_A, "at": "20", "margin": "0.05"}
    at.radio(key="report.how").set_value("Runs with tags").run()
    at.multiselect(key="report.tags").set_value(["pilot"]).run()
    assert at.query_params["tags"] == "pilot" and "sweep" not in at.query_params

    selected = _opened("report", {"runs": f"{ids[1]},777"})
    assert _warnings(selected) == ["The link's run 777 is not in the database; shown without it."]
    assert selected.session_state["report.how"] == "The selected runs"
    assert selected.query_params["runs"] == str(ids[1])

    bad = _opened("report", {"sweep": "nope"})
    said = "The link's sweep 'nope' is not in the database; pick one below."
    assert said in _warnings(bad)
    form = next(e for e in bad.expander if e.label == "Build a report")
    assert said not in [read(w.value) for w in form.warning]  # not hidden in the collapsed form


# ----------------------------------------------------------------------------- item 11: interrupted runs


def test_interrupted_runs_are_announced_beside_resume_all_and_a_run_that_never_started_reads_so(url, store):
    fresh = fake_run(store, TINY, status="running", steps_done=0)
    store.runs.set_status(fresh, "interrupted", error="interrupted before it started; resume it to train it", cause="signal")
    begun = fake_run(store, dataclasses.replace(TINY, rank=8), status="running", steps_done=12)
    store.runs.set_status(begun, "interrupted", error="interrupted by a signal; resume it to continue", cause="signal")
    fake_run(store, dataclasses.replace(TINY, rank=2))
    at = app().run()
    assert not at.exception
    notice = [w for w in _warnings(at) if "interrupted" in w]
    assert notice == ["2 runs were interrupted because their process was stopped (a restart, Ctrl-C or a signal); "
                      "1 of them before its first step (nothing trained, nothing lost). Resume all continues them "
                      "from their last checkpoints."], _warnings(at)
    assert not button(at, "Resume all").disabled
    shown = dict(zip(_ids(at), at.dataframe[0].value["status"]))
    assert shown[fresh] == tables.NOT_STARTED and shown[begun] == "⚠ interrupted"

    at.switch_page("views/detail.py")
    at.session_state["detail.pick"] = fresh
    at.run()
    assert not at.error, [e.value for e in at.error]  # no misleading error for a run that never trained
    assert any(w.startswith("This run was interrupted before its first step because its process was stopped")
               for w in _warnings(at)), _warnings(at)


# ----------------------------------------------------------------------------- item 15: first start and last resume


def test_run_detail_shows_the_first_start_and_the_last_resume(url, store):
    run_id = fake_run(store, TINY, status="running", steps_done=10)
    store.runs.set_status(run_id, "interrupted", error="interrupted by a signal", cause="signal")
    first = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    store.logs.add_run_logs(run_id, [(first, INFO, "claimed by host:1 (lease 1)", "lab"),
                                (first + timedelta(seconds=5), INFO, "step 10", "lab")])
    store.queue.requeue([run_id])
    assert store.queue.claim(run_id, "host:2")  # the resume: started_at is now
    store.logs.add_run_logs(run_id, [(INFO, "claimed by host:2 (lease 3)")])
    resumed = store.runs.get_run(run_id).started_at
    at = app(selected=[run_id]).run()
    at.switch_page("views/detail.py").run()
    assert not at.exception
    env = next(d.value for d in at.dataframe if list(d.value.columns) == ["item", "value"])
    items = dict(zip(env["item"], env["value"]))
    assert items["first started (UTC)"] == "2026-01-02 03:04:05"
    assert items["last resumed (UTC)"] == pd.Timestamp(resumed).strftime("%Y-%m-%d %H:%M:%S")
    assert "started (UTC)" not in items

    never = fake_run(store, dataclasses.replace(TINY, rank=8))  # trained once, no log: its one start
    at = app(selected=[never]).run()
    at.switch_page("views/detail.py").run()
    env = next(d.value for d in at.dataframe if list(d.value.columns) == ["item", "value"])
    items = dict(zip(env["item"], env["value"]))
    assert items["first started (UTC)"] == pd.Timestamp(store.runs.get_run(never).started_at).strftime("%Y-%m-%d %H:%M:%S")
    assert items["last resumed (UTC)"] == "— (never resumed)"
