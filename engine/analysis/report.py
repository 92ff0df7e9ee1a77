"""A report of a set of runs, built from their records and metrics alone: no database,
no Streamlit (``engine.runner.reports`` reads the database and stores the result).

``build`` turns run records, their metric rows and any estimator diagnoses into a
``Report``: the setup (config by field group, data, device, package versions, git
commit, wall time), the paper's Table 3 (``summary.table3``: paired Δ vs exact, its
95 % t-interval and verdict), the claims table (``claims.judge``, with its rules), the
figures (loss against R with seed error bars and the exact band, validation curves
with seed bands, dW cosine, activation memory and step time against R; the builders
of ``frames`` and ``charts``, the dashboard's own) and the diagnosis tables.

A report is a list of blocks (``Report.blocks``): headings, text, tables and
figures, in order. Every renderer walks the same blocks: ``to_html`` (one
self-contained file: plotly.js inlined once, no request leaves the page; a
Content-Security-Policy forbids any), ``to_markdown`` (text plus the figures to be
written beside it as SVG, ``write_figures``) and the dashboard's Report page. A
report round-trips through JSON exactly (``to_json``/``from_json``), which is how it
is stored.
"""

from __future__ import annotations

import html
import json
import math
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio
from tabulate import tabulate

from engine.analysis import charts, claims, frames
from engine.analysis.summary import TABLE3_COLUMNS, display_frame, table3
from engine.config import GROUPS, method_label, schema, stored
from engine.training.timing import format_seconds

REPORT_VERSION = 1
MIB = 2**20
FIGURE_CONFIG = {"displaylogo": False, "responsive": True,
                 "toImageButtonOptions": {"format": "svg"}}
FIGURE_FORMAT = "svg"
# Nothing may leave the page: no fetch, no image, font or script from anywhere but the file itself.
CONTENT_POLICY = ("default-src 'none'; script-src 'unsafe-inline' 'unsafe-eval'; style-src 'unsafe-inline'; "
                  "img-src data: blob:; font-src data:")


@dataclass(frozen=True)
class Block:
    """One piece of a report: ``heading`` (``level`` 1–3), ``text`` (plain text),
    ``table`` (``frame`` of display strings, ``text`` its caption), ``figure``
    (``name`` of a figure in ``Report.figures``, ``text`` its caption) or ``list``
    (``items`` of plain text)."""

    kind: str
    title: str = ""
    text: str = ""
    level: int = 2
    name: str = ""
    frame: pd.DataFrame | None = None
    items: tuple[str, ...] = ()


@dataclass
class Report:
    """What a report holds (module docstring); ``blocks()`` is its document."""

    title: str
    created_at: str
    selection: dict
    run_ids: list[int]
    at_step: int | None
    setup: dict[str, list[tuple[str, str]]]
    table3: pd.DataFrame
    step_times: pd.DataFrame
    diagnoses: pd.DataFrame
    verdicts: list[claims.Verdict]
    figures: dict[str, go.Figure]
    captions: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    # ------------------------------------------------------------------ document

    def blocks(self) -> list[Block]:
        steps = sorted({int(s) for s in self.table3["step"].dropna()}) if len(self.table3) else []
        at = ", ".join(f"{s:,}" for s in steps) or "—"
        out = [Block("heading", self.title, level=1),
               Block("text", text=f"{describe_selection(self.selection)}: {len(self.run_ids)} runs, compared at step "
                               f"{at}. Built {self.created_at} by BASIS Lab from the runs stored in its database; "
                               "rebuild it at any time on the Report page or with python -m engine report.")]
        out += [Block("heading", "Setup")]
        for section, rows in self.setup.items():
            out.append(Block("table", section, frame=pd.DataFrame(rows, columns=["item", "value"]), level=3))
        out += [Block("heading", "Table 3: validation loss and the paired difference to exact backprop"),
                Block("table", "Table 3", frame=display_frame(self.table3) if len(self.table3) else _empty("no runs"),
                      text="Each method's seeds are read at one step (the latest all its group reached, or the step "
                           "asked for). Δ val vs exact is the mean over seeds of val(method, s) − val(exact, s), the "
                           "same seed meaning the same initial parameters and batches; 95 % CI its t-interval; the "
                           "verdict reads the interval: better / worse when it lies below / above 0, else within "
                           "noise. saved ÷ exact: bytes kept for the backward pass, run ÷ exact. paper val: the "
                           "paper's Table 3 (50,000 steps).")]
        out += [Block("heading", "Claims of the paper"),
                Block("table", "Claims", frame=claims.verdict_frame(self.verdicts),
                      text="Each claim with the verdict the stored data support, by the rules below, and the numbers "
                           "behind it."),
                Block("list", "Rules", items=tuple(v.rule for v in self.verdicts))]
        out += [Block("heading", "Figures")]
        out += [Block("figure", name=name, text=self.captions.get(name, "")) for name in self.figures]
        if len(self.step_times):
            out.append(Block("table", "Time per train step", frame=_step_time_table(self.step_times),
                             text="Milliseconds per train step: 1000 · B·T / the median tokens/s of the run's "
                                  "evaluation windows (train steps only), mean ± std over seeds."))
        if len(self.diagnoses):
            out.append(Block("heading", "Estimator diagnoses"))
            for (diag_id, run_id, step), d in self.diagnoses.groupby(["diagnosis_id", "run_id", "step"], sort=True,
                                                                     dropna=False):
                out.append(Block("table", f"Diagnosis {diag_id} of run {run_id} at step {_int_text(step)}",
                                 frame=_diagnosis_table(d), level=3,
                                 text="dW of each estimator against the exact dW on the run's own state and batches, "
                                      "all sketched layers pooled: bias², variance and MSE relative to ‖dW‖², "
                                      "mean cosine."))
        if self.notes:
            out += [Block("heading", "Notes"), Block("list", items=tuple(self.notes))]
        return out

    # ------------------------------------------------------------------ JSON

    def to_json(self) -> str:
        """The whole report as JSON text (floats exact, NaN as null)."""
        return json.dumps({
            "version": REPORT_VERSION, "title": self.title, "created_at": self.created_at,
            "selection": self.selection, "run_ids": [int(i) for i in self.run_ids],
            "at_step": None if self.at_step is None else int(self.at_step),
            "setup": {k: [list(r) for r in v] for k, v in self.setup.items()},
            "table3": _frame_json(self.table3), "step_times": _frame_json(self.step_times),
            "diagnoses": _frame_json(self.diagnoses),
            "verdicts": [v.__dict__ for v in self.verdicts],
            "figures": {k: json.loads(pio.to_json(f, validate=False)) for k, f in self.figures.items()},
            "captions": self.captions, "notes": self.notes,
        }, allow_nan=False, default=_json_default)

    @classmethod
    def from_json(cls, text: str) -> "Report":
        d = json.loads(text)
        if d.get("version") != REPORT_VERSION:
            raise ValueError(f"report format version {d.get('version')!r} is not {REPORT_VERSION}; rebuild the report "
                             "from the database")
        return cls(
            title=d["title"], created_at=d["created_at"], selection=d["selection"], run_ids=d["run_ids"],
            at_step=d["at_step"], setup={k: [tuple(r) for r in v] for k, v in d["setup"].items()},
            table3=_frame_from(d["table3"]), step_times=_frame_from(d["step_times"]),
            diagnoses=_frame_from(d["diagnoses"]), verdicts=[claims.Verdict(**v) for v in d["verdicts"]],
            figures={k: pio.from_json(json.dumps(f), skip_invalid=True) for k, f in d["figures"].items()},
            captions=d.get("captions", {}), notes=d.get("notes", []),
        )


# ----------------------------------------------------------------------------- building

def describe_selection(selection: dict) -> str:
    """``Sweep 2026…``, ``Runs tagged reproduce``, ``Runs 1, 2, 5``, ``All runs``."""
    if selection.get("sweep"):
        return f"Sweep {selection['sweep']}"
    if selection.get("tags"):
        return f"Runs tagged {', '.join(selection['tags'])}"
    if selection.get("runs"):
        return f"Runs {', '.join(map(str, selection['runs']))}"
    return "All runs"


def build(records: Iterable, metrics: pd.DataFrame, *, diagnoses: pd.DataFrame | None = None,
          selection: dict | None = None, at_step: int | None = None, title: str | None = None,
          created_at: datetime | None = None) -> Report:
    """The report of ``records`` (``storage.RunRecord``) from their metric rows (the columns
    of ``RunStore.metrics``) and diagnosis rows (``claims.DIAGNOSIS_COLUMNS`` plus
    ``step`` and ``cos_mean``; None: none stored); every number read at ``at_step``, or
    per config group at the latest step all its runs reached (``summary.table3``)."""
    records = sorted(records, key=lambda r: r.id)
    selection = dict(selection or {})
    created = (created_at or datetime.now(timezone.utc)).astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    t3 = table3(records, metrics, at_step)
    steps = frames.step_time_frame(records, metrics, at_step)
    diag = _diagnoses(diagnoses)
    verdicts = claims.judge(t3, diag, steps[claims.STEP_TIME_COLUMNS])
    figures, captions = _figures(records, metrics, at_step, steps)
    notes = []
    unfinished = [r for r in records if r.status != "finished"]
    if unfinished:
        notes.append(f"{len(unfinished)} of {len(records)} runs had not finished when this report was built: "
                     + ", ".join(f"#{r.id} {r.status}" for r in unfinished[:20]) + ("…" if len(unfinished) > 20 else ""))
    if len(t3) and (t3["missing_seeds"] != "").any():
        notes.append("Some methods miss seeds at the compared step (Table 3's 'missing seeds').")
    return Report(title=title or describe_selection(selection), created_at=created, selection=selection,
                  run_ids=[r.id for r in records], at_step=at_step, setup=_setup(records, metrics),
                  table3=t3, step_times=steps, diagnoses=diag, verdicts=verdicts, figures=figures,
                  captions=captions, notes=notes)


def _figures(records, metrics, at_step, steps) -> tuple[dict[str, go.Figure], dict[str, str]]:
    figures, captions = {}, {}
    info = frames.describe_runs(records)

    def add(name, fig, caption):
        figures[name], captions[name] = fig, caption

    loss = frames.rank_frame(records, metrics, "val_loss", at_step)
    add("loss_vs_rank", charts.rank_figure(loss, y_title="validation loss (nats/token)",
                                           title="Validation loss against the rank R"),
        "Validation loss at the compared step against R (log axis): the mean over seeds with ± 1 std error bars; "
        "exact backprop as a band (mean ± std) across the ranks.")
    curves = frames.series(metrics, info, "val_loss", pool_seeds=True)
    add("validation", charts.line_figure(curves, y_title="validation loss (nats/token)",
                                         title="Validation loss (mean over seeds, ± 1 std band)", height=440),
        "Validation curves of every method: the mean over its seeds at each evaluation, with a ± 1 std band.")
    cosine = frames.rank_frame(records, metrics, "cos_mean", at_step)
    if len(cosine[cosine["estimator"] != "exact"]):
        add("cosine", charts.rank_figure(cosine, y_title="mean cosine of sketched dW to exact dW",
                                         title="dW cosine against R"),
            "Mean cosine of each sketched layer's dW to the exact dW on the same batch (the last probe at or before "
            "the compared step), mean ± std over seeds.")
    memory = frames.rank_frame(records, metrics, "mem_saved_bytes", at_step)
    add("memory", charts.rank_figure(memory, y_title="saved for backward (MiB)", title="Activation memory against R"),
        "Bytes the compiled train step keeps for the backward pass, in MiB, against R; exact backprop as a band.")
    add("step_time", charts.rank_figure(steps, y_title="train step (ms)", title="Time per train step against R"),
        "Milliseconds per train step against R, mean ± std over seeds; exact backprop as a band.")
    return figures, captions


def _diagnoses(diagnoses: pd.DataFrame | None) -> pd.DataFrame:
    columns = [*claims.DIAGNOSIS_COLUMNS, "step", "cos_mean"]
    if diagnoses is None or diagnoses.empty:
        return pd.DataFrame(columns=columns)
    d = diagnoses[diagnoses["layer"] == claims.POOLED_LAYER]
    return d[columns].sort_values(["diagnosis_id", "estimator", "lam", "rank"], kind="stable").reset_index(drop=True)


def _setup(records, metrics: pd.DataFrame) -> dict[str, list[tuple[str, str]]]:
    """The runs, their config by field group (the schema's groups), data and environment."""
    setup: dict[str, list[tuple[str, str]]] = {}
    if not records:
        return {"Runs": [("runs", "none")]}
    statuses = pd.Series([r.status for r in records]).value_counts()
    wall = metrics.groupby("run_id")["wall_time"].max() if len(metrics) else pd.Series(dtype=float)
    started = [r.started_at for r in records if r.started_at]
    finished = [r.finished_at for r in records if r.finished_at]
    methods = list(dict.fromkeys(method_label(r.estimator, r.rank, r.lam) for r in records))
    runs = [
        ("runs", f"{len(records)} ({', '.join(f'{n} {s}' for s, n in statuses.items())})"),
        ("methods", ", ".join(methods)),
        ("seeds", ", ".join(map(str, sorted({r.seed for r in records if r.seed is not None})))),
        ("sweeps", ", ".join(sorted({r.sweep_id for r in records if r.sweep_id})) or "—"),
        ("tags", ", ".join(sorted({t for r in records for t in r.tags})) or "—"),
        ("wall time", f"{format_seconds(float(wall.sum()))} of training summed over runs"
                      + (f"; {format_seconds((max(finished) - min(started)).total_seconds())} from the first start to "
                         "the last finish" if started and finished else "")),
        ("first started", _time(min(started)) if started else "—"),
        ("last finished", _time(max(finished)) if finished else "—"),
    ]
    setup["Runs"] = runs
    configs = [r.config for r in records]
    for group, title in GROUPS.items():
        rows = []
        for f, spec, _ in schema():
            if spec.group != group or spec.swept or f.name == "name":
                continue
            values = list(dict.fromkeys(json.dumps(c.get(f.name), sort_keys=True, default=str) for c in configs))
            shown = [_config_text(json.loads(v), spec.none) for v in values]
            rows.append((spec.label, shown[0] if len(shown) == 1 else "varies: " + " / ".join(shown)))
        if group == "data":
            rows.append(("tokens per step (B·T)", _varies(_rows(c) for c in configs)))
        setup[title] = rows
    versions: dict[str, set] = {}
    for r in records:
        for k, v in (r.versions or {}).items():
            versions.setdefault(k, set()).add(str(v))
    env = [("device", _varies(r.device for r in records)),
           ("git commit", _varies(r.git_commit for r in records))]
    env += [(f"{k} version", " / ".join(sorted(v))) for k, v in sorted(versions.items(), key=lambda kv: kv[0].lower())]
    setup["Environment"] = env
    return setup


def _rows(config: dict) -> str:
    run = stored(config)
    return str(run.rows) if run is not None else "—"


def _varies(values) -> str:
    shown = list(dict.fromkeys("—" if v is None else str(v) for v in values))
    return shown[0] if len(shown) == 1 else "varies: " + " / ".join(shown)


def _config_text(value: Any, none: str | None = None) -> str:
    if value is None:
        return f"default ({none})" if none else "default"
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in sorted(value.items())) or "—"
    return str(value)


def _time(value: datetime) -> str:
    return value.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _int_text(value) -> str:
    return "—" if value is None or (isinstance(value, float) and math.isnan(value)) or pd.isna(value) else f"{int(value):,}"


def _empty(message: str) -> pd.DataFrame:
    return pd.DataFrame({"": [message]})


def _step_time_table(steps: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({
        "method": [method_label(e, None if pd.isna(r) else r, lam) for e, r, lam in zip(steps["estimator"], steps["rank"], steps["lam"])],
        "seeds": steps["seeds"].astype(int),
        "ms per step": [f"{m:.2f}" + ("" if pd.isna(s) else f" ± {s:.2f}") for m, s in zip(steps["mean"], steps["std"])],
        "setup": steps["setup"],
    }).loc[:, lambda f: [c for c in f.columns if c != "setup" or (f["setup"] != "").any()]]


def _diagnosis_table(d: pd.DataFrame) -> pd.DataFrame:
    def g(v, spec=".3g"):
        return "—" if pd.isna(v) else format(float(v), spec)

    return pd.DataFrame({
        "estimator": d["estimator"], "R": [_int_text(r) for r in d["rank"]], "λ": [g(v, "g") for v in d["lam"]],
        "bias²": [g(v) for v in d["bias2"]], "variance": [g(v) for v in d["variance"]], "MSE": [g(v) for v in d["mse"]],
        "cos": [g(v, ".3f") for v in d["cos_mean"]],
    })


# ----------------------------------------------------------------------------- JSON helpers

def _json_default(value):
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return None if math.isnan(value) else float(value)
    if isinstance(value, (datetime, pd.Timestamp)):
        return value.isoformat()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def _cell(value):
    if value is None or value is pd.NA:
        return None
    if isinstance(value, (float, np.floating)):
        return None if math.isnan(value) else float(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.bool_):
        return bool(value)
    return value


def _frame_json(frame: pd.DataFrame) -> dict:
    return {"columns": list(frame.columns), "dtypes": [str(t) for t in frame.dtypes],
            "data": [[_cell(v) for v in row] for row in frame.itertuples(index=False, name=None)]}


def _frame_from(d: dict) -> pd.DataFrame:
    """The frame ``_frame_json`` wrote, with its numeric and boolean dtypes back."""
    columns = {}
    for i, (column, dtype) in enumerate(zip(d["columns"], d["dtypes"])):
        values = [row[i] for row in d["data"]]
        if dtype == "float64":
            columns[column] = pd.array([np.nan if v is None else v for v in values], dtype="float64")
        elif dtype in ("Int64", "int64"):
            kind = "int64" if dtype == "int64" and None not in values else "Int64"
            columns[column] = pd.array(values, dtype=kind)
        elif dtype == "bool":
            columns[column] = pd.array(values, dtype="bool")
        else:
            columns[column] = pd.array(values, dtype=object)
    return pd.DataFrame(columns, columns=d["columns"])


# ----------------------------------------------------------------------------- rendering

STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;max-width:1180px;margin:2em auto;padding:0 1em;
color:#222;line-height:1.45}
h1{font-size:1.7em}h2{margin-top:2em;border-bottom:1px solid #ddd;padding-bottom:.2em}h3{font-size:1.05em;margin-top:1.4em}
table{border-collapse:collapse;margin:.6em 0;font-size:.88em}th,td{border:1px solid #ddd;padding:.25em .55em;text-align:left;
vertical-align:top}th{background:#f4f4f4}figure{margin:1.2em 0}figcaption{color:#555;font-size:.9em;margin:.3em 0}
.verdict-supported{color:#1a7f37;font-weight:600}.verdict-not-supported{color:#b42318;font-weight:600}
.verdict-inconclusive{color:#9a6700;font-weight:600}.verdict-not-measured{color:#777}
.scroll{overflow-x:auto;max-width:100%}figure.plot{max-width:100%;overflow-x:hidden}
p,li,figcaption,h1,h2,h3{overflow-wrap:anywhere}
"""


def _html_table(frame: pd.DataFrame) -> str:
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in frame.columns)
    body = []
    for row in frame.itertuples(index=False, name=None):
        cells = []
        for column, value in zip(frame.columns, row):
            text = html.escape("—" if value is None or (isinstance(value, float) and math.isnan(value)) else str(value))
            css = f' class="verdict-{text.replace(" ", "-")}"' if column == "verdict" and text in claims.VERDICTS else ""
            cells.append(f"<td{css}>{text}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    # a table wider than the page (a phone) scrolls in its own box; the page keeps its width
    return f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table></div>'


def to_html(report: Report) -> str:
    """The report as one self-contained HTML file: tables as HTML, figures as interactive
    Plotly with plotly.js inlined once (with the first figure), no CDN, no MathJax, a
    Content-Security-Policy that forbids every request, and all text escaped."""
    parts, with_js = [], True
    for b in report.blocks():
        if b.kind == "heading":
            parts.append(f"<h{b.level}>{html.escape(b.title)}</h{b.level}>")
        elif b.kind == "text":
            parts.append(f"<p>{html.escape(b.text)}</p>")
        elif b.kind == "list":
            title = f"<h3>{html.escape(b.title)}</h3>" if b.title else ""
            parts.append(title + "<ul>" + "".join(f"<li>{html.escape(i)}</li>" for i in b.items) + "</ul>")
        elif b.kind == "table":
            caption = f"<figcaption>{html.escape(b.text)}</figcaption>" if b.text else ""
            parts.append(f"<figure><h3>{html.escape(b.title)}</h3>{caption}{_html_table(b.frame)}</figure>")
        elif b.kind == "figure":
            div = pio.to_html(report.figures[b.name], full_html=False, include_plotlyjs=with_js, include_mathjax=False,
                              div_id=f"figure-{b.name}", config=FIGURE_CONFIG, validate=False)
            with_js = False
            parts.append(f'<figure class="plot">{div}<figcaption>{html.escape(b.text)}</figcaption></figure>')
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta http-equiv=\"Content-Security-Policy\" content=\"{CONTENT_POLICY}\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{html.escape(report.title)}</title><style>{STYLE}</style></head>\n<body>\n"
            + "\n".join(parts) + "\n</body></html>\n")


_MD_SPECIAL = re.compile(r"([\\`*_\[\]<>|~])")


def md_text(text: Any) -> str:
    """Plain text for Markdown: every character Markdown or HTML would act on escaped,
    so a run name such as ``![x](http://host/x.png)`` or ``<script>`` stays text."""
    return _MD_SPECIAL.sub(r"\\\1", str(text)).replace("\r", " ").replace("\n", " ")


def _md_table(frame: pd.DataFrame) -> str:
    rows = [[md_text("—" if v is None or (isinstance(v, float) and math.isnan(v)) else v) for v in row]
            for row in frame.itertuples(index=False, name=None)]
    return tabulate(rows, headers=[md_text(c) for c in frame.columns], tablefmt="pipe", disable_numparse=True)


def figure_files(report: Report, figure_dir: str) -> dict[str, str]:
    """Figure name → its path relative to the Markdown file: ``<figure_dir>/<name>.svg``."""
    return {name: f"{figure_dir}/{name}.{FIGURE_FORMAT}" for name in report.figures}


def to_markdown(report: Report, figure_dir: str) -> str:
    """The report as Markdown (GitHub pipe tables), its figures as images under
    ``figure_dir`` (relative to the Markdown file; ``write_figures`` writes them)."""
    files = figure_files(report, figure_dir)
    parts = []
    for b in report.blocks():
        if b.kind == "heading":
            parts.append("#" * b.level + " " + md_text(b.title))
        elif b.kind == "text":
            parts.append(md_text(b.text))
        elif b.kind == "list":
            parts.append((f"**{md_text(b.title)}**\n\n" if b.title else "") + "\n".join(f"- {md_text(i)}" for i in b.items))
        elif b.kind == "table":
            caption = f"\n\n{md_text(b.text)}" if b.text else ""
            parts.append(f"**{md_text(b.title)}**{caption}\n\n{_md_table(b.frame)}")
        elif b.kind == "figure":
            title = _figure_title(report.figures[b.name]) or b.name
            parts.append(f"![{md_text(title)}]({files[b.name]})\n\n*{md_text(b.text)}*")
    return "\n\n".join(parts) + "\n"


def _figure_title(fig: go.Figure) -> str:
    return (fig.layout.title.text or "") if fig.layout.title else ""


def write_figures(report: Report, directory: Path, width: int = 1000) -> list[Path]:
    """Write every figure as SVG into ``directory`` (created), with Plotly's static
    export (kaleido, which drives a local Chrome or Chromium; nothing is fetched). One
    browser session draws them all. The driver can drop a figure without an error (it
    logs a garbled message from the browser and goes on), so the files are checked: the
    missing ones are drawn once more, and a figure still missing is a RuntimeError."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = {n: directory / f"{n}.{FIGURE_FORMAT}" for n in report.figures}
    for p in paths.values():  # a file left from an earlier build must not pass for a new one
        p.unlink(missing_ok=True)
    for _ in range(2):
        missing = [n for n, p in paths.items() if not p.is_file() or p.stat().st_size == 0]
        if not missing:
            break
        pio.write_images([report.figures[n] for n in missing], [paths[n] for n in missing],
                         format=FIGURE_FORMAT, width=width)
    missing = [n for n, p in paths.items() if not p.is_file() or p.stat().st_size == 0]
    if missing:
        raise RuntimeError(f"the browser did not draw {', '.join(missing)}")
    return list(paths.values())


__all__ = ["Block", "Report", "build", "describe_selection", "figure_files", "md_text", "to_html", "to_markdown",
           "write_figures", "TABLE3_COLUMNS"]
