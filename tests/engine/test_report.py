"""Reports (``engine.analysis.report``, ``engine.runner.reports``, ``python -m engine report``)
built from a fixture database of stored runs: 2 seeds of exact and of basis at 3 ranks,
written as the metrics a worker writes (``tests.app.test_logic.fake_run``), and one
estimator diagnosis.

The report's Table 3 is the database's: every number equals ``engine summary --format
csv``'s, after storing and rebuilding. The HTML opens in Chromium with every request
that is not the file itself aborted, and none is attempted; every figure is drawn. The
Markdown renders (the ``markdown`` package), its figures are SVG files beside it.
"""

import dataclasses
import io
import os
import re
from pathlib import Path

import markdown
import numpy as np
import pandas as pd
import pytest

from engine.analysis import claims
from engine.analysis import report as rep
from engine.analysis.summary import TABLE3_COLUMNS
from engine.cli.main import main
from engine.config import RunConfig
from engine.runner import reports
from storage import RunStore
from tests.support.runs import fake_run

HOSTILE_TAG = '<img src="http://127.0.0.1:9/tag.png"> ![x](http://127.0.0.1:9/md.png)'
BASE = RunConfig(preset="tiny", steps=40, eval_interval=10, probe_interval=10, lam=0.01)
RANKS = (1, 8, 32)
SAVED = {1: 9e6, 8: 10e6, 32: 12e6}  # bytes kept for backward rise with R; exact keeps 13e6


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """The fixture database: (url, run ids, sweep id)."""
    path = tmp_path_factory.mktemp("report") / "lab.db"
    url = f"sqlite:///{path}"
    store = RunStore(url)
    ids = []
    for seed in (0, 1):
        ids.append(fake_run(store, dataclasses.replace(BASE, estimator="exact", lam=0.0, seed=seed), final=6.0))
        for rank in RANKS:
            config = dataclasses.replace(BASE, rank=rank, seed=seed)
            ids.append(fake_run(store, config, final=6.0 + 0.5 / rank + 0.002 * seed, saved=SAVED[rank]))
    with store._session(write=True) as s:  # one sweep, as `reproduce` queues it
        from storage.models import Run
        for run in s.query(Run).filter(Run.id.in_(ids)):
            run.sweep_id, run.tags = "sw-fixture", ["reproduce", HOSTILE_TAG]
    diag = store.create_diagnostic(ids[1], 40, {"keys": 1024})
    store.claim_diagnostic(diag, "test")
    rows = []
    for est, rank, bias2, var in [("countsketch", 8, 0.0, 0.9), ("balanced", 8, 0.0, 0.6), ("scalars", 8, 0.05, 0.7),
                                  ("basis", 8, 0.04, 0.45)]:
        for layer in ("all", "head"):
            rows.append({"layer": layer, "estimator": est, "rank": rank, "lam": 0.0, "bias2": bias2, "bias2_se": 0.01,
                         "variance": var, "mse": bias2 + var, "cos_mean": 0.6, "keys": 1024, "batches": 2})
    store.add_diagnostic_results(diag, rows)
    store.set_diagnostic_status(diag, "finished")
    store.close()
    return url, ids, "sw-fixture"


def _summary_csv(url, ids, capsys, at_step=None) -> pd.DataFrame:
    argv = ["summary", "--db", url, "--format", "csv", "--runs", *map(str, ids)]
    if at_step is not None:
        argv += ["--at-step", str(at_step)]
    capsys.readouterr()
    assert main(argv) == 0
    return pd.read_csv(io.StringIO(capsys.readouterr().out), keep_default_na=True)


def _assert_same_numbers(table: pd.DataFrame, csv: pd.DataFrame) -> None:
    assert list(table.columns) == TABLE3_COLUMNS == list(csv.columns)
    assert len(table) == len(csv) > 0
    for column in TABLE3_COLUMNS:
        ours, theirs = table[column], csv[column]
        numeric = pd.to_numeric(theirs, errors="coerce")
        if numeric.notna().any() or column in ("delta_val_mean", "delta_val_ci95_low"):
            got = pd.to_numeric(ours, errors="coerce").to_numpy(float)
            want = numeric.to_numpy(float)
            assert np.array_equal(np.isnan(got), np.isnan(want)), column
            np.testing.assert_allclose(got[~np.isnan(got)], want[~np.isnan(want)], rtol=1e-12, atol=0, err_msg=column)
        else:
            assert [("" if v is None or (isinstance(v, float) and np.isnan(v)) else str(v)) for v in ours] == [
                ("" if isinstance(v, float) and np.isnan(v) else str(v)) for v in theirs], column


def test_a_stored_and_rebuilt_report_holds_the_summary_numbers(lab, tmp_path, capsys):
    url, ids, sweep = lab
    csv = _summary_csv(url, ids, capsys)
    assert main(["report", "--db", url, "--sweep", sweep]) == 0
    err = capsys.readouterr().err
    report_id = int(re.search(r"stored as report (\d+)", err).group(1))
    store = RunStore(url)
    stored = reports.load(store, report_id)
    assert sorted(stored.run_ids) == sorted(ids) and stored.selection == {"sweep": sweep}
    _assert_same_numbers(stored.table3, csv)
    assert set(stored.table3["verdict"]) == {"reference", "worse"}

    assert main(["report", "--db", url, "--id", str(report_id), "--rebuild"]) == 0
    rebuilt = reports.load(store, report_id)  # replaced in place: the same id, one report of the sweep
    assert [r.id for r in store.list_reports(sweep_id=sweep)] == [report_id]
    _assert_same_numbers(rebuilt.table3, csv)

    at = _summary_csv(url, ids, capsys, at_step=20)
    assert main(["report", "--db", url, "--runs", *map(str, ids), "--at-step", "20"]) == 0
    fixed = reports.load(store, int(re.search(r"stored as report (\d+)", capsys.readouterr().err).group(1)))
    _assert_same_numbers(fixed.table3, at)
    assert set(fixed.table3["step"]) == {20}

    # the Markdown shows the same numbers, rounded as displayed
    text = rep.to_markdown(rebuilt, "f")
    lines = text.split("**Table 3**", 1)[1].split("\n\n")[2].splitlines()
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    shown = [dict(zip(header, (c.strip() for c in x.strip("|").split("|")))) for x in lines[2:]]
    assert len(shown) == len(csv)
    for row, cells in zip(csv.itertuples(), shown):
        assert cells["method"] == row.estimator and cells["rank"] == ("—" if np.isnan(row.rank) else str(int(row.rank)))
        assert cells["val loss"] == f"{row.val_loss_mean:.4f} ± {row.val_loss_std:.4f}"
        assert cells["verdict"] == row.verdict
        if row.estimator != "exact":
            assert cells["Δ val vs exact"] == f"{row.delta_val_mean:+.4f}"
            assert cells["95% CI"] == f"\\[{row.delta_val_ci95_low:+.4f}, {row.delta_val_ci95_high:+.4f}\\]"
    store.close()


def test_every_verdict_has_its_html_class():
    assert all(f".verdict-{v.replace(' ', '-')}{{" in rep.STYLE for v in claims.VERDICTS)


def test_claims_read_the_fixture(lab):
    url, ids, sweep = lab
    store = RunStore(url)
    built = reports.build(store, reports.selection_of(sweep=sweep))
    verdicts = {v.key: v.verdict for v in built.verdicts}
    # on 1024 keys: balanced < countsketch and basis < scalars in variance (ratios 0.67, 0.64, intervals
    # ×/÷ 1.13); scalars lower variance and MSE than their twins
    assert verdicts["a"] == "supported" and verdicts["b"] == "supported"
    assert verdicts["c"] == "not supported"  # R=32 is 0.0166 worse: |Δ| < 0.02, but its interval excludes 0
    assert verdicts["d"] == "supported"  # 9 < 10 < 12 MB, exact 13 MB
    assert verdicts["e"] == "not supported"  # every run reports 1000 tokens/s: no rank is faster
    assert len(built.diagnoses) == 4 and set(built.diagnoses["layer"]) == {"all"}
    store.close()


@pytest.fixture(scope="module")
def written(lab, tmp_path_factory):
    url, ids, sweep = lab
    store = RunStore(url)
    built = reports.build(store, reports.selection_of(sweep=sweep))
    out = tmp_path_factory.mktemp("written")
    paths = {"html": reports.write(built, out / "report.html"), "md": reports.write(built, out / "report.md")}
    store.close()
    return built, paths


def test_the_html_is_one_file_with_plotly_inlined_once(written):
    built, paths = written
    assert paths["html"] == [paths["html"][0]]
    text = paths["html"][0].read_text()
    assert text.count("<script src=") == 0 and "cdn.plot.ly/plotly" not in text.split("</head>")[0]
    assert text.count("Plotly.newPlot(") == len(built.figures) == 5
    assert len(re.findall(r"\* plotly\.js v\d", text)) == 1  # the library's banner: inlined once
    assert "Content-Security-Policy" in text and "default-src 'none'" in text
    assert HOSTILE_TAG not in text and "&lt;img src=&quot;http://127.0.0.1:9/tag.png&quot;&gt;" in text


@pytest.mark.browser
def test_the_html_opens_offline_in_chromium_with_every_figure_drawn(written):
    from tests.support.browser import CHROMIUM_ARGS, playwright_and_chromium

    sync_playwright, chromium = playwright_and_chromium()
    built, paths = written
    attempted = []

    def only_the_file(route):
        if route.request.url.startswith("file://"):
            route.continue_()
        else:
            attempted.append(route.request.url)
            route.abort()

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(offline=True)
            context.route("**/*", only_the_file)
            page = context.new_page()
            page.set_default_timeout(120_000)
            page.goto(paths["html"][0].as_uri())
            page.wait_for_function(f"document.querySelectorAll('.js-plotly-plot .main-svg').length >= {len(built.figures)}")
            drawn = page.evaluate("""() => Array.from(document.querySelectorAll('.js-plotly-plot')).map(gd => ({
                id: gd.id, svg: gd.querySelectorAll('svg.main-svg').length,
                traces: (gd._fullData || []).length, title: gd.layout.title && gd.layout.title.text}))""")
            tables = page.evaluate("document.querySelectorAll('table').length")
            page.set_viewport_size({"width": 420, "height": 900})  # a phone: wide tables scroll in their own box
            page.wait_for_timeout(1000)
            narrow = page.evaluate("document.documentElement.scrollWidth")
        finally:
            browser.close()
    assert attempted == []
    assert sorted(d["id"] for d in drawn) == sorted(f"figure-{n}" for n in built.figures)
    assert all(d["svg"] >= 1 and d["traces"] >= 1 for d in drawn), drawn
    assert tables >= 5
    assert narrow <= 420, f"the page is {narrow} px wide at 420 px"


def test_the_markdown_renders_with_svg_figures_beside_it(written):
    built, paths = written
    md_path, *figures = paths["md"]
    assert [f.name for f in figures] == [f"{n}.svg" for n in built.figures]
    assert all(f.parent == md_path.parent / "report-figures" for f in figures)
    assert all(f.read_text().lstrip().startswith("<svg") and f.stat().st_size > 3000 for f in figures)
    text = md_path.read_text()
    page = markdown.markdown(text, extensions=["tables"])
    sources = re.findall(r'<img[^>]*src="([^"]+)"', page)
    assert sources == [f"report-figures/{n}.svg" for n in built.figures]
    assert all((md_path.parent / s).is_file() for s in sources)
    assert page.count("<table>") == len([b for b in built.blocks() if b.kind == "table"])
    assert "http://127.0.0.1:9" not in " ".join(sources) and "<img src=\"http" not in page
    assert page.count("<h2>") >= 5 and "Claims of the paper" in page
    claims_table = page.split("Claims of the paper", 1)[1].split("</table>", 1)[0]
    assert claims_table.count("<tr>") == 1 + 5 and "supported" in claims_table


def test_a_sweep_tagged_reproduce_gets_its_report_when_its_last_run_ends(tmp_path):
    store = RunStore(f"sqlite:///{tmp_path / 'auto.db'}")
    first = fake_run(store, dataclasses.replace(BASE, estimator="exact", lam=0.0))
    second = fake_run(store, BASE, status="queued")
    plain = fake_run(store, BASE)
    with store._session(write=True) as s:
        from storage.models import Run
        for run in s.query(Run).filter(Run.id.in_([first, second])):
            run.sweep_id, run.tags = "sw-auto", ["reproduce"]
        s.get(Run, plain).sweep_id = "sw-plain"
    assert reports.report_if_sweep_ended(store, first) is None  # a run of the sweep is still queued
    assert reports.report_if_sweep_ended(store, plain) is None  # not tagged reproduce
    store.set_status(second, "running")
    store.set_status(second, "interrupted")
    assert reports.report_if_sweep_ended(store, first) is None  # interrupted: it will resume
    store.set_status(second, "finished")
    report_id = reports.report_if_sweep_ended(store, second)
    assert report_id is not None and reports.report_if_sweep_ended(store, first) == report_id
    stored = store.get_report(report_id)
    assert (stored.sweep_id, stored.key, sorted(stored.run_ids)) == ("sw-auto", "sweep:sw-auto", [first, second])
    assert stored.title.startswith("Reproduction of the paper")
    assert store.list_reports(run_id=plain) == []
    store.close()


@pytest.mark.slow
def test_the_job_manager_stores_the_report_of_a_reproduce_sweep_it_trains(tmp_path):
    from engine.runner.jobs import JobManager

    store = RunStore(f"sqlite:///{tmp_path / 'jobs.db'}")
    tiny = RunConfig(preset="tiny", steps=2, eval_interval=1, probe_interval=1, val_batches=1)
    manager = JobManager(store, max_concurrent=1, checkpoints=tmp_path / "ckpt")
    try:
        ids = manager.submit([tiny.replace(estimator="exact"), tiny.replace(rank=1)], sweep_id="sw-jobs",
                             tags=("reproduce",))
        assert manager.wait(ids, timeout=600)
    finally:
        manager.shutdown()
    assert [store.get_run(i).status for i in ids] == ["finished", "finished"]
    [record] = store.list_reports(sweep_id="sw-jobs")
    assert sorted(record.run_ids) == sorted(ids)
    assert len(reports.load(store, record.id).table3) == 2
    store.close()


@pytest.mark.parametrize("argv, message", [
    (["--out", "report.pdf"], "write the report as .html"),
    (["--sweep", "nope"], "sweep 'nope': no runs to report on"),
    (["--id", "999"], "no report 999"),
    (["--rebuild"], "--rebuild needs --id"),
    (["--at-step", "-1"], "--at-step must be >= 0"),
])
def test_bad_report_requests_exit_2_and_write_nothing(lab, tmp_path, capsys, argv, message, monkeypatch):
    url, _, _ = lab
    monkeypatch.chdir(tmp_path)
    before = len(RunStore(url).list_reports())
    assert main(["report", "--db", url, *argv]) == 2
    assert message in capsys.readouterr().err
    assert list(Path(tmp_path).iterdir()) == [] and len(RunStore(url).list_reports()) == before


def test_an_existing_file_is_not_overwritten_without_force(written, tmp_path):
    built, _ = written
    target = tmp_path / "r.html"
    target.write_text("mine")
    with pytest.raises(reports.ReportError, match="already exists; pass --force"):
        reports.write(built, target)
    assert target.read_text() == "mine"
    reports.write(built, target, force=True)
    assert target.read_text().startswith("<!DOCTYPE html>")
    umask = os.umask(0)
    os.umask(umask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~umask  # as open() would make it, not private
    assert [p.name for p in tmp_path.iterdir()] == ["r.html"]  # no temporary file left behind
