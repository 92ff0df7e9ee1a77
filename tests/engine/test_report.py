"""Reports (``engine.analysis.report``, ``engine.reads.reports``, ``python -m engine report``)
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
import json
import os
import re
import subprocess
import sys
import tomllib
import zipfile
from html.parser import HTMLParser
from pathlib import Path

import markdown
import numpy as np
import pandas as pd
import pytest

from engine.analysis import claims
from engine.analysis import report as rep
from engine.analysis.report.stored import decode_frame, encode_frame
from engine.analysis.summary import TABLE3_COLUMNS
from engine.cli.main import main
from engine.config import RunConfig
from engine.reads import reports
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
    with store.db.session(write=True) as s:  # one sweep, as `reproduce` queues it
        from storage.models import Run
        for run in s.query(Run).filter(Run.id.in_(ids)):
            run.sweep_id, run.tags = "sw-fixture", ["reproduce", HOSTILE_TAG]
    diag = store.diagnostics.create_diagnostic(ids[1], 40, {"keys": 1024})
    store.diagnostics.claim_diagnostic(diag, "test")
    rows = []
    for est, rank, bias2, var in [("countsketch", 8, 0.0, 0.9), ("balanced", 8, 0.0, 0.6), ("scalars", 8, 0.05, 0.7),
                                  ("basis", 8, 0.04, 0.45)]:
        for layer in ("all", "head"):
            rows.append({"layer": layer, "estimator": est, "rank": rank, "lam": 0.0, "bias2": bias2, "bias2_se": 0.01,
                         "variance": var, "mse": bias2 + var, "cos_mean": 0.6, "keys": 1024, "batches": 2})
    store.diagnostics.add_diagnostic_results(diag, rows)
    store.diagnostics.set_diagnostic_status(diag, "finished")
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
    # two seeds and three ranks: Holm's adjustment over the table's 9 tests leaves some rows undecided
    assert set(stored.table3["verdict"]) <= {"reference", "worse", "inconclusive"} and "worse" in set(
        stored.table3["verdict"]) and stored.table3["holm_tests"].max() == 9

    assert main(["report", "--db", url, "--id", str(report_id), "--rebuild"]) == 0
    rebuilt = reports.load(store, report_id)  # replaced in place: the same id, one report of the sweep
    assert [r.id for r in store.reports.list_reports(sweep_id=sweep)] == [report_id]
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


def test_a_report_judges_against_the_margin_it_is_built_with_and_keeps_it(lab, capsys):
    url, ids, sweep = lab
    assert main(["report", "--db", url, "--runs", *map(str, ids), "--margin", "0.05", "--no-adjust"]) == 0
    err = capsys.readouterr().err
    report_id = int(re.search(r"stored as report (\d+)", err).group(1))
    assert "(c) supported: BASIS at R = 32 matches exact backprop.\n    to decide it: basis R=32" in err
    store = RunStore(url)
    built = reports.load(store, report_id)
    r32 = built.table3[(built.table3["estimator"] == "basis") & (built.table3["rank"] == 32)].iloc[0]
    assert built.selection["margin"] == 0.05 and r32["margin"] == 0.05 and built.selection["adjust"] is False
    assert r32["verdict"] == "equivalent" and -0.05 < r32["delta_val_ci90_low"] < r32["delta_val_ci90_high"] < 0.05
    assert {v.key: v.verdict for v in built.verdicts}["c"] == "supported"
    assert "δ = 0.05 nats" in rep.to_markdown(built, "f")
    _, again = reports.rebuild(store, report_id)  # rebuilt from its selection: the same margin
    assert (again.table3["margin"] == 0.05).all() and (again.table3["holm_tests"] == 0).all()
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
    # R=32 is +0.0162 over 2 seeds: its 90 % interval [+0.010, +0.022] reaches past +0.02 and not wholly beyond
    assert verdicts["c"] == "inconclusive"
    power = {v.key: v.power for v in built.verdicts}
    assert "observed Δ SD" in power["c"] and "2 seeds give" in power["c"]
    assert verdicts["d"] == "supported"  # 9 < 10 < 12 MB, exact 13 MB
    assert verdicts["e"] == "not supported"  # every run, each alone, reports 1000 tokens/s: no change with R
    text = rep.to_markdown(built, "figures")
    assert "What would decide each claim" in text and "Note: The paper" not in text  # tiny preset: no paper note
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
    assert HOSTILE_TAG not in text
    page = _Page()
    page.feed(text)
    assert "img" not in page.tags and any(HOSTILE_TAG in t for t in page.texts)  # the tag shows as text


class _Page(HTMLParser):
    """The elements of an HTML page and its text outside scripts and styles, entities decoded."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tags, self.texts, self._raw = [], [], None

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self._raw = tag if tag in ("script", "style") else None

    def handle_endtag(self, tag):
        self._raw = None

    def handle_data(self, data):
        if self._raw is None:
            self.texts.append(data)


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
            page.set_viewport_size({"width": 420, "height": 900})  # a phone: wide tables scroll in their box
            page.wait_for_timeout(500)
            overflow = page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
        finally:
            browser.close()
    assert attempted == []
    assert sorted(d["id"] for d in drawn) == sorted(f"figure-{n}" for n in built.figures)
    assert all(d["svg"] >= 1 and d["traces"] >= 1 for d in drawn), drawn
    assert tables >= 5
    assert overflow <= 0, f"the page is {overflow} px wider than a 420 px window"


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
    with store.db.session(write=True) as s:
        from storage.models import Run
        for run in s.query(Run).filter(Run.id.in_([first, second])):
            run.sweep_id, run.tags = "sw-auto", ["reproduce"]
        s.get(Run, plain).sweep_id = "sw-plain"
    assert reports.report_if_sweep_ended(store, first) is None  # a run of the sweep is still queued
    assert reports.report_if_sweep_ended(store, plain) is None  # not tagged reproduce
    store.runs.set_status(second, "running")
    store.runs.set_status(second, "interrupted")
    assert reports.report_if_sweep_ended(store, first) is None  # interrupted: it will resume
    store.runs.set_status(second, "finished")
    report_id = reports.report_if_sweep_ended(store, second)
    assert report_id is not None and reports.report_if_sweep_ended(store, first) == report_id
    stored = store.reports.get_report(report_id)
    assert (stored.sweep_id, stored.key, sorted(stored.run_ids)) == ("sw-auto", "sweep:sw-auto", [first, second])
    assert stored.title.startswith("Reproduction of the paper")
    assert store.reports.list_reports(run_id=plain) == []
    store.close()


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
    assert [store.runs.get_run(i).status for i in ids] == ["finished", "finished"]
    [record] = store.reports.list_reports(sweep_id="sw-jobs")
    assert sorted(record.run_ids) == sorted(ids)
    assert len(reports.load(store, record.id).table3) == 2
    store.close()


@pytest.mark.parametrize("argv, message", [
    (["--out", "report.pdf"], "write the report as .html"),
    (["--sweep", "nope"], "sweep 'nope': no runs to report on"),
    (["--id", "999"], "no report 999"),
    (["--rebuild"], "--rebuild needs --id"),
    (["--at-step", "-1"], "--at-step must be >= 0"),
    (["--margin", "0"], "--margin: the equivalence margin must be a number of nats > 0"),
    (["--id", "1", "--margin", "0.05"], "--margin builds a new report"),
])
def test_bad_report_requests_exit_2_and_write_nothing(lab, tmp_path, capsys, argv, message, monkeypatch):
    url, _, _ = lab
    monkeypatch.chdir(tmp_path)
    before = len(RunStore(url).reports.list_reports())
    assert main(["report", "--db", url, *argv]) == 2
    assert message in capsys.readouterr().err
    assert list(Path(tmp_path).iterdir()) == [] and len(RunStore(url).reports.list_reports()) == before


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


# ----------------------------------------------------------------------------- the stored form and the package

OLD_REPORT = Path(__file__).parent / "data" / "report_v1.json"  # stored by format 1 (frames as JSON rows)


def test_a_report_stored_in_the_first_format_still_opens_and_shows_what_it_held():
    text = OLD_REPORT.read_text()
    raw = json.loads(text)
    assert raw["version"] == 1 and "format" not in raw["table3"]
    old = rep.Report.from_json(text)
    # every stored cell reads back: numbers exact, NaN where null, text as text
    for name in ("table3", "step_times", "diagnoses"):
        frame, stored = getattr(old, name), raw[name]
        added = [c for c in frame.columns if c not in stored["columns"]]  # columns newer than the report: blank
        assert list(frame.columns) == stored["columns"] + added and len(frame) == len(stored["data"]) > 0
        newer = rep.TABLE3_COLUMNS[rep.TABLE3_COLUMNS.index("duplicates"):]  # duplicates, then version 5's
        assert added == (newer if name == "table3" else []) and not frame[added].fillna("").astype(bool).any().any()
        for i, column in enumerate(stored["columns"]):
            cells = [row[i] for row in stored["data"]]
            got = [None if pd.isna(v) else v for v in frame[column]]
            assert got == cells, (name, column)
    assert str(old.table3["rank"].dtype) == "Int64" and old.table3["val_loss_mean"].dtype == np.float64
    assert {v.key: v.verdict for v in old.verdicts} == {"a": "supported", "b": "supported", "c": "inconclusive",
                                                        "d": "supported", "e": "not supported"}
    # it renders as a fresh one does, and stored again it is written in the new format and reads back equal
    page = rep.to_html(old)
    assert page.count("Plotly.newPlot(") == 5 and "[+0.4794, +0.5043]" in page and HOSTILE_TAG not in page
    assert "| basis    | 8      | 0.01 | 2       | 40     | 6.1553 ± 0.0085 | +0.0623 " in rep.to_markdown(old, "f")
    again = json.loads(old.to_json())
    assert again["version"] == rep.REPORT_VERSION == 2 and again["table3"]["format"] == "arrow-ipc-base64"
    back = rep.Report.from_json(old.to_json())
    for name in ("table3", "step_times", "diagnoses"):
        pd.testing.assert_frame_equal(getattr(back, name), getattr(old, name))


def test_frames_are_stored_as_arrow_with_their_dtypes_and_missing_values():
    frame = pd.DataFrame({"estimator": pd.array(["exact", "basis", None], dtype="str"),
                          "rank": pd.array([pd.NA, 8, 32], dtype="Int64"), "seeds": np.array([2, 2, 1]),
                          "val": [6.0, np.nan, 1 / 3], "flag": [True, False, True]})
    stored = encode_frame(frame)
    assert stored["format"] == "arrow-ipc-base64" and set(stored) == {"format", "data"}
    back = decode_frame(json.loads(json.dumps(stored)))
    pd.testing.assert_frame_equal(back, frame)
    assert back["val"].iloc[2] == 1 / 3 and back["rank"].isna().tolist() == [True, False, False]
    empty = decode_frame(encode_frame(pd.DataFrame(columns=["a", "b"])))
    assert list(empty.columns) == ["a", "b"] and len(empty) == 0
    with pytest.raises(ValueError, match="frame format 'csv'"):
        decode_frame({"format": "csv", "data": ""})


def test_the_html_template_is_package_data_and_renders_from_a_zipped_install(tmp_path):
    """Only what the wheel would hold (the modules and pyproject's package data) in a zip on
    the path: the report renders from it, template and style included."""
    root = Path(__file__).resolve().parents[2]
    globs = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    templates = root / "engine" / "analysis" / "report" / "templates"
    data = [p for pattern in globs["engine.analysis.report"] for p in templates.parent.glob(pattern)]
    assert sorted(data) == sorted(templates.iterdir()) and data
    archive = tmp_path / "installed.zip"
    with zipfile.ZipFile(archive, "w") as z:
        for p in [*root.glob("engine/**/*.py"), *data]:
            z.write(p, p.relative_to(root).as_posix())
    code = ("import sys, engine.analysis.report as rep; assert rep.__file__.startswith(sys.argv[1]), rep.__file__; "
            "r = rep.Report.from_json(open(sys.argv[2]).read()); page = rep.to_html(r); "
            "assert 'overflow-x:auto' in page and '<h2>Claims of the paper</h2>' in page; print(len(page))")
    env = {**os.environ, "PYTHONPATH": str(archive)}
    out = subprocess.run([sys.executable, "-c", code, str(archive), str(OLD_REPORT)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) > 1_000_000  # plotly.js inlined


def test_every_text_of_the_html_is_escaped_by_the_template():
    hostile = '</title><script>alert(1)</script><img src="http://127.0.0.1:9/x.png">'
    report = rep.Report.from_json(OLD_REPORT.read_text())
    plain = _Page()
    plain.feed(rep.to_html(report))
    report.title = report.created_at = hostile
    report.notes = [hostile]
    report.captions = {k: hostile for k in report.captions}
    report.setup = {hostile: [(hostile, hostile)]}
    report.table3.loc[0, "missing_seeds"] = hostile
    page = _Page()
    page.feed(rep.to_html(report))
    assert page.tags.count("script") == plain.tags.count("script") and "img" not in page.tags
    shown = [t for t in page.texts if hostile in t]
    assert len(shown) >= 1 + 1 + 1 + 5 + 3 + 1  # title, heading, note, 5 captions, section + its row, the cell


def test_a_stored_report_with_a_damaged_frame_is_a_one_line_error_naming_the_rebuild(tmp_path):
    store = RunStore(f"sqlite:///{tmp_path / 'damaged.db'}")
    content = json.loads(rep.Report.from_json(OLD_REPORT.read_text()).to_json())
    content["table3"]["data"] = content["table3"]["data"][:40]  # a cut Arrow stream
    report_id = store.reports.save_report(title="cut", content=json.dumps(content), run_ids=[], selection={"runs": [1]})
    with pytest.raises(reports.ReportError, match=rf"report {report_id} cannot be read .*--id {report_id} --rebuild"):
        reports.load(store, report_id)
    store.close()
