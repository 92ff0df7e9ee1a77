"""Reports read from and stored in the database: choose the runs (a sweep, tags, a list),
build the report (``engine.analysis.report``), store it, write it as HTML or Markdown.

A report is stored under a key named after its selection (``sweep:<id>``,
``tags:a,b``, ``runs:1,2,5``, ``all``, with ``@<step>`` when read at a fixed step),
so building the same selection again replaces that report in place: the one a
sweep gets when its last run ends (``report_if_sweep_ended``, for sweeps tagged
``AUTO_REPORT_TAGS``) is the one ``python -m engine report --sweep ID`` rebuilds.
``rebuild`` builds a stored report again from its selection, from the database as
it is now.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Callable, Iterable, Sequence

import pandas as pd

from engine.analysis import report as rep
from engine.analysis.claims import DIAGNOSIS_COLUMNS
from engine.config import REPRODUCE_TAG
from engine.config.tuning import TUNE_TAG
from engine.core.files import atomic_write_text
from engine.core.loggers import held_below
from engine.core.stats import check_margin
from engine.errors import LIBRARY_FAILURES, UserError
from engine.reads.queries import split_batches
from storage import ACTIVE_STATUSES, RunStore, StorageError
from storage.campaigns import CampaignRecord
from storage.outputs import refuse_special

AUTO_REPORT_TAGS = (REPRODUCE_TAG, TUNE_TAG)  # a sweep with one of these tags gets its report when its last run ends
FORMATS = {".html": "html", ".htm": "html", ".md": "markdown", ".markdown": "markdown"}
WAITING_STATUSES = (*ACTIVE_STATUSES, "interrupted")  # a sweep with such a run has not ended


class ReportError(UserError, ValueError):
    """A report cannot be built or written as asked; the message names the fix."""


def selection_of(*, sweep: str | None = None, tags: Sequence[str] | None = None,
                 runs: Sequence[int] | None = None, at_step: int | None = None, margin: float | None = None,
                 adjust: bool = True) -> dict:
    """The stored form of a selection: at most one of ``sweep``, ``tags``, ``runs``; with
    ``margin``, the equivalence margin δ its Table 3 and claim (c) use (kept when it is rebuilt;
    the report's key does not change with it: the same runs judged anew replace their report)."""
    given = [k for k, v in (("sweep", sweep), ("tags", tags), ("runs", runs)) if v]
    if len(given) > 1:
        raise ReportError(f"choose the runs one way: --{given[0]} or --{given[1]}, not both")
    selection: dict = {}
    if sweep:
        selection["sweep"] = str(sweep)
    elif tags:
        selection["tags"] = sorted(dict.fromkeys(str(t).strip() for t in tags if str(t).strip()))
    elif runs:
        selection["runs"] = sorted({int(i) for i in runs})
    if at_step is not None:
        if at_step < 0:
            raise ReportError(f"--at-step must be >= 0 (got {at_step})")
        selection["at_step"] = int(at_step)
    if margin is not None:
        try:
            selection["margin"] = check_margin(margin)
        except ValueError as e:
            raise ReportError(f"--margin: {e}") from None
    if not adjust:
        selection["adjust"] = False  # Table 3's verdicts each at its own level (the default, True, is not stored)
    return selection


def report_key(selection: dict) -> str:
    """The key a selection's report is stored under (module docstring)."""
    if selection.get("sweep"):
        key = f"sweep:{selection['sweep']}"
    elif selection.get("tags"):
        key = "tags:" + ",".join(selection["tags"])
    elif selection.get("runs"):
        key = "runs:" + ",".join(map(str, selection["runs"]))
    else:
        key = "all"
    at = selection.get("at_step")
    return key if at is None else f"{key}@{at}"


def select_runs(store: RunStore, selection: dict) -> list:
    """The run records a selection names; ``ReportError`` when it names none."""
    records = store.runs.list_runs()
    if selection.get("sweep"):
        chosen = [r for r in records if r.sweep_id == selection["sweep"]]
        what = f"sweep {selection['sweep']!r}"
    elif selection.get("tags"):
        chosen = [r for r in records if set(selection["tags"]) <= set(r.tags)]
        what = f"runs tagged {', '.join(selection['tags'])}"
    elif selection.get("runs"):
        wanted = set(selection["runs"])
        chosen = [r for r in records if r.id in wanted]
        missing = sorted(wanted - {r.id for r in chosen})
        if missing:
            raise ReportError(f"no run {', '.join(map(str, missing))}; `python -m engine list` shows the ids")
        what = "those runs"
    else:
        chosen, what = records, "the database"
    if not chosen:
        raise ReportError(f"{what}: no runs to report on; `python -m engine list` shows the runs, their sweeps and tags")
    return chosen


def diagnoses_of(store: RunStore, run_ids: Iterable[int]) -> pd.DataFrame:
    """The result rows of every finished diagnosis of these runs, with ``diagnosis_id``,
    ``run_id`` and ``step`` (the columns ``report.build`` reads) and each row's per-key
    values (``key_values``, None for a diagnosis stored without them)."""
    frames = []
    for run_id in run_ids:
        meta = store.frames.diagnostics_frame(int(run_id))
        for d in meta[meta["status"] == "finished"].itertuples():
            rows = store.diagnostics.diagnostic_results(int(d.id), key_values=True)
            if rows.empty:
                continue
            frames.append(rows.assign(diagnosis_id=int(d.id), run_id=int(run_id), step=d.step))
    if not frames:
        return pd.DataFrame(columns=[*DIAGNOSIS_COLUMNS, "step", "cos_mean"])
    return pd.concat(frames, ignore_index=True)


def build(store: RunStore, selection: dict, title: str | None = None) -> rep.Report:
    """The report of a selection, from the database as it is now; titled ``title``, else
    by what it is (``_default_title``). Claim (e) reads a run's step times as its own only
    when no stored run, of this selection or any other, shared its machine meanwhile."""
    records = select_runs(store, selection)
    ids = [r.id for r in records]
    title = title or _default_title(records, selection)
    metrics = store.metrics(ids)
    batches, test_batches = split_batches(store, ids, metrics)
    return rep.build(records, metrics, diagnoses=diagnoses_of(store, ids), selection=selection,
                     at_step=selection.get("at_step"), title=title, others=store.runs.list_runs(),
                     batches=batches, campaign=_campaign(store, selection), test_batches=test_batches)


def campaign_data(store: RunStore, campaign: CampaignRecord, role: str = "comparison") -> rep.Campaign:
    """What a report (and the Compare page) shows of a tuning campaign, read from the database now:
    its protocol, trials, the choice read from them and its comparison's Table 3s."""
    from engine.analysis import tuning
    from engine.reads import campaigns

    spec = campaigns.spec_of(campaign)
    trials = campaigns.trials(store, campaign)
    return rep.Campaign(id=campaign.id, name=campaign.name, stage=campaign.stage, spec=spec, trials=trials,
                        choices=tuning.choose(spec, trials), tables=campaigns.comparison_tables(store, campaign),
                        role=role)


def _campaign(store: RunStore, selection: dict) -> rep.Campaign | None:
    """The tuning campaign whose trials or comparison the selection's sweep is, else None."""
    sweep = selection.get("sweep")
    campaign = store.campaigns.of_sweep(sweep) if sweep else None
    if campaign is None:
        return None
    return campaign_data(store, campaign, "trials" if sweep == campaign.tune_sweep_id else "comparison")


def save(store: RunStore, report: rep.Report) -> int:
    """Store ``report`` under its selection's key (replacing the report stored there); its id."""
    return store.reports.save_report(title=report.title, content=report.to_json(), run_ids=report.run_ids,
                             selection=report.selection, at_step=report.at_step,
                             sweep_id=report.selection.get("sweep"), key=report_key(report.selection))


def load(store: RunStore, report_id: int) -> rep.Report:
    """A stored report, as it was built."""
    record = store.reports.get_report(report_id)
    try:
        return rep.Report.from_json(record.content or "")
    except (ValueError, KeyError, TypeError) as e:
        raise ReportError(f"report {report_id} cannot be read ({e}); rebuild it from the database "
                          f"(`python -m engine report --id {report_id} --rebuild`)") from None


def rebuild(store: RunStore, report_id: int, check: Callable[[rep.Report], None] | None = None) -> tuple[int, rep.Report]:
    """Build a stored report again from its selection and store it; (its id, the report).
    ``check`` (e.g. ``check_output`` of where it will be written) sees the new report
    first: when it raises, nothing is stored."""
    record = store.reports.get_report(report_id)
    report = build(store, record.selection, title=record.title)
    if check is not None:
        check(report)
    return save(store, report), report


def report_if_sweep_ended(store: RunStore, run_id: int) -> int | None:
    """Build and store the report of ``run_id``'s sweep when the sweep is tagged with one
    of ``AUTO_REPORT_TAGS`` and none of its runs is queued, running or interrupted; the
    report's id, else None."""
    run = store.runs.get_run(run_id)
    if not run.sweep_id or not set(AUTO_REPORT_TAGS) & set(run.tags):
        return None
    sweep = [r for r in store.runs.list_runs() if r.sweep_id == run.sweep_id]
    if any(r.status in WAITING_STATUSES for r in sweep):
        return None
    selection = selection_of(sweep=run.sweep_id)
    return save(store, build(store, selection))


def _default_title(records, selection: dict) -> str | None:
    """A reproduction's sweep (its runs tagged ``REPRODUCE_TAG``) is titled as one; any
    other selection (None) by its description (``report.describe_selection``)."""
    if selection.get("sweep") and any(REPRODUCE_TAG in r.tags for r in records):
        return f"Reproduction of the paper: sweep {selection['sweep']}"
    return None


def format_of(path: str | Path) -> str:
    """``html`` or ``markdown`` from a file name; ``ReportError`` for another suffix."""
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise ReportError(f"{path}: write the report as .html (one self-contained file) or .md (Markdown with SVG "
                          "figures beside it)")
    return FORMATS[suffix]


def figure_dir_name(path: str | Path) -> str:
    """``report-figures`` for ``report.md``: the folder of SVG figures beside the Markdown."""
    return f"{Path(path).stem}-figures"


@contextlib.contextmanager
def _quiet_browser():
    """Hold back the browser driver's own log: it prints a traceback for a wire message it
    then ignores, and a failure that matters reaches ``write`` as an exception."""
    with held_below("choreographer", logging.CRITICAL):
        yield


def _link_refusal(path: Path) -> ReportError:
    return ReportError(f"{path} is a symbolic link; a report is never written through a link: remove it or "
                       "choose another path")


def _replaceable(path: Path, mode: int) -> None:
    """``ReportError`` unless ``mode`` (of what is at ``path``, a link not followed) is a
    regular file's: a report replaces no link, device, FIFO or socket."""
    if stat.S_ISLNK(mode):
        raise _link_refusal(path)
    if not stat.S_ISREG(mode):
        refuse_special(path, error=ReportError)


def check_output(report: rep.Report, path: str | Path, *, force: bool = False) -> None:
    """``ReportError`` unless ``write(report, path, force=force)`` may write, checked before
    anything is written or stored: a .html or .md name in an existing directory, not a
    symbolic link nor anything else but a regular file (a device, a FIFO, a socket:
    ``storage.outputs``; ``force`` or not), not there yet unless ``force``; for Markdown its
    figure folder too (``figure_dir_name``): not a link, a folder when it exists, and none
    of the report's figure files in it (``<name>.svg``) a link or not a regular file, nor
    there yet unless ``force``."""
    path = Path(path).expanduser()
    fmt = format_of(path)
    if path.is_symlink():
        raise _link_refusal(path)
    refuse_special(path, error=ReportError)
    if path.exists() and not force:
        raise ReportError(f"{path} already exists; pass --force to overwrite it, or choose another path")
    if not path.absolute().parent.is_dir():
        raise ReportError(f"cannot write {path}: its directory does not exist; create it or choose another path")
    if fmt == "html":
        return
    folder = path.parent / figure_dir_name(path)
    if folder.is_symlink():
        raise _link_refusal(folder)
    if folder.exists() and not folder.is_dir():
        raise ReportError(f"{folder} is not a folder, and the figures go there; move it away or choose another path")
    files = [folder / f for f in rep.figure_files(report, ".").values()]
    links = [f for f in files if f.is_symlink()]
    if links:
        raise _link_refusal(links[0])
    for f in files:
        refuse_special(f, error=ReportError)
    there = [f.name for f in files if f.exists()]
    if there and not force:
        raise ReportError(f"{folder} already holds {', '.join(there)}; pass --force to overwrite them, or choose "
                          "another path")


def write(report: rep.Report, path: str | Path, *, force: bool = False) -> list[Path]:
    """Write ``report`` to ``path`` (.html: one file; .md: the Markdown file and its
    figures in ``figure_dir_name(path)`` beside it); the paths written. Refuses what
    ``check_output`` refuses (an existing file without ``force``, any symbolic link, anything
    but a regular file); a failure leaves no half-written report file. The figures are drawn into a private
    folder and moved into place through the figure folder opened with ``O_NOFOLLOW``,
    so nothing is written through a link even if one appears meanwhile."""
    path = Path(path).expanduser()
    check_output(report, path, force=force)
    if format_of(path) == "html":
        atomic_write_text(path, rep.to_html(report))
        return [path]
    folder = path.parent / figure_dir_name(path)
    figures = _write_figures(report, folder, force)
    atomic_write_text(path, rep.to_markdown(report, figure_dir_name(path)))
    return [path, *figures]


def _write_figures(report: rep.Report, folder: Path, force: bool) -> list[Path]:
    """The report's SVG figures in ``folder`` (created), never through a link."""
    try:
        folder.mkdir(exist_ok=True)
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as e:
        if folder.is_symlink():
            raise _link_refusal(folder) from None
        raise ReportError(f"cannot use the figure folder {folder} ({e.strerror or e}); choose another path") from None
    drawn_in = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}."))
    try:
        try:
            with _quiet_browser():
                drawn = rep.write_figures(report, drawn_in)
        except LIBRARY_FAILURES as e:  # kaleido or the browser it drives (a missing Chrome, a timeout)
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ReportError(f"the figures could not be drawn as SVG ({reason}); Markdown figures need Chrome or "
                              "Chromium (scripts/install_browser.sh, or `kaleido_get_chrome`), or write the report as "
                              ".html instead") from None
        for p in drawn:
            try:
                if force:
                    with contextlib.suppress(FileNotFoundError):
                        _replaceable(folder / p.name, os.stat(p.name, dir_fd=fd, follow_symlinks=False).st_mode)
                    os.replace(p, p.name, dst_dir_fd=fd)  # replaces a regular file, never follows a name
                else:
                    os.link(p, p.name, dst_dir_fd=fd, follow_symlinks=False)  # fails if the name is taken
            except FileExistsError:
                raise ReportError(f"{folder / p.name} already exists; pass --force to overwrite it, or choose "
                                  "another path") from None
        return [folder / p.name for p in drawn]
    finally:
        os.close(fd)
        shutil.rmtree(drawn_in, ignore_errors=True)


__all__ = ["AUTO_REPORT_TAGS", "ReportError", "StorageError", "build", "campaign_data", "check_output", "diagnoses_of", "figure_dir_name",
           "format_of", "load", "rebuild", "report_if_sweep_ended", "report_key", "save", "select_runs", "selection_of", "write"]
