"""What sets runs apart (``engine.analysis.parallel``): the config diff and the
parallel-coordinates figure derive their fields from the run schema."""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import pandas as pd

from engine.analysis.parallel import FINAL_METRICS, config_diff, differing, parallel_figure
from engine.config import RunConfig
from engine.config.run import schema

BASE = RunConfig(preset="tiny", steps=40, eval_interval=10, probe_interval=10)


def _record(run_id: int, **changes):
    config = dataclasses.replace(BASE, **changes).to_dict()
    return SimpleNamespace(id=run_id, name=f"run{run_id}<b>", config=config)


def _finals(values: dict[int, dict[str, float]]) -> pd.DataFrame:
    rows = [{"run_id": i, "name": n, "step": 40, "wall_time": 1.0, "value": v}
            for i, metrics in values.items() for n, v in metrics.items()]
    return pd.DataFrame(rows, columns=["run_id", "name", "step", "wall_time", "value"])


def test_differing_fields_follow_the_schema_and_leave_the_name_out():
    a, b = _record(1, rank=8, lr=0.01, name="a"), _record(2, rank=32, lr=0.02, steps=80, name="b")
    order = [f.name for f, _, _ in schema(RunConfig)]
    assert differing([a.config, b.config]) == sorted(["rank", "lr", "steps"], key=order.index)
    assert differing([a.config, dict(a.config)]) == []
    odd = dict(a.config, extra_old_field=1)  # a key of another version's schema: it differs (missing in one)
    assert differing([a.config, odd]) == ["extra_old_field"]


def test_config_diff_has_one_column_per_run_and_only_the_fields_that_differ():
    records = [_record(2, rank=32, dataset_options={"path": "b/*.txt"}, dataset="files"), _record(1, rank=8)]
    diff = config_diff(records)
    assert list(diff.columns) == ["field", "#1 run1<b>", "#2 run2<b>"]
    rows = diff.set_index("field")
    assert rows.loc["rank"].tolist() == ["8", "32"]
    assert rows.loc["dataset"].tolist() == [BASE.dataset, "files"]
    assert rows.loc["dataset_options", "#2 run2<b>"] == '{"path": "b/*.txt"}'
    assert "name" not in rows.index and "seed" not in rows.index
    assert list(config_diff([records[0]]).columns) == ["field"]
    assert config_diff([_record(1), _record(2)]).empty


def test_parallel_figure_has_an_axis_per_differing_field_and_final_metric():
    records = [_record(1, rank=8, estimator="basis"), _record(2, rank=32, estimator="countsketch"),
               _record(3, rank=8, estimator="countsketch")]
    finals = _finals({1: {"val_loss": 6.5, "train_loss": 6.4}, 2: {"val_loss": 6.9, "train_loss": 6.8},
                      3: {"val_loss": math.nan}})
    fig = parallel_figure(records, finals, title="t")
    [trace] = fig.data
    dims = {d.label: d for d in trace.dimensions}
    assert list(dims) == ["estimator", "rank", FINAL_METRICS["val_loss"], FINAL_METRICS["train_loss"]]
    assert list(dims["rank"].values) == [8.0, 32.0, 8.0]  # numeric: on a numeric axis
    assert list(dims["estimator"].ticktext) == ["basis", "countsketch"]  # text: its values in sorted order
    assert list(dims["estimator"].values) == [0, 1, 1]
    val = list(dims[FINAL_METRICS["val_loss"]].values)
    assert val[:2] == [6.5, 6.9] and math.isnan(val[2])
    assert math.isnan(list(dims[FINAL_METRICS["train_loss"]].values)[2])  # run 3 has none
    assert list(trace.line.color)[:2] == [6.5, 6.9] and trace.line.colorbar.title.text == FINAL_METRICS["val_loss"]


def test_parallel_figure_escapes_text_and_says_why_when_there_is_nothing_to_draw():
    records = [_record(1, dataset="files", dataset_options={"path": "<img src=x>"}), _record(2)]
    fig = parallel_figure(records, _finals({}))
    ticks = [t for d in fig.data[0].dimensions if d.ticktext for t in d.ticktext]
    assert any("&lt;img" in t for t in ticks) and not any("<img" in t for t in ticks)
    one = parallel_figure(records[:1], _finals({1: {"val_loss": 6.0}}))
    assert not one.data and "two or more runs" in one.layout.annotations[0].text
    same = parallel_figure([_record(1), _record(2)], _finals({}))
    assert not same.data and "share their config" in same.layout.annotations[0].text


def test_exact_backprop_has_no_rank_or_lam_and_ranks_sort_by_value():
    records = [_record(1, estimator="exact", rank=32), _record(2, rank=32), _record(3, rank=8), _record(4, rank=128)]
    diff = config_diff(records).set_index("field")
    assert diff.loc["rank"].tolist() == ["—", "32", "8", "128"]
    fig = parallel_figure(records, _finals({i: {"val_loss": 6.0 + i / 10} for i in range(1, 5)}))
    rank = next(d for d in fig.data[0].dimensions if d.label == "rank")
    assert list(rank.ticktext) == ["8", "32", "128", "—"] and list(rank.values) == [3, 1, 0, 2]
