"""A report's tuning section: what a tuning campaign's comparison (or its trials) report holds of
the campaign: the protocol (search space, trials, sampler, budget, seeds, selection, the split the
verdict reads), each method's chosen value, the sensitivity figure (``tuning_charts``), and Table
3 twice: each method at its own best value, and every method at the untuned value.

``Campaign`` is what the builder is handed (``engine.reads.reports.campaign_of`` reads it from
the database; the Compare page reads the same); ``section`` turns it into the stored
``TuningSection`` and its figures. No database here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd
import plotly.graph_objects as go

from engine.analysis import tuning, tuning_charts
from engine.analysis.report.stored import decode_frame, encode_frame
from engine.config.tuning import TuneSpec

ROLES = ("comparison", "trials")  # which of a campaign's sweeps a report's runs are
FIGURE_PREFIX = "sensitivity"


@dataclass(frozen=True)
class Campaign:
    """A tuning campaign as the report reads it: its stored identity, its protocol (``spec``),
    its trials (``tuning.trial_frame``), the choice read from them (``tuning.choose``) and its
    comparison's Table 3s (``engine.runner.campaigns.comparison_tables``: (title, table3))."""

    id: int
    name: str
    stage: str
    spec: TuneSpec
    trials: pd.DataFrame
    choices: pd.DataFrame
    tables: list[tuple[str, pd.DataFrame]] = field(default_factory=list)
    role: str = "comparison"

    def base(self, name: str) -> float:
        """The untuned value of tuned field ``name``."""
        return float(getattr(self.spec.grid.base, name))

    def tuned_table(self) -> pd.DataFrame | None:
        """Table 3 of each method at its own best value (its ``tuned`` column set), None before it reads."""
        return next((t for _, t in self.tables if is_tuned(t)), None)


def is_tuned(table: pd.DataFrame) -> bool:
    """Whether a Table 3 is the tuned comparison's (its rows carry their tuned values)."""
    return len(table) > 0 and "tuned" in table and table["tuned"].fillna("").astype(bool).any()


@dataclass
class TuningSection:
    """The stored tuning section of a report (module docstring); ``figures`` names its
    sensitivity figures among the report's figures."""

    title: str
    intro: str
    protocol: list[tuple[str, str]]
    choices: pd.DataFrame
    tables: list[tuple[str, pd.DataFrame]]
    figures: list[str]

    def to_dict(self) -> dict:
        return {"title": self.title, "intro": self.intro, "protocol": [list(p) for p in self.protocol],
                "choices": encode_frame(self.choices), "figures": list(self.figures),
                "tables": [{"title": t, "table": encode_frame(f)} for t, f in self.tables]}

    @classmethod
    def from_dict(cls, d: dict) -> "TuningSection":
        return cls(title=d["title"], intro=d["intro"], protocol=[(str(a), str(b)) for a, b in d["protocol"]],
                   choices=decode_frame(d["choices"]), figures=list(d.get("figures", [])),
                   tables=[(t["title"], decode_frame(t["table"])) for t in d.get("tables", [])])


def _intro(c: Campaign) -> str:
    stage = {"tuning": "still tuning: its comparison is queued once every trial has ended",
             "evaluating": "past tuning: its comparison trains each method at its chosen value"}.get(c.stage, c.stage)
    if c.role == "trials":
        runs = "These runs are its trials, every method at the same points"
    else:
        runs = ("These runs are its comparison: each method at the value its own trials chose"
                + (" and at the untuned value" if c.spec.untuned else "")
                + ", on evaluation seeds none was tuned on")
    read = (" Table 3 and the claims read the tuned comparison; the table at the untuned value follows it."
            if c.tuned_table() is not None else "")
    return f"Tuning campaign {c.id} ({c.name}) is {stage}. {runs}.{read}"


def figure_name(name: str) -> str:
    return f"{FIGURE_PREFIX}_{name}"


def section(c: Campaign) -> tuple[TuningSection, dict[str, go.Figure], dict[str, str]]:
    """The stored section, its figures and their captions."""
    figures, captions = {}, {}
    for name in c.spec.fields:
        key = figure_name(name)
        figures[key] = tuning_charts.sensitivity_figure(c.trials, c.choices, name, base=c.base(name))
        captions[key] = (f"Each method's final validation loss against {name} (log axis): a line through the mean "
                         f"over its {len(c.spec.tune_seeds)} tuning seed(s) at each trial's value, every trial run a "
                         "point, the chosen value a star, a diverged trial an × at the top edge; the dotted line is "
                         "the untuned value.")
    shown = tuning.choice_table(c.choices) if len(c.choices) else pd.DataFrame({"": ["no trial yet"]})
    tested = any("split" in t and (t["split"] == "test").any() for _, t in c.tables)
    split = "the held-out test split" if tested else None
    kept = sorted(c.tables, key=lambda t: not is_tuned(t[1]))  # the tuned table first
    return (TuningSection(title=f"Protocol: tuning campaign {c.id}", intro=_intro(c),
                          protocol=tuning.protocol(c.spec, c.choices, split), choices=shown, tables=kept,
                          figures=list(figures)),
            figures, captions)
