"""The report model: what a report holds (``Report``), its document (``Report.blocks``:
headings, text, tables and figures, in order, the one list every renderer walks) and its
stored form (``Report.to_json``/``from_json``; the frames as Arrow, ``stored``).

``building.build`` makes a ``Report`` from run records and metric rows; ``render_html``,
``render_markdown`` and the dashboard's Report page show its blocks; ``figures`` writes
its figures as SVG files.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio

from engine.analysis import claims
from engine.analysis.report.stored import decode_frame, encode_frame, json_default
from engine.analysis.report.tuning import TuningSection, is_tuned
from engine.analysis.summary import TABLE3_COLUMNS, display_frame
from engine.analysis.summary import notes as table3_notes
from engine.config import method_label
from engine.core.stats import MARGIN, POWER, VERDICT_RULE

REPORT_VERSION = 2  # 2: frames as Arrow (``stored``); 1: frames as JSON rows, still read
READ_VERSIONS = (1, 2)


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
    gathering: list[str] = field(default_factory=list)  # how to gather the data claims (a) and (b) need
    tuning: TuningSection | None = None  # the runs are a tuning campaign's (``report.tuning``)

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
        out += _tuning_blocks(self) + _table3_blocks(self)
        out += [Block("heading", "Claims of the paper"),
                Block("table", "Claims", frame=claims.verdict_frame(self.verdicts),
                      text="Each claim with the verdict the stored data support, by the rules below, and the numbers "
                           "behind it."),
                Block("list", "Rules", items=tuple(v.rule for v in self.verdicts))]
        plans = tuple(f"({v.key}) {v.power}" for v in self.verdicts if v.power)
        if plans:
            out.append(Block("list", f"What would decide each claim ({POWER:.0%} power)", items=plans))
        if self.gathering:
            out.append(Block("list", "How to gather the data claims (a) and (b) need", items=tuple(self.gathering)))
        out += [Block("heading", "Figures")]
        placed = set(self.tuning.figures) if self.tuning else set()  # drawn in the tuning section
        out += [Block("figure", name=name, text=self.captions.get(name, "")) for name in self.figures if name not in placed]
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
        """The whole report as JSON text: its frames as Arrow (``stored.encode_frame``,
        dtypes and values exact), the rest as JSON (NaN as null)."""
        return json.dumps({
            "version": REPORT_VERSION, "title": self.title, "created_at": self.created_at,
            "selection": self.selection, "run_ids": [int(i) for i in self.run_ids],
            "at_step": None if self.at_step is None else int(self.at_step),
            "setup": {k: [list(r) for r in v] for k, v in self.setup.items()},
            "table3": encode_frame(self.table3), "step_times": encode_frame(self.step_times),
            "diagnoses": encode_frame(self.diagnoses),
            "verdicts": [v.__dict__ for v in self.verdicts],
            "figures": {k: json.loads(pio.to_json(f, validate=False)) for k, f in self.figures.items()},
            "captions": self.captions, "notes": self.notes, "gathering": self.gathering,
            "tuning": None if self.tuning is None else self.tuning.to_dict(),
        }, allow_nan=False, default=json_default)

    @classmethod
    def from_json(cls, text: str) -> "Report":
        """The report ``to_json`` wrote, in this format or an older one (``READ_VERSIONS``)."""
        d = json.loads(text)
        if d.get("version") not in READ_VERSIONS:
            raise ValueError(f"report format version {d.get('version')!r} is not one of {READ_VERSIONS}; rebuild the "
                             "report from the database")
        return cls(
            title=d["title"], created_at=d["created_at"], selection=d["selection"], run_ids=d["run_ids"],
            at_step=d["at_step"], setup={k: [tuple(r) for r in v] for k, v in d["setup"].items()},
            table3=_with_columns(decode_frame(d["table3"]), TABLE3_COLUMNS), step_times=decode_frame(d["step_times"]),
            diagnoses=decode_frame(d["diagnoses"]), verdicts=[claims.Verdict(**v) for v in d["verdicts"]],
            figures={k: pio.from_json(json.dumps(f), skip_invalid=True) for k, f in d["figures"].items()},
            captions=d.get("captions", {}), notes=d.get("notes", []), gathering=d.get("gathering", []),
            tuning=TuningSection.from_dict(d["tuning"]) if d.get("tuning") else None,
        )


# ----------------------------------------------------------------------------- parts of the document

def _table3_block(table: pd.DataFrame, title: str, caption: str | None = None) -> list[Block]:
    """A Table 3 with its caption (``table3_caption`` unless given) and the notes under it."""
    out = [Block("table", title, frame=display_frame(table) if len(table) else _empty("no runs"),
                 text=table3_caption(table) if caption is None else caption)]
    return out + [Block("text", text="Note: " + n) for n in (table3_notes(table) if len(table) else ()) if n]


def _table3_blocks(report: "Report") -> list[Block]:
    """Table 3; for a tuning campaign's comparison, each method at its own best value, then
    every method at the untuned value (``TuningSection.tables``, the tuned one first)."""
    tables = report.tuning.tables if report.tuning else []
    if not tables:
        return [Block("heading", "Table 3: validation loss and the paired difference to exact backprop"),
                *_table3_block(report.table3, "Table 3")]
    out = []
    for i, (title, table) in enumerate(tables):
        short = "tuned" if is_tuned(table) else "untuned"
        again = "The columns and verdicts read as in the table above." if i else None
        out += [Block("heading", f"Table 3, {title}"), *_table3_block(table, f"Table 3 ({short})", again)]
    return out


def _tuning_blocks(report: "Report") -> list[Block]:
    """The tuning section (``report.tuning``): the protocol, the chosen values, the sensitivity figures."""
    t = report.tuning
    if t is None:
        return []
    return [Block("heading", t.title), Block("text", text=t.intro),
            Block("table", "Protocol", frame=pd.DataFrame(t.protocol, columns=["item", "how"]), level=3,
                  text="How every method was tuned: the same search space, points, budget and seeds for each."),
            Block("table", "Chosen value per method", frame=t.choices, level=3,
                  text="The trial with the lowest mean validation loss over the tuning seeds at the last step; a "
                       "value at the edge of the range tried says to widen the range."),
            *[Block("figure", name=name, text=report.captions.get(name, "")) for name in t.figures
              if name in report.figures]]


# ----------------------------------------------------------------------------- text of the document

def describe_selection(selection: dict) -> str:
    """``Sweep 2026…``, ``Runs tagged reproduce``, ``Runs 1, 2, 5``, ``All runs``."""
    if selection.get("sweep"):
        return f"Sweep {selection['sweep']}"
    if selection.get("tags"):
        return f"Runs tagged {', '.join(selection['tags'])}"
    if selection.get("runs"):
        return f"Runs {', '.join(map(str, selection['runs']))}"
    return "All runs"


def table3_caption(table: pd.DataFrame) -> str:
    """What Table 3's columns and verdicts mean, with its margin δ and why that δ, and exact's
    observed seed-to-seed SD beside it."""
    margins = sorted({float(m) for m in table["margin"].dropna()}) if len(table) else []
    delta = " / ".join(f"{m:g}" for m in margins) or f"{MARGIN:g}"
    exact_sd = table.loc[table["estimator"] == "exact", "val_loss_std"].dropna() if len(table) else pd.Series()
    observed = (f" Here exact's seed SD is {' / '.join(f'{v:.4f}' for v in exact_sd)} nats." if len(exact_sd) else "")
    return ("Each method's seeds are read at one step (the latest every live run of its group validated at, never "
            "step 0, or the step asked for; the notes under the table say which and why). Δ val "
            "vs exact is the mean over seeds of val(method, s) − val(exact, s), the same seed meaning the same initial "
            "parameters and batches; Δ per seed lists each. 95 % CI: its t-interval, from the seeds and the validation "
            "batches (SE seeds / val). 90 % CI: the interval of the "
            f"equivalence test (two one-sided t-tests at 5 %) against the margin δ = {delta} nats. Verdict: "
            f"{VERDICT_RULE} δ defaults to {MARGIN:g} nats (--margin sets it): no more than exact backprop's own seed-to-seed SD of "
            f"validation loss in this lab's CPU reproductions (0.01–0.026 nats).{observed} saved ÷ exact: bytes kept "
            "for the backward pass, run ÷ exact.")


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




def _with_columns(frame: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    """``frame`` with every one of ``columns`` (a report stored before a column existed: NaN,
    or "" for the text of ``delta_val_by_seed``), so an older report still renders."""
    for column in columns:
        if column not in frame:
            frame[column] = "" if column in ("delta_val_by_seed", "duplicates", "diverged", "read") else \
                0 if column in ("val_batches", "holm_tests") else False if column == "read_whole" else np.nan
    return frame
