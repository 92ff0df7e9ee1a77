"""Report: the reports the lab stores (a reproduction's, built when its last run ends, or any
built here or with ``python -m engine report``), shown block by block as the HTML and Markdown
show them (``engine.analysis.report.Report.blocks``), rebuilt from the database, downloaded.

``?id=N`` opens stored report N (Run detail links here); the build form's choices are kept in
the URL (``?sweep=ID``, ``?tags=a&tags=b``, ``?runs=1,2,5``, ``?at=STEP``, ``?margin=δ``), so a link
opens it as its sender left it. Every name, tag and value is shown as plain text."""

import io
import tempfile
import zipfile
from functools import partial
from pathlib import Path
from typing import Any

import streamlit as st

from app import state, viewstate
from app.display import plain, plot
from engine.analysis import report as rep
from engine.core.choices import EQUIVALENCE_MARGIN as MARGIN
from engine.reads import reports
from storage import StorageError

MARGIN_LOW, MARGIN_HIGH = 0.001, 10.0  # the margin δ the form takes, in nats
WRAPPED_COLUMNS = 3  # a table this narrow holds text (item · value, claim · verdict · numbers)
lab = state.lab()
store = lab.store
st.title("Reports")


def _html_bytes(report: rep.Report) -> bytes:
    """The report as one self-contained HTML file (``engine.analysis.report.to_html``), UTF-8."""
    return rep.to_html(report).encode()


def _markdown_zip(report: rep.Report, stem: str) -> bytes:
    """``<stem>.md`` and its SVG figures in ``<stem>-figures/``, zipped; without the figures
    (and a note saying why) when they cannot be drawn here."""
    buffer = io.BytesIO()
    with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as z:
        path = Path(tmp) / f"{stem}.md"
        try:
            written = reports.write(report, path)
        except reports.ReportError as e:
            z.writestr(f"{stem}.md", rep.to_markdown(report, reports.figure_dir_name(path)))
            z.writestr("NOTE.txt", f"The figures are missing: {e}\n")
        else:
            for p in written:
                z.write(p, p.relative_to(tmp).as_posix())
    return buffer.getvalue()


HOWS = ("A sweep", "Runs with tags", "The selected runs")
BUILD_PARAMS = ("sweep", "tags", "runs", "at", "margin")  # the build form's URL parameters (``?id=``: the report shown)


def _link_runs(query, known: set[int]) -> tuple[list[int], list[str]]:
    """(the run ids of the link's ``runs``, comma separated, that are in the database; the problems)."""
    ids, problems = [], []
    for token in ",".join(viewstate.values_of(query, "runs")).replace(" ", ",").split(","):
        number = viewstate.url_int(token) if token else None
        if token and number is None:
            problems.append(f"runs: {viewstate.shown(token)} is not a run id")
        elif number is not None and number not in known:
            problems.append(f"run {number} is not in the database")
        elif number is not None:
            ids.append(number)
    return list(dict.fromkeys(ids)), problems


def _link_numbers(query) -> list[str]:
    """Set the form's step and margin δ from the link's ``at`` and ``margin``; the problems."""
    problems = []
    if at := viewstate.values_of(query, "at"):
        step = viewstate.url_int(at[-1])
        problems += [f"at={viewstate.shown(at[-1])} is not a step"] if step is None else []
        st.session_state["report.at_step"] = step
    if margin := viewstate.values_of(query, "margin"):
        try:
            value = float(margin[-1])
            if not MARGIN_LOW <= value <= MARGIN_HIGH:
                raise ValueError
        except ValueError:
            problems.append(f"margin={viewstate.shown(margin[-1])} is not a number in [{MARGIN_LOW}, {MARGIN_HIGH:g}]")
        else:
            st.session_state["report.margin"] = value
    return problems


def _from_link(runs, sweeps: list[str], tags: list[str]) -> list[str]:
    """On the page's first draw, the build form's controls from the link (``?sweep=``, ``?tags=``
    repeated, ``?runs=1,2``, ``?at=``, ``?margin=``), so it opens as its sender left it; each
    value that cannot be used, in one line naming it and what is shown instead."""
    if "report.how" in st.session_state:
        return []
    query = state.url_query()
    problems = [f"The link's {p}; shown without it." for p in _link_numbers(query)]
    wanted = viewstate.values_of(query, "sweep")
    if wanted and wanted[-1] not in sweeps:
        problems.append(f"The link's sweep {wanted[-1]!r} is not in the database; pick one below.")
    elif wanted:
        st.session_state.update({"report.how": HOWS[0], "report.sweep": wanted[-1]})
    if given := viewstate.values_of(query, "tags"):
        problems += [f"The link's tag {viewstate.shown(t)} is on no run; shown without it." for t in given if t not in tags]
        st.session_state.update({"report.how": HOWS[1], "report.tags": [t for t in dict.fromkeys(given) if t in tags]})
    ids, said = _link_runs(query, {r.id for r in runs})
    problems += [f"The link's {p}; shown without it." for p in said]
    if ids:
        state.set_selected(ids)
        st.session_state["report.how"] = HOWS[2]
    st.session_state.setdefault("report.how", HOWS[0])
    return problems


def _build_form(runs, sweeps: list[str], tags: list[str]) -> None:
    """Build (and store) the report of a sweep, of runs with some tags, or of the selected runs;
    the choices are kept in the URL (``BUILD_PARAMS``)."""
    how = st.radio("Runs", HOWS, horizontal=True, key="report.how")
    selection: dict[str, Any] | None = None
    try:
        if how == HOWS[0]:
            if not sweeps:
                st.caption("No sweep yet.")
                return
            count = {s: sum(r.sweep_id == s for r in runs) for s in sweeps}
            if st.session_state.get("report.sweep") not in sweeps:
                st.session_state["report.sweep"] = sweeps[0]
            sweep = st.selectbox("Sweep", sweeps, key="report.sweep", format_func=lambda s: f"{s} ({count[s]} runs)")
            selection = dict(sweep=sweep)
        elif how == HOWS[1]:
            chosen = st.multiselect("Tags (runs carrying all of them)", tags, key="report.tags")
            selection = dict(tags=chosen) if chosen else None
        else:
            picked = [i for i in state.selected() if i in {r.id for r in runs}]
            st.caption(f"{len(picked)} selected run(s) (pick them on Runs or Compare).")
            selection = dict(runs=picked) if picked else None
        st.session_state.setdefault("report.at_step", None)
        at_step = st.number_input("At step (empty: the latest step all runs of a config reached)", min_value=0,
                                  step=100, key="report.at_step")
        st.session_state.setdefault("report.margin", MARGIN)
        margin = st.number_input("Equivalence margin δ (nats)", min_value=MARGIN_LOW, max_value=MARGIN_HIGH,
                                 step=0.005, format="%.3f", key="report.margin",
                                 help="Table 3 and claim (c) read 'equivalent' when the 90 % interval of a paired Δ "
                                      f"val lies inside ±δ. Default {MARGIN:g} nats: no more than exact backprop's "
                                      "own seed-to-seed SD in this lab's CPU reproductions.")
        state.keep_in_url({"sweep": (selection or {}).get("sweep"), "tags": (selection or {}).get("tags"),
                           "runs": ",".join(map(str, (selection or {}).get("runs", []))),
                           "at": at_step, "margin": None if margin == MARGIN else f"{margin:g}"})
        if st.button("Build report", icon=":material/summarize:", type="primary", disabled=selection is None,
                     key="report.build") and selection is not None:
            with st.spinner("Building the report…"):
                built = reports.build(store, reports.selection_of(**selection, at_step=None if at_step is None else int(at_step),
                                                                  margin=None if margin == MARGIN else float(margin)))
                report_id = reports.save(store, built)
            st.query_params["id"] = str(report_id)
            st.session_state["report.pick"] = report_id
            st.rerun()
    except reports.ReportError as e:
        st.error(plain(str(e)), icon=":material/error:")


def _show(report: rep.Report) -> None:
    """The report's blocks, in order, as the HTML and Markdown render them."""
    for b in report.blocks():
        if b.kind == "heading" and b.level <= 1:
            st.header(plain(b.title))
        elif b.kind == "heading" and b.level == 2:
            st.subheader(plain(b.title))
        elif b.kind == "heading":
            st.markdown(f"**{plain(b.title)}**")
        elif b.kind == "text":
            st.markdown(plain(b.text))
        elif b.kind == "list":
            if b.title:
                st.markdown(f"**{plain(b.title)}**")
            st.markdown("\n".join(f"- {plain(item)}" for item in b.items))
        elif b.kind == "table" and b.frame is not None:
            st.markdown(f"**{plain(b.title)}**")
            if b.text:
                st.caption(plain(b.text))
            if len(b.frame.columns) <= WRAPPED_COLUMNS:  # text tables (setup, claims): cells wrap, as in the HTML
                shown = b.frame.map(lambda v: plain(str(v))).rename(columns=lambda c: plain(str(c)))
                st.table(shown, hide_index=True)
            else:  # wide tables of numbers (Table 3, diagnoses) scroll sideways
                st.dataframe(b.frame, hide_index=True, width="stretch")
        elif b.kind == "figure":
            plot(report.figures[b.name], f"report.{b.name}")
            st.caption(plain(b.text))


all_runs = store.runs.list_runs()
all_sweeps = list(dict.fromkeys(r.sweep_id for r in sorted(all_runs, key=lambda r: -r.id) if r.sweep_id))
all_tags = sorted({t for r in all_runs for t in r.tags})
for line in _from_link(all_runs, all_sweeps, all_tags):  # said above the form, where it is seen
    st.warning(plain(line), icon=":material/link_off:")
with st.expander("Build a report", icon=":material/add_chart:",
                 expanded=not store.reports.list_reports() or any(p in st.query_params for p in BUILD_PARAMS)):
    _build_form(all_runs, all_sweeps, all_tags)

listed = store.reports.list_reports()
if not listed:
    st.info("No reports yet: build one above, or reproduce the paper on Launch (its report is built when its last run "
            "ends), or run `python -m engine report --sweep ID`.")
    st.stop()

titles = {r.id: r for r in listed}
asked = st.query_params.get("id")
if asked is not None and st.session_state.get("report.asked") != asked:  # a link to ?id=N (Run detail)
    st.session_state["report.asked"] = asked
    picked, problem = viewstate.url_id({"id": asked}, "id", titles, what="report")
    if problem:
        st.warning(plain(f"The link's {problem}; showing the latest report."), icon=":material/link_off:")
    else:
        st.session_state["report.pick"] = picked
if st.session_state.get("report.pick") not in titles:
    st.session_state["report.pick"] = listed[0].id
report_id = st.selectbox("Report", list(titles), key="report.pick", format_func=lambda i: (
    f"#{i} {titles[i].title} · {len(titles[i].run_ids)} runs · built "
    f"{titles[i].created_at:%Y-%m-%d %H:%M} UTC" if titles[i].created_at else f"#{i} {titles[i].title}"))
st.query_params["id"] = str(report_id)
report: rep.Report | None
try:
    report = reports.load(store, report_id)
except (reports.ReportError, StorageError) as e:
    st.error(plain(str(e)), icon=":material/error:")
    report = None

buttons = st.container(horizontal=True)
if buttons.button("Rebuild from the database", icon=":material/refresh:", key="report.rebuild",
                  help="Build this report again from the runs as they are stored now (same runs, same step rule)."):
    try:
        with st.spinner("Rebuilding…"):
            reports.rebuild(store, report_id)
        st.rerun()
    except (reports.ReportError, StorageError) as e:
        st.error(plain(str(e)), icon=":material/error:")
if report is not None:
    stem = f"basis-lab-report-{report_id}"
    buttons.download_button("Download HTML", data=partial(_html_bytes, report), file_name=f"{stem}.html",
                            mime="text/html", icon=":material/download:", on_click="ignore", key="report.html",
                            help="One self-contained file: interactive figures, opens offline, no network.")
    buttons.download_button("Download Markdown", data=partial(_markdown_zip, report, stem), file_name=f"{stem}.zip",
                            mime="application/zip", icon=":material/download:", on_click="ignore", key="report.md",
                            help="The Markdown file and its figures as SVG in a folder beside it, zipped.")
if buttons.button("Delete report", icon=":material/delete:", key="report.delete",
                  help="Delete this stored report (the runs stay; it can be built again)."):
    store.reports.delete_report(report_id)
    st.query_params.pop("id", None)
    st.rerun()
if report is not None:
    _show(report)
