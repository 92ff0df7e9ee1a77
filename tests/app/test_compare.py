"""The Compare page: method colours, the paper's central figure (a quantity against the
rank R at one step), the wall-time x axis of the cosine charts, chart downloads in the
sidebar's format, and the Table 3 downloads."""

import base64
import colorsys
import dataclasses
import io

import numpy as np
import pandas as pd
import pytest

from app import display
from engine.analysis import charts, frames, method_frames
from engine.analysis.summary import MIB, display_frame, summarize, table3
from engine.config import RunConfig
from storage import RunStore
from tests.support.pages import app, downloads, figures, page, plots, store, url  # noqa: F401 (fixtures)
from tests.support.runs import LAYERS, TINY, fake_run

PAPER = RunConfig(preset="paper", steps=40, eval_interval=10, probe_interval=10)
RANK_TITLES = {"val_loss": "Validation loss against rank R", "cos_mean": "Mean cosine against rank R",
               "mem_saved_bytes": "Saved bytes against rank R"}


def _run(store, config, *, final, saved, cos=None, steps_done=None):
    """``fake_run`` whose saved bytes and (when given) mean cosine differ per seed, so
    every quantity of the rank figure has a seed spread."""
    status = "finished" if steps_done is None else "running"
    run_id = fake_run(store, config, final=final + 0.03 * config.seed, saved=saved * (1 + 0.01 * config.seed),
                      status=status, steps_done=steps_done)
    if cos is not None:
        done = config.steps if steps_done is None else steps_done
        store.metrics.add_metrics(run_id, [(step, 0.5 + 0.01 * step, "cos_mean", cos + 0.02 * config.seed * step / 40)
                                   for step in range(10, done + 1, 10)])
    return run_id


def _lab(store, config=TINY):
    """exact and basis R=1, 8 and countsketch R=8 at seeds 0-2, a basis R=8 λ=0.01 run;
    basis R=8 seed 2 has stopped at step 20 of 40."""
    ids = [_run(store, dataclasses.replace(config, estimator="exact", seed=s), final=6.6, saved=13e6, cos=1.0) for s in range(3)]
    for estimator, rank, final, saved, cos in (("basis", 1, 7.2, 6e6, 0.3), ("basis", 8, 6.8, 7e6, 0.6),
                                               ("countsketch", 8, 6.9, 7e6, 0.45)):
        for s in range(3):
            cut = 20 if (estimator, rank, s) == ("basis", 8, 2) else None
            ids.append(_run(store, dataclasses.replace(config, estimator=estimator, rank=rank, seed=s), final=final,
                            saved=saved, cos=cos, steps_done=cut))
    ids.append(_run(store, dataclasses.replace(config, rank=8, lam=0.01), final=6.75, saved=7.2e6, cos=0.58))
    return ids


def _method(row):
    return ("exact", None, None) if row.estimator == "exact" else (row.estimator, int(row.rank), float(row.lam))


# ----------------------------------------------------------------------------- colours


def test_a_method_has_one_colour_on_every_chart_of_a_selection(tmp_path):
    store = RunStore(f"sqlite:///{tmp_path / 'colours.db'}")
    first = [fake_run(store, dataclasses.replace(TINY, estimator=e, rank=8, seed=0)) for e in ("exact", "basis", "countsketch")]
    second = [fake_run(store, dataclasses.replace(TINY, estimator=e, rank=r, seed=s, steps=20))
              for e, r, s in (("countsketch", 8, 1), ("basis", 1, 1), ("basis", 8, 1), ("exact", 8, 1))]
    records = {r.id: r for r in store.runs.list_runs()}
    metrics = store.metrics(sorted(records))

    def colours(ids, pool):
        info = frames.describe_runs([records[i] for i in ids])
        s = frames.series(metrics, info, "val_loss", pool_seeds=pool)
        by_trace = s.groupby("trace", sort=False)["color"].agg(set)
        assert (by_trace.map(len) == 1).all()  # one colour per curve
        method = {label: info.set_index("run_id").loc[rid, "method"] for rid, label in frames.trace_labels(info, pool).items()}
        return {method[t]: c.pop() for t, c in by_trace.items()}

    a, b, both = colours(first, False), colours(second, False), colours(first + second, True)
    for shown in (a, b, both):  # every method of a selection its own colour, exact backprop grey
        assert len(set(shown.values())) == len(shown) and shown["exact"] == charts.EXACT_COLOR
    assert b["basis R=1"] != b["basis R=8"]  # ranks within an estimator too
    assert colours(list(reversed(first)), True) == colours(first, True)  # from the methods, not the run order
    mem = frames.memory_frame(summarize(records.values(), metrics), frames.describe_runs(list(records.values())), pool_seeds=False)
    shades = [both["basis R=8"], charts.seed_shade(both["basis R=8"], 1)]  # seeds 0 and 1, unpooled: shades of one hue
    assert set(mem.loc[mem["trace"].str.startswith("basis R=8"), "color"]) == set(shades)
    assert len({round(colorsys.rgb_to_hls(*(int(c[i:i + 2], 16) / 255 for i in (1, 3, 5)))[0], 2) for c in shades}) == 1
    store.close()


def test_two_sweeps_compared_are_told_apart_by_marker_dash_and_label(tmp_path):
    """Two setups (lr 0.01 and 0.02), each exact and basis R=8 with two seeds: every
    curve of a setup has that setup's marker, the two exact reference lines of the rank
    figure differ in dash, legends and Table 3 rows name the differing field; unpooled,
    the seeds of a method are shades of its colour."""
    store = RunStore(f"sqlite:///{tmp_path / 'sweeps.db'}")
    ids = [fake_run(store, dataclasses.replace(TINY, estimator=e, rank=8, seed=s, lr=lr))
           for lr in (0.01, 0.02) for e in ("exact", "basis") for s in (0, 1)]
    records = [store.runs.get_run(i) for i in ids]
    metrics = store.metrics(ids)
    info = frames.describe_runs(records)
    assert sorted(set(info["setup"])) == ["lr=0.01", "lr=0.02"]
    symbols = info.groupby("setup")["symbol"].agg(set)
    assert symbols.map(len).eq(1).all() and symbols["lr=0.01"] != symbols["lr=0.02"]

    s = frames.series(metrics, info, "val_loss")
    assert set(s["trace"]) == {f"{m} · mean of 2 seeds [lr={lr}]" for m in ("exact", "basis R=8") for lr in (0.01, 0.02)}
    fig = charts.line_figure(s, y_title="loss")
    lines = [t for t in fig.data if t.showlegend is not False]
    by_setup = {}
    for t in lines:
        assert t.mode == "lines+markers"  # mixed setups: every curve shows its setup's marker
        by_setup.setdefault(t.name.rsplit("[", 1)[1], set()).add(t.marker.symbol)
    assert all(len(v) == 1 for v in by_setup.values()) and by_setup["lr=0.01]"] != by_setup["lr=0.02]"]

    rank = method_frames.rank_frame(records, metrics, "val_loss")
    exact = rank[rank["estimator"] == "exact"]
    assert len(exact) == 2 and exact["dash"].nunique() == 2 and "solid" not in set(exact["dash"])
    bands = [t for t in charts.rank_figure(rank, y_title="loss").data if t.showlegend is not False and t.mode == "lines"]
    assert len({t.line.dash for t in bands}) == 2  # the two exact references differ
    sketched = rank[rank["estimator"] != "exact"]
    assert sketched["symbol"].nunique() == 2 and set(sketched["trace"]) == {"basis [lr=0.01]", "basis [lr=0.02]"}

    shown = display_frame(table3(records, metrics))
    assert shown.columns[0] == "setup" and sorted(set(shown["setup"])) == ["lr=0.01", "lr=0.02"]

    unpooled = frames.series(metrics, info, "val_loss", pool_seeds=False)
    colours = unpooled.groupby("trace")["color"].first()
    r8 = info.loc[info["rank"] == 8, "color"].iloc[0]
    assert colours["basis R=8 s0 [lr=0.01]"] == r8 and colours["basis R=8 s1 [lr=0.01]"] == charts.seed_shade(r8, 1) != r8
    store.close()


# ----------------------------------------------------------------------------- the central figure


def _direct(store, ids, column, step):
    """mean and std over seeds of ``column`` at ``step`` by method, straight from the metric rows."""
    rows = store.metrics(ids)
    records = {r.id: r for r in store.runs.list_runs()}
    reached = set(rows.loc[(rows["name"] == "val_loss") & (rows["step"] == step), "run_id"])
    named = rows[rows["name"] == column].sort_values("id")
    if column == "val_loss":
        values = named[named["step"] == step].groupby("run_id")["value"].last()
    elif column == "cos_mean":
        values = named[named["step"] <= step].groupby("run_id")["value"].last()
    else:
        values = named.groupby("run_id")["value"].last() / MIB
    values = values[values.index.isin(reached)]
    method = pd.Series({i: _method(records[i]) for i in values.index})
    stats = values.groupby(method).agg(["mean", "std", "count"])
    return stats


@pytest.mark.parametrize("quantity", list(method_frames.RANK_QUANTITIES))
@pytest.mark.parametrize("at_step", [None, 40, 20])
def test_rank_frame_equals_a_direct_computation(tmp_path, quantity, at_step):
    store = RunStore(f"sqlite:///{tmp_path / 'rank.db'}")
    ids = _lab(store)
    records = store.runs.list_runs()
    got = method_frames.rank_frame(records, store.metrics(ids), quantity, at_step)
    step = 20 if at_step is None else at_step  # the latest step every run validated at: basis R=8 seed 2 stopped at 20
    assert list(got.columns) == method_frames.RANK_COLUMNS and (got["step"] == step).all()
    want = _direct(store, ids, quantity, step)
    got["method"] = [_method(r) for r in got.itertuples()]
    got = got.set_index("method")
    assert sorted(got.index, key=str) == sorted(want.index, key=str)
    np.testing.assert_allclose(got["mean"], want.loc[got.index, "mean"], rtol=1e-12)
    np.testing.assert_allclose(got["std"], want.loc[got.index, "std"], rtol=1e-9, atol=1e-15)
    assert (got["seeds"] == want.loc[got.index, "count"]).all()
    assert got.loc[[("basis", 8, 0.0)], "seeds"].item() == (2 if step == 40 else 3)  # seed 2 never reached 40
    assert np.isnan(got.loc[[("basis", 8, 0.01)], "std"].item())  # one seed: no spread
    assert got.loc[[("exact", None, None)], "color"].item() == charts.EXACT_COLOR
    assert got.loc[[("basis", 1, 0.0)], "trace"].item() == "basis" and got.loc[[("basis", 8, 0.01)], "trace"].item() == "basis λ=0.01"
    if quantity == "val_loss":  # the numbers of Table 3 itself
        table = table3(records, store.metrics(ids), at_step).set_index(["estimator", "rank", "lam"])
        np.testing.assert_allclose(got.loc[[("basis", 1, 0.0)], "mean"].item(), table.loc[("basis", 1, 0.0), "val_loss_mean"])
    with pytest.raises(ValueError, match="unknown quantity"):
        method_frames.rank_frame(records, store.metrics(ids), "val_los")
    store.close()


def test_rank_frame_leaves_out_a_sketched_run_stored_without_a_rank(tmp_path):
    store = RunStore(f"sqlite:///{tmp_path / 'odd.db'}")
    exact = fake_run(store, dataclasses.replace(TINY, estimator="exact"))
    odd = store.runs.create_run(name="odd", config={"preset": "tiny", "steps": 40}, estimator="basis", rank=None, lam=0.0,
                           seed=0, preset="tiny", steps=40, status="finished")
    store.metrics.add_metrics(odd, [(step, 0.5, "val_loss", 7.0) for step in (0, 10, 20, 30, 40)])
    frame = method_frames.rank_frame(store.runs.list_runs(), store.metrics([exact, odd]), "val_loss", 40)
    assert frame["estimator"].tolist() == ["exact"]
    assert len(charts.rank_figure(frame, y_title="v").layout.annotations) == 1  # says there is nothing to place on R
    store.close()


def test_rank_figure_log_axis_error_bars_and_exact_band(tmp_path):
    store = RunStore(f"sqlite:///{tmp_path / 'fig.db'}")
    ids = _lab(store)
    frame = method_frames.rank_frame(store.runs.list_runs(), store.metrics(ids), "val_loss", 40)
    fig = charts.rank_figure(frame, y_title="validation loss (nats/token)", title="Validation loss against rank R")
    assert fig.layout.xaxis.type == "log" and list(fig.layout.xaxis.tickvals) == [1, 8]
    lines = {t.name: t for t in fig.data if t.error_y.array is not None}
    assert list(lines) == ["basis", "basis λ=0.01", "countsketch"]  # one line per (estimator, λ)
    sketched = frame[frame["estimator"] != "exact"]
    for name, trace in lines.items():
        rows = sketched[sketched["trace"] == name].sort_values("rank")
        np.testing.assert_allclose(trace.y, rows["mean"])
        np.testing.assert_allclose(np.asarray(trace.error_y.array, float), rows["std"])  # error bars = seed std
        np.testing.assert_allclose(np.asarray(trace.x) / rows["rank"].to_numpy(float), 2 ** (charts.RANK_DODGE * (list(lines).index(name) - 1)))
        assert [c[0] for c in trace.customdata] == rows["rank"].tolist()  # the hover's true R
        assert trace.line.color == rows["color"].iloc[-1]  # the colour of the line's largest R
        assert list(trace.marker.color) == rows["color"].tolist()
    assert lines["basis λ=0.01"].line.dash == "dash" and lines["basis"].line.dash == "solid"
    exact = frame[frame["estimator"] == "exact"].iloc[0]
    upper, lower, mean = fig.data[:3]
    assert lower.fill == "tonexty" and upper.y[0] == pytest.approx(exact["mean"] + exact["std"])
    assert lower.y[0] == pytest.approx(exact["mean"] - exact["std"]) and mean.y[0] == pytest.approx(exact["mean"])
    assert mean.name == "exact (mean ± std of 3 seeds)" and mean.x[0] < 1 and mean.x[-1] > 8  # across every rank
    empty = charts.rank_figure(frame[frame["estimator"] == "exact"], y_title="v")
    assert empty.layout.annotations[0].text.startswith("no sketched run")
    store.close()


# ----------------------------------------------------------------------------- the page


def _spec(at, title):
    return figures(at)[title]


def _array(value):
    """A plotly JSON array, typed (``bdata``) or plain."""
    if isinstance(value, dict) and "bdata" in value:
        data = np.frombuffer(base64.b64decode(value["bdata"]), dtype=np.dtype(value["dtype"]))
        return data.reshape([int(n) for n in str(value.get("shape", len(data))).split(",")])
    return np.asarray(value)


def test_compare_draws_the_central_figure_for_each_quantity(url, store):
    ids = _lab(store)
    at = page(app(selected=ids).run(), "compare")
    fig = _spec(at, RANK_TITLES["val_loss"])
    assert fig["layout"]["xaxis"]["type"] == "log"
    named = [t["name"] for t in fig["data"] if t.get("showlegend") is not False]
    assert named == ["exact (mean ± std of 3 seeds)", "basis", "basis λ=0.01", "countsketch"]
    assert sum(t.get("fill") == "tonexty" for t in fig["data"]) == 1  # the exact band
    assert at.select_slider(key="compare.at").value == "common"
    at.select_slider(key="compare.at").set_value(40).run()  # the one step control moves figure and summary
    fig = _spec(at, RANK_TITLES["val_loss"])
    basis = next(t for t in fig["data"] if t["name"] == "basis")
    assert _array(basis["customdata"])[:, 1].tolist() == [3, 2]  # R=8 seed 2 never reached step 40
    assert at.dataframe[0].value["step"].tolist() == ["40"] * 5
    summary = at.dataframe[0].value
    assert "90% CI vs ±0.02" in summary and "Δ per seed" in summary and "paper val" not in summary
    at.number_input(key="compare.margin").set_value(10.0).run()  # δ: a margin wider than any Δ here
    summary = at.dataframe[0].value
    judged = summary[summary["90% CI vs ±10"] != "—"]
    assert len(judged) and set(judged["verdict"]) == {"equivalent"}
    for quantity in ("cos_mean", "mem_saved_bytes"):
        at.radio(key="compare.rank_quantity").set_value(quantity).run()
        assert not at.exception
        fig = _spec(at, RANK_TITLES[quantity])
        assert fig["layout"]["yaxis"]["title"]["text"] == method_frames.RANK_QUANTITIES[quantity][1]


def test_compare_cosine_charts_follow_the_wall_time_axis(url, store):
    ids = _lab(store)
    at = page(app(selected=ids).run(), "compare")
    assert _spec(at, "Mean cosine over sketched layers")["layout"]["xaxis"]["title"]["text"] == "step"
    at.radio(key="compare.x").set_value("wall_time").run()
    cos = _spec(at, "Mean cosine over sketched layers")
    assert cos["layout"]["xaxis"]["title"]["text"] == "wall time (s)"
    rows = store.metrics([ids[0]], names=["cos_mean"])
    exact = next(t for t in cos["data"] if t["name"] == "exact · mean of 3 seeds")
    np.testing.assert_allclose(exact["x"], rows["wall_time"])  # seconds, not steps
    at.toggle(key="compare.per_layer").set_value(True).run()
    layers = _spec(at, "Cosine per sketched layer")
    assert all(layers["layout"][f"xaxis{i if i > 1 else ''}"]["title"]["text"] == "wall time (s)" for i in range(1, len(LAYERS) + 1))
    assert "exact runs are probed too" in at.toggle(key="compare.per_layer").help
    bare = page(app(selected=[fake_run(store, dataclasses.replace(TINY, estimator="exact"))]).run(), "compare")
    text = " ".join(i.value for i in bare.info)
    assert "exact runs too" in text and "sketched runs only" not in text  # exact is probed: its cosine is the reference 1.0


def test_every_compare_chart_downloads_in_the_sidebars_format(url, store):
    ids = _lab(store)
    at = page(app(selected=ids).run(), "compare")
    charts_on_page = plots(at)
    assert len(charts_on_page) >= 5
    assert {c["config"]["toImageButtonOptions"]["format"] for c in charts_on_page} == {"png"}
    at.radio(key=display.IMAGE_FORMAT).set_value("svg").run()
    charts_on_page = plots(at)
    configs = [c["config"]["toImageButtonOptions"] for c in charts_on_page]
    assert {c["format"] for c in configs} == {"svg"} and len(configs) >= 5
    assert all(c["filename"].startswith("basis-lab-") for c in configs)


class _Foreign:
    """A config as another program might have stored it: any name, any preset."""

    def __init__(self, config, name, preset):
        self.config, self.name, self.preset = config, name, preset

    def __getattr__(self, attr):
        return getattr(self.config, attr)

    def label(self):
        return self.name

    def to_dict(self):
        return {**self.config.to_dict(), "preset": self.preset}


def test_table3_downloads_and_a_neutralised_csv(url, store, downloads):
    formula = '=HYPERLINK("x")'
    ids = [fake_run(store, dataclasses.replace(TINY, estimator="exact")), fake_run(store, dataclasses.replace(TINY, rank=8))]
    ids.append(fake_run(store, _Foreign(dataclasses.replace(TINY, rank=8, seed=1), formula, formula)))
    assert store.runs.get_run(ids[-1]).name == formula
    at = page(app(selected=ids).run(), "compare")
    labels = [d.label for d in at.get("download_button")]
    assert labels == ["Table 3 as markdown", "Table 3 as latex", "Table 3 as csv"]
    markdown = _text(downloads["basis-table3.md"]())  # written on a click (deferred), not on every rerun
    assert markdown.startswith("| setup") and "| preset=" in markdown and "basis" in markdown  # rows name their setup
    assert "\\begin{tabular}" in _text(downloads["basis-table3.tex"]())
    csv = _text(downloads["basis-table3.csv"]())
    table = pd.read_csv(io.StringIO(csv), dtype=str, keep_default_na=False)
    assert list(table.columns[:11]) == ["estimator", "rank", "lam", "seeds", "step", "val_loss_mean", "val_loss_std",
                                        "delta_val_mean", "delta_val_ci95_low", "delta_val_ci95_high", "verdict"]
    assert "'" + formula in table["preset"].tolist()  # the foreign run's preset reaches the table, neutralised
    cells = [c for c in table.to_numpy().ravel() if c]
    assert not [c for c in cells if c[0] in "=+@\t\r" or (c[0] == "-" and not _number(c))]
    assert formula not in csv.replace("'" + formula, "")


def _text(data):
    return data.decode() if isinstance(data, bytes) else data


def _number(text):
    try:
        float(text)
        return True
    except ValueError:
        return False


# ----------------------------------------------------------------------------- the view in the URL, saved views


def test_view_state_decodes_what_it_encodes_and_names_what_it_cannot_read():
    from app import viewstate

    view = viewstate.ViewState(runs=(5, 1, 2), sweep="20261122-101500-3fa9c1", tag="pilot", pool=False,
                               x="wall_time", smoothing=0.6, log_y=True, group="lr", facet=True)
    assert viewstate.decode(viewstate.encode(view)) == view
    assert viewstate.encode(viewstate.DEFAULT) == {}
    assert viewstate.decode({"runs": "1,2,5", "pool": "1"}) == viewstate.ViewState(runs=(1, 2, 5))
    odd = viewstate.decode({"runs": "1,x,1", "pool": "maybe", "x": "time", "smooth": "2", "log": "1"})
    assert odd.runs == (1,) and odd.pool and odd.x == "step" and odd.smoothing == 0 and odd.log_y
    assert len(odd.problems) == 4 and "smooth='2'" in " ".join(odd.problems)
    assert viewstate.link("http://h:1/compare", viewstate.ViewState(runs=(1, 2), pool=False)) == \
        "http://h:1/compare?runs=1,2&pool=0"


def _compare_at(query: dict):
    at = app()
    at.query_params.update(query)
    at.switch_page("views/compare.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _controls(at) -> dict:
    return {k: at.session_state[k] for k in ("compare.pick", "compare.pool", "compare.x", "compare.smoothing",
                                             "compare.log_y", "compare.sweep", "compare.tag", "compare.group")}


def test_a_compare_url_opens_exactly_its_view_and_the_controls_write_it_back(url, store):
    from tests.support.runs import SWEEP_A, SWEEP_B, InSweep

    a = [fake_run(InSweep(store, SWEEP_A, ["pilot"]), dataclasses.replace(TINY, rank=r)) for r in (1, 8)]
    b = [fake_run(InSweep(store, SWEEP_B), dataclasses.replace(TINY, rank=r, seed=1)) for r in (1, 8)]
    at = _compare_at({"runs": f"{b[1]},{a[0]}", "pool": "0", "x": "wall_time", "smooth": "0.5", "log": "1"})
    assert _controls(at) == {"compare.pick": [b[1], a[0]], "compare.pool": False, "compare.x": "wall_time",
                             "compare.smoothing": 0.5, "compare.log_y": True, "compare.sweep": None,
                             "compare.tag": None, "compare.group": "method"}
    val = figures(at)["Validation loss"]
    assert sorted(t["name"] for t in val["data"] if t.get("showlegend") is not False) == ["basis R=1 s0", "basis R=8 s1"]
    assert val["layout"]["yaxis"]["type"] == "log"

    at.toggle(key="compare.pool").set_value(True)
    at.slider(key="compare.smoothing").set_value(0.2).run()
    written = dict(at.query_params)
    assert {k: (v[0] if isinstance(v, list) else v) for k, v in written.items()} == {
        "runs": f"{b[1]},{a[0]}", "x": "wall_time", "smooth": "0.2", "log": "1"}  # pool=1 is the default
    again = _compare_at({k: (v[0] if isinstance(v, list) else v) for k, v in written.items()})
    assert _controls(again) == _controls(at)  # the link round-trips

    by_sweep = _compare_at({"sweep": SWEEP_A})
    assert by_sweep.session_state["compare.pick"] == a  # every run of the sweep…
    later = fake_run(InSweep(store, SWEEP_A, ["pilot"]), dataclasses.replace(TINY, rank=32))
    by_sweep.run()
    assert by_sweep.session_state["compare.pick"] == [*a, later]  # …including one it gains later
    by_tag = _compare_at({"tag": "pilot", "runs": f"{a[1]},{b[0]}"})  # runs, narrowed to the tag
    assert by_tag.session_state["compare.pick"] == [a[1]]
    gone = _compare_at({"runs": f"{a[0]},999"})
    assert gone.session_state["compare.pick"] == [a[0]] and any("999" in w.value for w in gone.warning)


def test_a_view_is_saved_by_name_in_the_database_and_reopened(url, store):
    ids = [fake_run(store, dataclasses.replace(TINY, rank=r)) for r in (1, 8, 32)]
    at = _compare_at({"runs": f"{ids[0]},{ids[2]}", "log": "1"})
    at.text_input(key="compare.save_name").input("two ranks, log").run()
    at.button(key="share.save").click().run()
    assert store.views.saved_views() == {"two ranks, log": {"runs": f"{ids[0]},{ids[2]}", "log": "1"}}
    other = _compare_at({"runs": str(ids[1])})
    assert other.session_state["compare.pick"] == [ids[1]] and not other.session_state["compare.log_y"]
    other.selectbox(key="compare.saved").set_value("two ranks, log")
    other.button(key="share.open").click().run()
    assert other.session_state["compare.pick"] == [ids[0], ids[2]] and other.session_state["compare.log_y"]
    assert {k: (v[0] if isinstance(v, list) else v) for k, v in other.query_params.items()} == {
        "runs": f"{ids[0]},{ids[2]}", "log": "1"}


def test_colour_or_facet_by_a_config_field_or_a_tag(url, store):
    from tests.support.runs import SWEEP_A, InSweep

    ids = [fake_run(InSweep(store, SWEEP_A, [tag]), dataclasses.replace(TINY, rank=8, lr=lr, seed=s))
           for lr, tag in ((0.01, "low"), (0.02, "high")) for s in (0, 1)]
    info = frames.describe_runs([store.runs.get_run(i) for i in ids])
    assert frames.group_choices(info)[:3] == ["tag", "sweep", "lr"]  # the field that varies comes first
    by_lr = frames.grouped(info, "lr")
    assert by_lr["color"].tolist() == [charts.group_color(0)] * 2 + [charts.group_color(1)] * 2
    s = frames.series(store.metrics(ids), by_lr, "val_loss")
    assert set(s["trace"]) == {f"basis R=8 · lr={lr} · mean of 2 seeds" for lr in (0.01, 0.02)}  # said once
    by_tag = frames.group_values(info, "tag")
    assert by_tag.tolist() == ["low", "low", "high", "high"]
    assert list(frames.facets(info, "tag")) == ["tag=high", "tag=low"]

    at = _compare_at({"runs": ",".join(map(str, ids)), "group": "tag"})
    lines = [t for t in figures(at)["Validation loss"]["data"] if t.get("showlegend") is not False]
    assert {t["line"]["color"] for t in lines} == {charts.group_color(0), charts.group_color(1)}
    assert all(t["name"].startswith("basis R=8 · tag=") for t in lines)
    at.toggle(key="compare.facet").set_value(True).run()
    faceted = figures(at)["Validation loss, by tag"]
    assert [a["text"] for a in faceted["layout"]["annotations"]] == ["tag=high", "tag=low"]
    assert dict(at.query_params).get("facet") in ("1", ["1"]) and dict(at.query_params).get("group") in ("tag", ["tag"])


def test_colour_by_rank_leaves_exact_runs_out_and_orders_ranks_as_numbers(url, store):
    ids = [fake_run(store, dataclasses.replace(TINY, rank=r)) for r in (16, 8, 1)]
    exact = fake_run(store, dataclasses.replace(TINY, estimator="exact", rank=16))  # the form's rank, unused
    info = frames.describe_runs([store.runs.get_run(i) for i in [*ids, exact]])
    assert frames.group_values(info, "rank").tolist() == ["16", "8", "1", "—"]
    assert list(frames.facets(info, "rank")) == ["rank=1", "rank=8", "rank=16", "rank=—"]
    colours = frames.grouped(info, "rank").set_index("run_id")["color"]
    assert colours[exact] != colours[ids[0]]  # exact is not drawn as a rank-16 curve
    assert [colours[i] for i in (ids[2], ids[1], ids[0])] == [charts.group_color(k) for k in range(3)]


# ----------------------------------------------------------------------------- what sets runs apart


def test_compare_shows_a_parallel_coordinates_figure_and_the_config_diff(store):
    a = fake_run(store, dataclasses.replace(TINY, estimator="basis", rank=8), final=6.8)
    b = fake_run(store, dataclasses.replace(TINY, estimator="basis", rank=32, lr=TINY.lr * 2), final=6.5)
    c = fake_run(store, dataclasses.replace(TINY, estimator="exact"), final=6.6)
    at = page(app(selected=[a, b, c]), "compare")
    fig = figures(at)["Config fields that differ, and final metrics"]
    [trace] = fig["data"]
    assert trace["type"] == "parcoords"
    labels = [d["label"] for d in trace["dimensions"]]
    assert labels[:4] == ["estimator", "rank", "lam", "lr"] and "final val loss" in labels  # exact has no rank, λ
    diff = next(df.value for df in at.dataframe if "field" in df.value.columns)
    assert list(diff["field"]) == ["estimator", "rank", "lam", "lr"]
    names = {r.id: r.name for r in store.runs.list_runs()}
    assert list(diff.columns[1:]) == [f"#{i} {names[i]}" for i in (a, b, c)]
    assert diff.set_index("field").loc["rank", f"#{b} {names[b]}"] == "32"
    assert diff.set_index("field").loc["rank", f"#{c} {names[c]}"] == "—"
