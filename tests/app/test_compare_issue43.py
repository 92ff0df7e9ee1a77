"""Issue 43, Compare items 1, 2, 8, 10 (its Compare part), 12 and 14, under AppTest (and the
chart builders): a share link opens exactly the sender's runs and Table 3 settings, pooled
curves average the seeds Table 3 pairs on, system metrics carry their caveat, a link's
unknown colour-by or metric is one line, and subplot titles wrap on a narrow screen."""

import dataclasses

import pandas as pd

from app import metric_charts
from engine.analysis import charts
from tests.support.pages import app, figures, read, store, url  # noqa: F401  (fixtures)
from tests.support.runs import SWEEP_A, SWEEP_B, TINY, InSweep, fake_run

WHERE = "rank >= 16 or (estimator == exact and seed >= 2)"


def _compare(query: dict | None = None):
    at = app()
    if query:
        at.query_params.update(query)
    at.switch_page("views/compare.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _link(at) -> dict:
    return {k: (v[-1] if isinstance(v, list) else v) for k, v in dict(at.query_params).items()}


def _curves(at, title="Validation loss") -> list[str]:
    return sorted(t["name"] for t in figures(at)[title]["data"] if t.get("showlegend") is not False)


def _verdicts(at) -> list:
    return next(d.value for d in at.dataframe if "verdict" in d.value)["verdict"].tolist()


def _warnings(at) -> list[str]:
    return [read(w.value) for w in at.warning]


def _two_sweeps(store) -> dict[str, list[int]]:
    """An older sweep of exact seeds 0-3 and the latest: exact, R = 16 and R = 32 at seeds 0-1."""
    older = [fake_run(InSweep(store, SWEEP_A), dataclasses.replace(TINY, estimator="exact", seed=s)) for s in range(4)]
    latest = [fake_run(InSweep(store, SWEEP_B), dataclasses.replace(TINY, estimator=e, rank=r, seed=s))
              for e, r in (("exact", 8), ("basis", 16), ("basis", 32)) for s in range(2)]
    return {"older": older, "latest": latest}


# ----------------------------------------------------------------------------- item 1


def test_a_where_filter_link_opens_exactly_the_senders_runs(url, store):
    runs = _two_sweeps(store)
    sender = _compare()
    assert sender.session_state["compare.sweep"] == SWEEP_B  # the latest sweep by default
    sender.text_input(key="compare.where").set_value(WHERE).run()
    shown = sorted(sender.session_state["compare.pick"])
    assert shown == sorted(runs["older"][2:] + runs["latest"][2:])  # 6 runs, two of the older sweep
    assert sender.session_state["compare.sweep"] is None  # the box no longer names a sweep the pick is not of
    link = _link(sender)
    assert link["runs"] and "sweep" not in link

    recipient = _compare(link)
    assert sorted(recipient.session_state["compare.pick"]) == shown and not recipient.warning
    assert recipient.session_state["compare.sweep"] is None
    assert _curves(recipient) == _curves(sender)

    store.runs.delete_run(runs["latest"][-1], force=True)
    late = _compare(link)  # a run the link names is gone: said in one line
    assert sorted(late.session_state["compare.pick"]) == [i for i in shown if i != runs["latest"][-1]]
    assert [w for w in _warnings(late) if str(runs["latest"][-1]) in w] and len(late.warning) == 1


def test_a_hand_picked_run_outside_the_sweep_box_is_kept_by_the_link(url, store):
    runs = _two_sweeps(store)
    sender = _compare()
    picked = [*runs["latest"], runs["older"][0]]
    sender.multiselect(key="compare.pick").set_value(picked).run()
    assert sender.session_state["compare.sweep"] is None
    recipient = _compare(_link(sender))
    assert sorted(recipient.session_state["compare.pick"]) == sorted(picked)


# ----------------------------------------------------------------------------- item 2


def test_the_margin_and_holm_are_in_the_link_and_give_the_same_verdicts(url, store):
    _two_sweeps(store)
    sender = _compare()
    sender.number_input(key="compare.margin").set_value(0.5).run()
    sender.toggle(key="compare.adjust").set_value(False).run()
    link = _link(sender)
    assert link["margin"] == "0.5" and link["holm"] == "0"
    recipient = _compare(link)
    assert recipient.session_state["compare.margin"] == 0.5 and recipient.session_state["compare.adjust"] is False
    assert _verdicts(recipient) == _verdicts(sender) and _verdicts(sender)
    bad = _compare({**link, "margin": "-1"})
    assert any("margin='-1'" in w for w in _warnings(bad))


# ----------------------------------------------------------------------------- item 8


def test_pooled_curves_say_which_seeds_they_average_beside_table3s_pairs(url, store):
    exact = [fake_run(store, dataclasses.replace(TINY, estimator="exact", seed=s)) for s in range(4)]
    sketched = [fake_run(store, dataclasses.replace(TINY, rank=16, seed=s)) for s in range(2)]
    at = _compare({"runs": ",".join(map(str, exact + sketched))})
    assert _curves(at) == ["basis R=16 · mean of 2 seeds", "exact · mean of 4 seeds"]
    assert any("in the curves but not in every pair: exact seeds 2, 3" in read(c.value) for c in at.caption)
    at.toggle(key="compare.pool").set_value(False).run()  # unpooled: every run its own curve
    assert len(_curves(at)) == 6 and not any("not in every pair" in read(c.value) for c in at.caption)


# ----------------------------------------------------------------------------- item 12 and 10


def test_system_metrics_on_compare_carry_the_caveat_and_bad_link_values_are_named(url, store):
    ids = [fake_run(store, dataclasses.replace(TINY, rank=r), system=True) for r in (4, 8)]
    at = _compare({"runs": ",".join(map(str, ids)), "metrics": "sys/cpu_percent,not_a_metric", "group": "nonexistent"})
    warnings = _warnings(at)
    assert len(warnings) == 2, warnings
    assert any("group='nonexistent'" in w for w in warnings) and any("'not_a_metric'" in w for w in warnings)
    assert at.session_state["compare.metrics"] == ["sys/cpu_percent"] and at.session_state["compare.group"] == "method"
    assert any(c.value == metric_charts.SYSTEM_NOTE for c in at.caption)
    assert "not_a_metric" not in _link(at).get("metrics", "") and "group" not in _link(at)


# ----------------------------------------------------------------------------- item 14


def test_subplot_titles_wrap_at_slashes_and_spaces():
    frame = pd.DataFrame(columns=["trace", "color", "dash", "symbol", "x", "y", "lo", "hi", "n"])
    fig = charts.panels_figure({"block_0/mlp/fc": frame, "block_0/mlp/proj": frame, "head": frame}, y_title="cosine")
    titles = [a.text for a in fig.layout.annotations]
    assert titles == ["block_0/mlp/<br>fc", "block_0/mlp/<br>proj", "head"]
    assert fig.layout.legend.borderwidth > 12  # room above the two-line titles
    assert charts.wrapped("Peak device memory") == ["Peak device", "memory"]
