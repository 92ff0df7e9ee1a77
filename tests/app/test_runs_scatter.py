"""The Runs page's scatter (issue 43 item 18): any final metric against any run or config
field over the runs the filters show, one point per run in its method's colour, its hover
naming the run; numeric fields a numeric axis (log x on request), others categories; the
choices kept in the URL; fewer than two runs a one-line caption, not an empty chart."""

import base64
import dataclasses

import numpy as np

from app import scatter as panel
from engine.analysis import frames, scatter
from engine.config import RunConfig
from tests.support.pages import app, figures, page, store, url  # noqa: F401 (fixtures)
from tests.support.runs import TINY, fake_run

LRS = (0.003, 0.01, 0.03)


def _lab(store) -> dict[str, list[int]]:
    """basis R=8 at three learning rates × seeds 0-1, basis R=32 at one, exact at one."""
    ids = {"r8": [fake_run(store, dataclasses.replace(TINY, rank=8, lr=lr, seed=s), final=6.0 + 10 * lr)
                  for lr in LRS for s in range(2)]}
    ids["r32"] = [fake_run(store, dataclasses.replace(TINY, rank=32, lr=0.01), final=6.05)]
    ids["exact"] = [fake_run(store, dataclasses.replace(TINY, estimator="exact", lr=0.01), final=5.9)]
    return ids


def _array(v) -> list:
    if isinstance(v, dict) and "bdata" in v:
        return np.frombuffer(base64.b64decode(v["bdata"]), dtype=np.dtype(v["dtype"])).tolist()
    return list(v)


def _points(figure) -> dict[int, tuple]:
    """Run id → (x, y, marker colour, trace name) of every point of the scatter."""
    out = {}
    for trace in figure["data"]:
        for rid, x, y in zip(_array(trace["customdata"]), trace["x"], trace["y"]):
            out[int(rid)] = (x, y, trace["marker"]["color"], trace["name"])
    return out


def _query(at) -> dict:
    return {k: (v[-1] if isinstance(v, list) else v) for k, v in dict(at.query_params).items()}


def test_the_scatter_draws_the_final_values_of_the_filtered_runs_against_the_chosen_field(url, store):
    ids = _lab(store)
    at = page(app().run(), "runs")
    at.text_input(key="runs.where").set_value("rank == 8 or estimator == exact").run()
    assert not at.exception and not at.error
    shown = ids["r8"] + ids["exact"]  # what the filter shows: R = 32 is not drawn
    assert "Final val_loss against rank" in figures(at)  # the defaults, left out of the URL
    assert {"scatter_x", "scatter_y", "scatter_logx"}.isdisjoint(_query(at))
    at.selectbox(key=panel.X).set_value("lr").run()
    points = _points(figures(at)["Final val_loss against lr"])
    finals = store.metrics.final_metrics(shown, names=["val_loss"]).set_index("run_id")["value"]
    configs = {r.id: r.config for r in store.runs.list_runs()}
    assert set(points) == set(shown)
    for rid in shown:
        assert points[rid][:2] == (configs[rid]["lr"], finals[rid]), rid
    colours = frames.describe_runs([r for r in store.runs.list_runs() if r.id in shown]).set_index("run_id")
    assert {rid: p[2] for rid, p in points.items()} == colours.loc[shown, "color"].to_dict()  # the method's colour
    assert {p[3] for p in points.values()} == {"exact", "basis R=8"}
    figure = figures(at)["Final val_loss against lr"]
    hover = next(t for t in figure["data"] if t["name"] == "basis R=8")["text"][0]
    assert hover.startswith(f"<b>#{ids['r8'][0]} ") and "lr = 0.003" in hover

    at.toggle(key=panel.LOG_X).set_value(True).run()
    at.selectbox(key=panel.Y).set_value("train_loss").run()
    figure = figures(at)["Final train_loss against lr"]
    assert figure["layout"]["xaxis"]["type"] == "log"
    finals = store.metrics.final_metrics(shown, names=["train_loss"]).set_index("run_id")["value"]
    assert {rid: p[1] for rid, p in _points(figure).items()} == finals.loc[shown].to_dict()
    assert _query(at) == {"where": "rank == 8 or estimator == exact", "scatter_y": "train_loss", "scatter_x": "lr",
                          "scatter_logx": "1"}


def test_a_text_field_is_a_categorical_axis_and_runs_without_the_value_are_named(url, store):
    ids = _lab(store)
    at = page(app().run(), "runs")
    points = _points(figures(at)["Final val_loss against rank"])  # exact backprop has no R: named, not drawn
    assert set(points) == set(ids["r8"] + ids["r32"]) and points[ids["r32"][0]][0] == 32
    assert any(f"with no rank: #{ids['exact'][0]} (exact backprop has none)" in c.value.replace("\\", "")
               for c in at.caption)

    store.runs.rename_run(ids["exact"][0], "<i>baseline</i> & co")  # a name is plain text in the hover too
    at.selectbox(key=panel.X).set_value("estimator").run()
    figure = figures(at)["Final val_loss against estimator"]
    assert figure["layout"]["xaxis"]["type"] == "category"
    exact = next(t for t in figure["data"] if t["name"] == "exact")
    assert exact["text"][0].startswith(f"<b>#{ids['exact'][0]} &lt;i&gt;baseline&lt;/i&gt; &amp; co</b>")
    assert at.toggle(key=panel.LOG_X).disabled
    everyone = [i for group in ids.values() for i in group]
    assert {rid: p[0] for rid, p in _points(figure).items()} == {
        i: "exact" if i in ids["exact"] else "basis" for i in everyone}
    assert _query(at)["scatter_x"] == "estimator"


def test_a_link_sets_the_scatter_and_one_run_is_a_caption(url, store):
    ids = _lab(store)
    linked = app()
    linked.query_params.update({"scatter_y": "cos_mean", "scatter_x": "seed", "where": "rank == 8"})
    linked.switch_page("views/runs.py").run()
    assert not linked.exception and not linked.warning
    points = _points(figures(linked)["Final cos_mean against seed"])
    seeds = {r.id: r.seed for r in store.runs.list_runs()}
    finals = store.metrics.final_metrics(ids["r8"], names=["cos_mean"]).set_index("run_id")["value"]
    assert points == {i: (seeds[i], finals[i], points[i][2], "basis R=8") for i in ids["r8"]}

    bad = app()
    bad.query_params.update({"scatter_y": "no_such_metric", "scatter_x": "nope", "scatter_logx": "2"})
    bad.switch_page("views/runs.py").run()
    said = [w.value.replace("\\", "") for w in bad.warning]
    assert len(said) == 3 and all("\n" not in s for s in said)
    assert any(s.startswith("The link's scatter_x='nope' is not one of ") for s in said), said
    assert "Final val_loss against rank" in figures(bad)  # the defaults
    assert {"scatter_x", "scatter_y", "scatter_logx"}.isdisjoint(_query(bad))

    one = page(app().run(), "runs")
    one.text_input(key="runs.where").set_value(f"id == {ids['r32'][0]}").run()
    assert not any(title.startswith("Final ") for title in figures(one))
    assert any(c.value == "The scatter needs two runs or more; the filters show 1." for c in one.caption)


def test_a_field_left_to_the_preset_is_the_value_the_run_trained_with(tmp_path):
    from storage import RunStore

    store = RunStore(f"sqlite:///{tmp_path / 'scatter.db'}")
    a = fake_run(store, dataclasses.replace(TINY, rank=8))  # batch_size None: the tiny preset's
    b = fake_run(store, dataclasses.replace(TINY, rank=8, batch_size=4, seed=1))
    records = store.runs.list_runs()
    choices, varying, numeric = scatter.axes(records)
    assert {"batch_size", "seed"} <= set(varying) and choices[:len(varying)] == varying
    assert {"lr", "rank", "batch_size"} <= set(numeric) and "estimator" not in numeric and "name" not in choices
    data = scatter.points(records, store.metrics.final_metrics(names=["val_loss"]), "batch_size", "val_loss")
    xs = dict(zip(data.points["run_id"], data.points["x"]))
    assert xs == {a: RunConfig(preset="tiny").effective_batch_size, b: 4}
    store.close()
