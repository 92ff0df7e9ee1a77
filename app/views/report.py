"""Report: the reports the lab stores (a reproduction's, built when its last run ends, or any
built here or with ``python -m engine report``), shown block by block as the HTML and Markdown
show them (``engine.analysis.report.Report.blocks``), rebuilt from the database, downloaded.

``?id=N`` opens stored report N (Run detail links here); ``?sweep=ID`` preselects that sweep
for a new report. Every name, tag and value is shown as plain text."""

import io
import tempfile
import zipfile
from pathlib import Path

import streamlit as st

from app import state, viewstate
from app.display import plain, plot
from engine.analysis import report as rep
from engine.core.choices import EQUIVALENCE_MARGIN as MARGIN
from engine.runner import reports
from storage import StorageError

WRAPPED_COLUMNS = 3  # a table this narrow holds text (item · value, claim · verdict · numbers)
lab = state.lab()
store = lab.store
st.title("Reports")


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


def _build_form() -> None:
    """Build (and store) the report of a sweep, of runs with some tags, or of the selected runs."""
    runs = store.list_runs()
    sweeps = list(dict.fromkeys(r.sweep_id for r in sorted(runs, key=lambda r: -r.id) if r.sweep_id))
    tags = sorted({t for r in runs for t in r.tags})
    wanted = st.query_params.get("sweep")
    if wanted is not None and wanted not in sweeps:
        st.warning(plain(f"The link's sweep {wanted!r} is not in the database; pick one below."), icon=":material/link_off:")
    how = st.radio("Runs", ["A sweep", "Runs with tags", "The selected runs"], horizontal=True, key="report.how")
    selection = None
    try:
        if how == "A sweep":
            if not sweeps:
                st.caption("No sweep yet.")
                return
            count = {s: sum(r.sweep_id == s for r in runs) for s in sweeps}
            index = sweeps.index(wanted) if wanted in sweeps else 0
            sweep = st.selectbox("Sweep", sweeps, index=index, key="report.sweep",
                                 format_func=lambda s: f"{s} ({count[s]} runs)")
            selection = dict(sweep=sweep)
        elif how == "Runs with tags":
            chosen = st.multiselect("Tags (runs carrying all of them)", tags, key="report.tags")
            selection = dict(tags=chosen) if chosen else None
        else:
            chosen = [i for i in state.selected() if i in {r.id for r in runs}]
            st.caption(f"{len(chosen)} selected run(s) (pick them on Runs or Compare).")
            selection = dict(runs=chosen) if chosen else None
        at_step = st.number_input("At step (empty: the latest step all runs of a config reached)", min_value=0,
                                  value=None, step=100, key="report.at_step")
        margin = st.number_input("Equivalence margin δ (nats)", min_value=0.001, max_value=10.0, value=MARGIN,
                                 step=0.005, format="%.3f", key="report.margin",
                                 help="Table 3 and claim (c) read 'equivalent' when the 90 % interval of a paired Δ "
                                      f"val lies inside ±δ. Default {MARGIN:g} nats: no more than exact backprop's "
                                      "own seed-to-seed SD in this lab's CPU reproductions.")
        if st.button("Build report", icon=":material/summarize:", type="primary", disabled=selection is None,
                     key="report.build"):
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
        elif b.kind == "table":
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


with st.expander("Build a report", icon=":material/add_chart:", expanded=not store.list_reports()):
    _build_form()

listed = store.list_reports()
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
    buttons.download_button("Download HTML", data=lambda: rep.to_html(report).encode(), file_name=f"{stem}.html",
                            mime="text/html", icon=":material/download:", on_click="ignore", key="report.html",
                            help="One self-contained file: interactive figures, opens offline, no network.")
    buttons.download_button("Download Markdown", data=lambda: _markdown_zip(report, stem), file_name=f"{stem}.zip",
                            mime="application/zip", icon=":material/download:", on_click="ignore", key="report.md",
                            help="The Markdown file and its figures as SVG in a folder beside it, zipped.")
if buttons.button("Delete report", icon=":material/delete:", key="report.delete",
                  help="Delete this stored report (the runs stay; it can be built again)."):
    store.delete_report(report_id)
    st.query_params.pop("id", None)
    st.rerun()
if report is not None:
    _show(report)
