"""Every URL parameter of every page is read without a traceback: a value the page cannot
use (``?runs=²``, whose ``"²".isdigit()`` is true while ``int("²")`` fails) is named in one
line and the page shows its default view."""

import pytest

from app import viewstate
from engine.runner import reports
from tests.support.pages import app, store, url  # noqa: F401  (fixtures)
from tests.support.runs import TINY, fake_run


def test_url_ids_are_ascii_digits_of_known_things():
    assert viewstate.url_id({"run": "3"}, "run", [3]) == (3, None)
    assert viewstate.url_id({}, "run", [3]) == (None, None)
    for odd in ("²", "٣", "-1", "3.0", "x", ""):
        value, problem = viewstate.url_id({"run": odd}, "run", [3])
        assert value is None and problem == f"run={odd!r} is not a run id"
    assert viewstate.url_id({"id": ["9"]}, "id", [3], what="report") == (None, "report 9 is not in the database")
    assert viewstate.decode({"runs": "\u00b2,1"}).runs == (1,)
    assert viewstate.decode({"runs": "\u00b2,1"}).problems == ("runs: '²' is not a run id",)


def _at(page: str, query: dict):
    at = app()
    at.query_params.update(query)
    at.switch_page(f"views/{page}.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


@pytest.mark.parametrize("page,query,said", [
    ("compare", {"runs": "\u00b2"}, "The link's runs: '²' is not a run id; shown without it."),
    ("compare", {"sweep": "nope"}, "The link's sweep 'nope' is not in the database; shown without it."),
    ("detail", {"run": "\u00b2"}, "The link's run='²' is not a run id; showing another run."),
    ("detail", {"run": "99"}, "The link's run 99 is not in the database; showing another run."),
    ("report", {"id": "\u00b2"}, "The link's id='²' is not a report id; showing the latest report."),
    ("report", {"sweep": "nope"}, "The link's sweep 'nope' is not in the database; pick one below."),
])
def test_a_bad_url_parameter_is_one_line_and_the_default_view(url, store, page, query, said):
    run = fake_run(store, TINY)
    if page == "report":
        reports.save(store, reports.build(store, reports.selection_of(runs=[run])))
    at = _at(page, query)
    shown = [w.value.replace("\\", "") for w in at.warning]
    assert said in shown, shown
    if page == "detail":
        assert at.session_state["detail.pick"] == run
