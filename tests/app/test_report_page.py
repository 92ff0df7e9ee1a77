"""The Report page, the Launch page's "Reproduce the paper" and Run detail's link to a run's
report, under Streamlit's AppTest on the per-test database (runs written as a worker writes them)."""

import dataclasses
import io
import zipfile

from app import state
from app.text import plain
from engine.config import RunConfig, reproduction_sweep
from engine.reads import reports
from tests.support.pages import app, button, downloads, page, plots, store, url  # noqa: F401  (fixtures)
from tests.support.runs import TINY, fake_run

HOSTILE = "![x](http://127.0.0.1:9/x.png) <b>bold</b>"


def _sweep(store, tags=("reproduce", HOSTILE)):
    ids = []
    for seed in (0, 1):
        ids.append(fake_run(store, dataclasses.replace(TINY, estimator="exact", seed=seed)))
        for rank in (1, 8):
            ids.append(fake_run(store, dataclasses.replace(TINY, rank=rank, seed=seed), final=6.0 + 0.4 / rank + 0.01 * seed))
    with store.db.session(write=True) as s:
        from storage.models import Run
        for run in s.query(Run).filter(Run.id.in_(ids)):
            run.sweep_id, run.tags = "sw-page", list(tags)
    return ids


def test_the_report_page_shows_a_stored_report_and_downloads_it(url, store, downloads):
    _sweep(store)
    report_id = reports.save(store, reports.build(store, reports.selection_of(sweep="sw-page")))
    at = app()
    at.query_params["id"] = str(report_id)
    at = page(at.run(), "report")
    assert not at.error
    assert [h.value for h in at.header][0].replace("\\", "") == "Reproduction of the paper: sweep sw-page"  # tagged reproduce
    claims = next(d.value for d in at.table if list(d.value.columns) == ["claim", "verdict", "numbers"])  # wraps
    assert len(claims) == 5 and set(claims["verdict"]) <= {"supported", "inconclusive", "not supported", "not measured"}
    table3 = next(d.value for d in at.dataframe if "Δ val vs exact" in d.value.columns)
    assert list(table3["method"]) == ["exact", "basis", "basis"] and list(table3["rank"]) == ["—", "1", "8"]
    assert len(plots(at)) == 5
    assert all("http://127.0.0.1:9" not in m.value or "\\!\\[x\\]" in m.value for m in at.markdown)

    html = downloads["basis-lab-report-%d.html" % report_id]().decode()
    assert html.startswith("<!DOCTYPE html>") and html.count("Plotly.newPlot(") == 5
    with zipfile.ZipFile(io.BytesIO(downloads["basis-lab-report-%d.zip" % report_id]())) as z:
        names = sorted(z.namelist())
        text = z.read(f"basis-lab-report-{report_id}.md").decode()
    assert f"basis-lab-report-{report_id}.md" in names
    assert sorted(n for n in names if n.endswith(".svg")) == sorted(
        f"basis-lab-report-{report_id}-figures/{n}.svg" for n in ("loss_vs_rank", "validation", "cosine", "memory", "step_time"))
    assert "## Claims of the paper" in text


def test_a_report_is_built_from_the_page_and_rebuilt(url, store):
    _sweep(store, tags=("pilot",))
    at = page(app().run(), "report")
    assert "No reports yet" in at.info[0].value
    at.selectbox(key="report.sweep").set_value("sw-page").run()
    button(at, "Build report").click().run()
    assert not at.exception and not at.error
    [stored] = store.reports.list_reports()
    assert stored.sweep_id == "sw-page" and len(stored.run_ids) == 6
    button(at, "Rebuild from the database").click().run()
    assert [r.id for r in store.reports.list_reports()] == [stored.id]  # rebuilt in place
    button(at, "Delete report").click().run()
    assert store.reports.list_reports() == []


def test_run_detail_links_to_its_report(url, store):
    ids = _sweep(store)
    at = app()
    at.session_state["detail.pick"] = ids[1]
    at = page(at.run(), "detail")
    link = next(p for p in at.get("page_link") if p.proto.label.startswith("Build a report"))
    assert link.proto.page.endswith("report") and "sweep=sw-page" in link.proto.query_string
    report_id = reports.save(store, reports.build(store, reports.selection_of(sweep="sw-page")))
    at = page(at, "detail")
    link = next(p for p in at.get("page_link") if p.proto.label.startswith(plain("Report: ")))  # plain text: stored title
    assert link.proto.page.endswith("report") and f"id={report_id}" in link.proto.query_string


def test_reproduce_the_paper_queues_exactly_the_grid_with_its_estimate_shown_first(url, store):
    paper = RunConfig(preset="paper", steps=40, eval_interval=10, probe_interval=10, lam=0.01)
    for config in [dataclasses.replace(paper, estimator="exact", lam=0.0)] + [
            dataclasses.replace(paper, rank=r) for r in (1, 8, 16, 32, 64)]:
        fake_run(store, config)  # history: the estimate is known without compiling
    before = {r.id for r in store.runs.list_runs()}
    at = page(app().run(), "launch")
    at.number_input(key="launch.reproduce.steps").set_value(30).run()
    at.text_input(key="launch.reproduce.seeds").input("0, 1").run()
    shown = " ".join(m.value for m in at.markdown)
    assert "**12 runs**, 30 steps each" in shown and "Estimated time **≈" in shown and "timed by earlier runs" in shown
    assert {r.id for r in store.runs.list_runs()} == before  # nothing queued before the click
    at.toggle(key="launch.reproduce.queue_only").set_value(True).run()
    button(at, "Reproduce the paper").click().run()
    assert not at.exception and not at.error
    queued = [r for r in store.runs.list_runs() if r.id not in before]
    assert [RunConfig.from_dict(r.config) for r in queued] == reproduction_sweep(30, (0, 1)).expand()
    assert {tuple(r.tags) for r in queued} == {("reproduce",)} and len({r.sweep_id for r in queued}) == 1
    assert {r.status for r in queued} == {"queued"} and state.SELECTED in at.session_state
