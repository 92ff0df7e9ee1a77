"""Every URL parameter of every page is read without a traceback: a value the page cannot
use (``?runs=²``, whose ``"²".isdigit()`` is true while ``int("²")`` fails) is named in one
line and the page shows its default view."""

import pytest

from app import viewstate
from engine.reads import reports
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


BIG = "9" * 5000  # int() refuses more than 4,300 digits; a 64-bit column holds 19
HUGE = "9223372036854775808"  # INT_MAX + 1: 19 digits, too large for the database


def test_url_numbers_are_read_with_bounds():
    assert viewstate.url_int("9223372036854775807") == viewstate.INT_MAX
    for odd in (BIG, HUGE, "0" * 20 + "1", "", "²"):
        assert viewstate.url_int(odd) is None
    value, problem = viewstate.url_id({"run": BIG}, "run", [3])
    assert value is None and problem == f"run='{'9' * 40}'… (5,000 characters) is not a run id"
    assert viewstate.url_id({"run": HUGE}, "run", [3]) == (None, f"run='{HUGE}' is not a run id")
    view = viewstate.decode({"runs": f"1,{BIG},{HUGE}", "at": BIG})
    assert view.runs == (1,) and view.at is None and len(view.problems) == 3
    assert all("\n" not in p and len(p) < 100 for p in view.problems)


DEEP = "(" * 400 + "rank == 8" + ")" * 400
NOTS = "not " * 1000 + "rank == 8"


@pytest.mark.parametrize("page,query,said", [
    ("compare", {"runs": BIG}, "The link's runs: '999"),
    ("compare", {"runs": f"1,{HUGE}"}, f"The link's runs: '{HUGE}' is not a run id; shown without it."),
    ("compare", {"at": BIG}, "The link's at='999"),
    ("detail", {"run": BIG}, "The link's run='999"),
    ("report", {"id": BIG}, "The link's id='999"),
    ("report", {"id": HUGE}, f"The link's id='{HUGE}' is not a report id; showing the latest report."),
])
def test_a_huge_number_in_a_link_is_one_line_and_the_default_view(url, store, page, query, said):
    run = fake_run(store, TINY)
    if page == "report":
        reports.save(store, reports.build(store, reports.selection_of(runs=[run])))
    at = _at(page, query)
    shown = [w.value.replace("\\", "") for w in at.warning]
    assert len(shown) == 1 and shown[0].startswith(said) and "\n" not in shown[0] and len(shown[0]) < 200, shown


@pytest.mark.parametrize("where", [DEEP, NOTS, "rank == 8 or " * 1000 + "rank == 8"])
@pytest.mark.parametrize("page,key", [("runs", "runs.where"), ("compare", "compare.where")])
def test_a_filter_too_deep_or_long_in_a_link_is_one_line(url, store, page, key, where):
    fake_run(store, TINY)
    at = _at(page, {"where": where})
    said = [e.value.replace("\\", "") for e in at.error] + [w.value.replace("\\", "") for w in at.warning]
    assert len(said) == 1 and "\n" not in said[0], said
    assert "the most is" in said[0] and ("deep" in said[0] or "characters long" in said[0]), said
