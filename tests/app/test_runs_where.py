"""The Runs page's filter box (``engine.analysis.where``) under AppTest: it narrows the
table, lives in the URL's ``where`` (a link opens the page filtered), and a bad filter
shows one line naming the fix, the table left as it was."""

import dataclasses

from tests.support.pages import app, store, url  # noqa: F401  (fixtures)
from tests.support.runs import SWEEP_A, TINY, InSweep, fake_run


def _ids(at) -> list[int]:
    return at.dataframe[0].value["id"].tolist()


def test_runs_filter_narrows_the_table_and_keeps_it_in_the_url(url, store):
    pilot = InSweep(store, SWEEP_A, ["pilot"])
    exact = fake_run(pilot, dataclasses.replace(TINY, estimator="exact"), final=6.0)
    r8 = fake_run(pilot, dataclasses.replace(TINY, rank=8, lam=0.0), final=6.2)
    r32 = fake_run(pilot, dataclasses.replace(TINY, rank=32, lam=0.0), final=6.9)
    other = fake_run(store, dataclasses.replace(TINY, rank=8, lam=0.0), final=6.1)
    at = app().run()
    assert not at.exception and _ids(at) == [other, r32, r8, exact]

    at.text_input(key="runs.where").set_value("rank >= 8 and lam == 0 and val_loss < 6.5 and tags contains pilot").run()
    assert not at.exception and not at.error
    assert _ids(at) == [r8]
    assert at.query_params["where"] == "rank >= 8 and lam == 0 and val_loss < 6.5 and tags contains pilot"

    at.text_input(key="runs.where").set_value("val_los < 6.5").run()  # a typo
    errors = [e.value.replace("\\", "") for e in at.error]  # shown as plain text: markdown escaped
    assert len(errors) == 1 and "\n" not in errors[0]
    assert "unknown field 'val_los'; did you mean val_loss" in errors[0]
    assert _ids(at) == [other, r32, r8, exact]  # not applied

    at.text_input(key="runs.where").set_value("rank in [8,").run()
    assert [e.value for e in at.error] and "expected a value" in at.error[0].value

    at.text_input(key="runs.where").set_value("(" * 400 + "rank == 8" + ")" * 400).run()  # no RecursionError
    assert not at.exception and len(at.error) == 1 and "more than 32 deep" in at.error[0].value
    assert _ids(at) == [other, r32, r8, exact]

    at.text_input(key="runs.where").set_value("").run()
    assert not at.error and _ids(at) == [other, r32, r8, exact] and "where" not in at.query_params

    linked = app()
    linked.query_params["where"] = "estimator == exact or rank == 32"
    linked.switch_page("views/runs.py").run()
    assert not linked.exception and _ids(linked) == [r32, exact]
    assert linked.text_input(key="runs.where").value == "estimator == exact or rank == 32"


def test_compare_picker_takes_the_same_filter(url, store):
    exact = fake_run(store, dataclasses.replace(TINY, estimator="exact"), final=6.0)
    r8 = fake_run(store, dataclasses.replace(TINY, rank=8, lam=0.0), final=6.2)
    r32 = fake_run(store, dataclasses.replace(TINY, rank=32, lam=0.0), final=6.9)
    at = app()
    at.switch_page("views/compare.py").run()
    assert not at.exception
    at.text_input(key="compare.where").set_value("val_loss < 6.5").run()
    assert not at.exception and not at.error
    assert sorted(at.session_state["compare.pick"]) == [exact, r8]
    at.text_input(key="compare.where").set_value("rank >>= 8").run()
    errors = [e.value.replace("\\", "") for e in at.error]
    assert len(errors) == 1 and "\n" not in errors[0] and "Filter not applied" in errors[0]
    assert sorted(at.session_state["compare.pick"]) == [exact, r8]  # kept
    at.text_input(key="compare.where").set_value("rank == 32").run()
    assert not at.error and at.session_state["compare.pick"] == [r32]
