"""A tuning campaign's report: the protocol section, the chosen values, the sensitivity figure and
Table 3 tuned and untuned, in the report model, its stored JSON, its HTML and its Markdown; and the
sensitivity figure itself (one curve per method, the chosen value starred, diverged trials at the
top edge, a log x axis). The campaign's runs are written as a worker would leave them (no training)."""

import math

import pandas as pd
import pytest

from engine.analysis import report as rep
from engine.analysis import tuning
from engine.analysis.tuning_charts import CHOSEN, DIVERGED, sensitivity_figure
from engine.config import RunConfig, Sweep
from engine.config.tuning import Range, TuneSpec
from engine.core.choices import DIVERGED_ERROR
from engine.reads import reports
from engine.runner import campaigns
from storage import RunStore

BASE = RunConfig(preset="tiny", steps=20, eval_interval=10, probe_interval=0, val_batches=2, lr=0.05)
GRID = Sweep(BASE, estimators=("basis",), ranks=(8,), lams=(0.0,), seeds=(0,), with_exact=True)
BEST = {"exact": 0.1, "basis": 0.02}  # each method's best lr in the made-up losses
TOO_HIGH = 0.2  # a trial above this lr diverges


def _loss(config: dict, split: str = "val") -> float:
    """A made-up final loss: a parabola in log lr around the method's best, seed noise on top."""
    best = BEST["exact" if config.get("rank") is None or config["estimator"] == "exact" else "basis"]
    noise = 0.004 * ((config["seed"] * 7) % 5 - 2) + (0.01 if split == "test" else 0.0)
    return 5.0 + 0.3 * math.log(config["lr"] / best) ** 2 + noise


def _end(store: RunStore, run_id: int, *, test: bool) -> None:
    """The run ended as a worker leaves it: finished with its validation (and test) losses, or
    failed as diverged when its lr is too high."""
    r = store.runs.get_run(run_id)
    if r.config["lr"] > TOO_HIGH:
        store.metrics.add_metrics(run_id, [(0, 0.1, "val_loss", 10.8)])
        store.runs.heartbeat(run_id, 7)
        store.runs.set_status(run_id, "failed", error=f"{DIVERGED_ERROR} nan at step 7")
        return
    val = _loss(r.config)
    rows = [(0, 0.1, "val_loss", 10.8), (10, 0.5, "val_loss", val + 0.5), (r.steps, 1.0, "val_loss", val),
            (r.steps, 1.0, "train_loss", val - 0.1), (r.steps, 1.0, "tokens_per_s", 1000.0)]
    if test:
        rows.append((r.steps, 1.0, "test_loss", _loss(r.config, "test")))
    store.metrics.add_metrics(run_id, rows)
    store.runs.heartbeat(run_id, r.steps)
    store.runs.set_status(run_id, "finished")


def make_campaign(store: RunStore, *, trials: int = 6, evaluate: bool = True) -> tuple[int, TuneSpec]:
    """A campaign (exact and basis R=8, lr tuned on [0.005, 0.5]) whose trials ended and, with
    ``evaluate``, whose comparison ended too, its runs reading the test split."""
    spec = TuneSpec(GRID, (Range("lr", 0.005, 0.5),), trials, (100, 101), (0, 1))
    cid, ids = campaigns.start(store, spec, name="lr fair fight")
    for run_id in ids:
        _end(store, run_id, test=False)
    if evaluate:
        for run_id in campaigns.advance(store, cid):
            _end(store, run_id, test=True)
    return cid, spec


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    url = f"sqlite:///{tmp_path_factory.mktemp('tuning-report') / 'lab.db'}"
    store = RunStore(url)
    cid, spec = make_campaign(store)
    campaign = store.campaigns.get(cid)
    report = reports.build(store, reports.selection_of(sweep=campaign.eval_sweep_id))
    yield store, campaign, spec, report
    store.close()


def test_the_report_of_a_comparison_holds_the_protocol_the_choices_and_both_tables(built):
    store, campaign, spec, report = built
    t = report.tuning
    assert t is not None and report.title == f"Tuning campaign {campaign.id} (lr fair fight): its comparison"
    assert dict(t.protocol)["search space"] == "lr log-uniform on [0.005, 0.5]"
    assert dict(t.protocol)["verdict read on"] == "the held-out test split"
    assert list(t.choices["method"]) == ["exact", "basis R=8"]
    chosen = campaign.chosen["values"]
    assert [f"lr={chosen[m]['lr']:.4g}" for m in ("exact", "basis R=8")] == list(t.choices["chosen"])
    assert [title for title, _ in t.tables] == ["each method at its own best value (tuned)",
                                                "every method at the untuned value"]
    tuned, untuned = (table for _, table in t.tables)
    assert set(tuned["split"]) == {"test"} and tuned["tuned"].str.startswith("lr=").all()
    assert report.table3.equals(tuned)  # the claims read the fair fight
    assert set(untuned["tuned"].fillna("")) == {""}
    kinds = [(b.kind, b.title) for b in report.blocks()]
    protocol = kinds.index(("heading", f"Protocol: tuning campaign {campaign.id}"))
    assert kinds[protocol + 2: protocol + 4] == [("table", "Protocol"), ("table", "Chosen value per method")]
    assert ("figure", "") in kinds[protocol:protocol + 6]  # the sensitivity figure in the section
    assert kinds.index(("heading", "Table 3, each method at its own best value (tuned)")) < kinds.index(
        ("heading", "Table 3, every method at the untuned value")) < kinds.index(("heading", "Claims of the paper"))
    figures = [b.name for b in report.blocks() if b.kind == "figure"]
    assert figures.count("sensitivity_lr") == 1 and figures[0] == "sensitivity_lr"


def test_the_stored_report_reads_back_with_its_tuning_section(built):
    _, _, _, report = built
    again = rep.Report.from_json(report.to_json())
    assert again.tuning.protocol == report.tuning.protocol and again.tuning.figures == ["sensitivity_lr"]
    assert again.tuning.choices.equals(report.tuning.choices)
    assert [t for t, _ in again.tuning.tables] == [t for t, _ in report.tuning.tables]
    assert [(b.kind, b.title) for b in again.blocks()] == [(b.kind, b.title) for b in report.blocks()]


def test_html_and_markdown_show_the_protocol_the_figure_and_both_tables(built):
    _, campaign, _, report = built
    html = rep.to_html(report)
    for text in (f"Protocol: tuning campaign {campaign.id}", "Chosen value per method", "lr log-uniform on [0.005, 0.5]",
                 "Table 3, each method at its own best value (tuned)", "Table 3, every method at the untuned value",
                 'id="figure-sensitivity_lr"'):
        assert text in html, text
    md = rep.to_markdown(report, "figs")
    assert f"## Protocol: tuning campaign {campaign.id}" in md and "**Chosen value per method**" in md
    assert "## Table 3, each method at its own best value (tuned)" in md
    assert "## Table 3, every method at the untuned value" in md
    assert "](figs/sensitivity_lr.svg)" in md and "lr log-uniform on \\[0.005, 0.5\\]" in md


def test_the_sensitivity_figure_one_curve_per_method_the_chosen_starred_diverged_at_the_top(built):
    store, campaign, spec, report = built
    fig = report.figures["sensitivity_lr"]
    assert fig.layout.xaxis.type == "log" and fig.layout.xaxis.title.text == "lr (log scale)"
    curves = [t for t in fig.data if t.mode == "lines+markers"]
    assert [t.name for t in curves] == ["exact", "basis R=8"]
    for t in curves:
        assert list(t.x) == sorted(t.x) and all(x <= TOO_HIGH for x in t.x)  # by value; a diverged trial has no mean
    [stars] = [t for t in fig.data if t.name == CHOSEN]
    assert stars.marker.symbol == "star"
    chosen = campaign.chosen["values"]
    assert list(stars.x) == [chosen["exact"]["lr"], chosen["basis R=8"]["lr"]]
    lost = [p["lr"] for p in spec.points if p["lr"] > TOO_HIGH]
    [x] = [t for t in fig.data if t.name == DIVERGED]
    assert lost and sorted(x.x) == sorted(lost * 2 * 2)  # every diverged run: 2 methods × 2 tuning seeds
    assert x.marker.symbol == "x" and len(set(x.y)) == 1  # all on one line
    assert max(x.y) < fig.layout.yaxis.range[1] and max(x.y) > max(max(t.y) for t in curves)  # at the top edge
    points = [t for t in fig.data if t.mode == "markers" and t.name.endswith("trials")]
    finished = [p for p in spec.points if p["lr"] <= TOO_HIGH]
    assert sum(len(t.x) for t in points) == 2 * 2 * len(finished)  # every finished trial run a point
    assert "run #" in points[0].hovertemplate and "seed" in points[0].hovertemplate


def test_a_report_of_another_sweep_has_no_tuning_section(tmp_path):
    store = RunStore(f"sqlite:///{tmp_path / 'plain.db'}")
    from tests.support.runs import SWEEP_A, TINY, InSweep, fake_run

    for rank in (1, 8):
        fake_run(InSweep(store, SWEEP_A), TINY.replace(rank=rank))
    fake_run(InSweep(store, SWEEP_A), TINY.replace(estimator="exact"))
    report = reports.build(store, reports.selection_of(sweep=SWEEP_A))
    assert report.tuning is None and not any(n.startswith("sensitivity") for n in report.figures)
    assert [b.title for b in report.blocks() if b.kind == "heading"][2] == (
        "Table 3: validation loss and the paired difference to exact backprop")
    assert rep.Report.from_json(report.to_json()).tuning is None
    store.close()


def test_the_figure_of_trials_still_running_says_so_and_draws_no_star():
    spec = TuneSpec(GRID, (Range("lr", 0.005, 0.5),), 3, (100,), (0,))
    trials = pd.DataFrame({"run_id": [1, 2], "method": ["exact", "exact"], "trial": [0, 1], "seed": [100, 100],
                           "status": ["running", "queued"], "steps_done": [3, 0], "val_loss": [math.nan, math.nan],
                           "diverged": [False, False], "lr": [0.01, 0.1]})
    fig = sensitivity_figure(trials, tuning.choose(spec, trials), "lr")
    assert fig.layout.annotations[0].text == "no trial has ended yet" and not fig.data
