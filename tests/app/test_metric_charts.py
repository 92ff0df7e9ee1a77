"""Any recorded metric charted across runs on Compare (pooled, smoothed, on the chosen
x axis, kept in the URL), and the system metrics on Run detail."""

import dataclasses

import numpy as np
import pandas as pd

from app import metric_charts, viewstate
from engine.analysis import frames
from tests.support.pages import app, figures, page, store, url  # noqa: F401 (fixtures)
from tests.support.runs import TINY, fake_run


def _seeds(store):
    """basis R=8 at seeds 0-2 and exact at seed 0, each with system metrics."""
    ids = [fake_run(store, dataclasses.replace(TINY, rank=8, seed=s), system=True) for s in range(3)]
    return ids + [fake_run(store, dataclasses.replace(TINY, estimator="exact"), system=True)]


def test_metric_choices_put_run_measures_first_then_layers_then_system_metrics():
    names = ["sys/load1", "cos/head", "val_loss", "sys/cpu_percent", "tokens_per_s", "cos_mean", "sys/other"]
    metrics = pd.DataFrame({"name": names})
    assert metric_charts.metric_choices(metrics, ["rel_err_mean"]) == [
        "cos_mean", "rel_err_mean", "tokens_per_s", "val_loss", "cos/head", "sys/cpu_percent", "sys/load1", "sys/other"]


def test_the_view_keeps_its_charted_metrics_in_the_url():
    view = viewstate.ViewState(runs=(1, 2), metrics=("tokens_per_s", "sys/cpu_percent"))
    assert viewstate.encode(view)["metrics"] == "tokens_per_s,sys/cpu_percent"
    assert viewstate.decode(viewstate.encode(view)) == view
    assert viewstate.decode({"metrics": " sys/rss_mib,,sys/rss_mib "}).metrics == ("sys/rss_mib",)


def test_compare_charts_a_chosen_metric_pooled_over_seeds_and_writes_it_into_the_url(url, store):
    ids = _seeds(store)
    at = page(app(selected=ids).run(), "compare")
    options = at.multiselect(key="compare.metrics").options
    assert {"sys/cpu_percent", "sys/rss_mib", "tokens_per_s", "cos/head"} <= set(options)
    assert options.index("tokens_per_s") < options.index("cos/head") < options.index("sys/cpu_percent")
    at.multiselect(key="compare.metrics").set_value(["sys/cpu_percent", "tokens_per_s"]).run()
    assert not at.exception, [e.value for e in at.exception]
    cpu = figures(at)["Process CPU"]
    assert cpu["layout"]["yaxis"]["title"]["text"] == "% of one core"
    traces = {t["name"]: t for t in cpu["data"]}
    pooled, upper = traces["basis R=8 · mean of 3 seeds"], traces["basis R=8 · mean of 3 seeds +std"]
    rows = store.metrics(ids[:3], names=["sys/cpu_percent"])
    want = rows.groupby("step")["value"].agg(["mean", "std"])  # 100 + step + 10·seed over seeds 0-2
    np.testing.assert_allclose(pooled["y"], want["mean"].to_numpy())
    np.testing.assert_allclose(pooled["y"], 110.0 + want.index.to_numpy())
    np.testing.assert_allclose(np.subtract(upper["y"], pooled["y"]), 10.0)  # the band: ± std over seeds (ddof 1)
    assert "tokens_per_s" in figures(at)
    assert at.query_params["metrics"] in (["sys/cpu_percent,tokens_per_s"], "sys/cpu_percent,tokens_per_s")

    at.radio(key="compare.x").set_value("wall_time").run()  # the page's x axis and log scale apply
    at.toggle(key="compare.log_y").set_value(True).run()
    cpu = figures(at)["Process CPU"]
    assert cpu["layout"]["xaxis"]["title"]["text"] == "wall time (s)" and cpu["layout"]["yaxis"]["type"] == "log"

    linked = app()
    linked.query_params.update({"runs": ",".join(map(str, ids)), "metrics": "sys/rss_mib"})
    linked.switch_page("views/compare.py").run()
    assert not linked.exception and linked.session_state["compare.metrics"] == ["sys/rss_mib"]
    assert "Process resident memory" in figures(linked)


def test_a_chosen_metric_follows_colour_by_and_facets(url, store):
    ids = _seeds(store)
    at = page(app(selected=ids).run(), "compare")
    at.selectbox(key="compare.group").set_value("seed")
    at.multiselect(key="compare.metrics").set_value(["sys/rss_mib"]).run()
    rss = figures(at)["Process resident memory"]
    assert any("seed=2" in t["name"] for t in rss["data"])
    at.toggle(key="compare.facet").set_value(True).run()
    assert "Process resident memory, by seed" in figures(at)


def test_run_detail_shows_the_system_metrics_of_its_run(url, store):
    run_id = _seeds(store)[1]
    at = page(app(selected=[run_id]).run(), "detail")
    shown = figures(at)
    for title in ("Process CPU", "Process resident memory", "Host load (1 min)"):
        assert title in shown and shown[title]["layout"]["showlegend"] is False
    rss = store.metrics([run_id], names=["sys/rss_mib"])
    np.testing.assert_allclose(shown["Process resident memory"]["data"][0]["y"], rss["value"])
    assert "Device memory in use" not in shown  # not recorded (a CPU run): no empty chart
    bare = page(app(selected=[fake_run(store, TINY)]).run(), "detail")
    assert "Process CPU" not in figures(bare)
    assert any("No system metrics yet" in c.value for c in bare.caption)


def test_metric_figure_is_the_loss_charts_series(tmp_path):
    """The figure's curve is ``frames.series`` of the metric: the same smoothing and pooling."""
    from storage import RunStore

    store = RunStore(f"sqlite:///{tmp_path / 'figure.db'}")
    ids = [fake_run(store, dataclasses.replace(TINY, rank=8, seed=s), system=True) for s in range(2)]
    info = frames.describe_runs(store.runs.list_runs())
    metrics = store.metrics(ids)
    fig = metric_charts.metric_figure(metrics, info, "sys/cpu_percent", smoothing=0.6, pool=True)
    s = frames.series(metrics, info, "sys/cpu_percent", smoothing=0.6, pool_seeds=True)
    line = next(t for t in fig.data if t.name == s["trace"].iloc[0] and t.showlegend is not False)
    np.testing.assert_allclose(line.y, s["y"])
    assert s["y"].iloc[-1] != metrics.loc[metrics.name == "sys/cpu_percent", "value"].max()  # smoothed
    store.close()
