"""Run detail's curves take Compare's controls (issue 43 item 18): log y, EMA smoothing and
the x axis (step or wall time) change the figures drawn, and the controls live in the URL
(``x``, ``smooth``, ``log``) as Compare's do; a link sets them, a bad value is one line."""

import dataclasses

import numpy as np

from app import metric_charts
from tests.support.pages import app, figures, page, store, url  # noqa: F401 (fixtures)
from tests.support.runs import TINY, fake_run

LOGGED = ("Validation loss", "Train loss (mean since last eval)", "Training throughput", "Process CPU",
          "Relative error of sketched dW, per layer")


def _ema(values, weight):
    """The debiased EMA, written out here (not ``frames.ema``): m = w·m + (1 − w)·v, shown as m / (1 − wᵗ)."""
    out, m = [], 0.0
    for t, v in enumerate(values, start=1):
        m = weight * m + (1 - weight) * v
        out.append(m / (1 - weight ** t))
    return np.array(out)


def _query(at) -> dict:
    return {k: (v[-1] if isinstance(v, list) else v) for k, v in dict(at.query_params).items()}


def test_log_y_smoothing_and_wall_time_change_run_details_charts(url, store):
    run = fake_run(store, dataclasses.replace(TINY, rank=8, steps=60), system=True)
    rows = store.metrics([run], names=["val_loss"]).sort_values("step")
    at = page(app(selected=[run]).run(), "detail")
    shown = figures(at)
    val = shown["Validation loss"]
    assert val["layout"]["yaxis"].get("type", "linear") == "linear"
    np.testing.assert_allclose(val["data"][0]["x"], rows["step"])
    np.testing.assert_allclose(val["data"][0]["y"], rows["value"])
    assert {"x", "smooth", "log"}.isdisjoint(_query(at))  # the defaults are left out of the URL

    at.toggle(key="detail.log_y").set_value(True).run()
    assert not at.exception, [e.value for e in at.exception]
    shown = figures(at)
    for title in LOGGED:
        assert shown[title]["layout"]["yaxis"]["type"] == "log", title
    cos = shown["Cosine of sketched dW to exact dW, per layer"]["layout"]
    assert cos["yaxis"].get("type", "linear") == "linear"  # the cosine keeps its linear scale, as on Compare
    np.testing.assert_allclose(shown["Validation loss"]["data"][0]["y"], rows["value"])  # log y alone: same values

    at.slider(key="detail.smoothing").set_value(0.6).run()
    val = figures(at)["Validation loss"]["data"][0]
    np.testing.assert_allclose(val["y"], _ema(rows["value"].to_numpy(), 0.6))
    assert not np.allclose(val["y"], rows["value"])
    cpu = store.metrics([run], names=["sys/cpu_percent"]).sort_values("step")
    np.testing.assert_allclose(figures(at)["Process CPU"]["data"][0]["y"], _ema(cpu["value"].to_numpy(), 0.6))

    at.radio(key="detail.x").set_value("wall_time").run()
    shown = figures(at)
    val = shown["Validation loss"]
    assert val["layout"]["xaxis"]["title"]["text"] == "wall time (s)"
    np.testing.assert_allclose(val["data"][0]["x"], rows["wall_time"])
    assert not np.allclose(val["data"][0]["x"], rows["step"])
    tps = store.metrics([run], names=["tokens_per_s"]).sort_values("step")
    np.testing.assert_allclose(shown["Training throughput"]["data"][0]["x"], tps["wall_time"])
    assert _query(at) == {"run": str(run), "x": "wall_time", "smooth": "0.6", "log": "1"}


def test_a_link_sets_run_details_curve_controls_and_a_bad_value_is_one_line(url, store):
    run = fake_run(store, dataclasses.replace(TINY, rank=8))
    linked = app()
    linked.query_params.update({"run": str(run), "x": "wall_time", "smooth": "0.3", "log": "1"})
    linked.switch_page("views/detail.py").run()
    assert not linked.exception and not linked.warning
    assert (linked.radio(key="detail.x").value, linked.slider(key="detail.smoothing").value,
            linked.toggle(key="detail.log_y").value) == ("wall_time", 0.3, True)
    val = figures(linked)["Validation loss"]
    assert val["layout"]["yaxis"]["type"] == "log" and val["layout"]["xaxis"]["title"]["text"] == "wall time (s)"
    rows = store.metrics([run], names=["val_loss"]).sort_values("step")
    np.testing.assert_allclose(val["data"][0]["y"], _ema(rows["value"].to_numpy(), 0.3))

    bad = app()
    bad.query_params.update({"run": str(run), "smooth": "7", "x": "epoch"})
    bad.switch_page("views/detail.py").run()
    said = sorted(w.value.replace("\\", "") for w in bad.warning)
    assert said == ["The link's smooth='7' is not a number in [0, 0.99]; shown without it.",
                    "The link's x='epoch' is not one of step, wall_time; shown without it."]
    assert bad.slider(key="detail.smoothing").value == 0.0 and bad.radio(key="detail.x").value == "step"
    assert {"x", "smooth"}.isdisjoint(_query(bad))  # the URL follows what is shown


def test_the_curve_controls_write_the_parameters_compare_reads():
    assert metric_charts.curve_params("step", 0.0, False) == {"x": None, "smooth": None, "log": None}
    assert metric_charts.curve_params("wall_time", 0.25, True) == {"x": "wall_time", "smooth": "0.25", "log": "1"}
