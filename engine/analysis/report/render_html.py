"""A report as one self-contained HTML file, from the Jinja2 template
``templates/report.html.j2`` (package data, loaded with ``jinja2.PackageLoader``, so it
loads the same from a source tree or an installed wheel).

Autoescaping is the one way text reaches the page: titles, captions, cells and list
items go to the template as plain strings and the template escapes them. The one markup
handed over is Plotly's figure div (``plotly.io.to_html``), whose text Plotly itself
JSON-encodes. plotly.js is inlined once (with the first figure), with no CDN and no
MathJax, and a Content-Security-Policy (in the template) forbids every request.
"""

from __future__ import annotations

import functools
import math
from importlib import resources

import jinja2
import pandas as pd
import plotly.io as pio
from markupsafe import Markup

from engine.analysis import claims
from engine.analysis.report.model import Block, Report

FIGURE_CONFIG = {"displaylogo": False, "responsive": True,
                 "toImageButtonOptions": {"format": "svg"}}
TEMPLATES = "templates"
STYLE = resources.files(__package__).joinpath(TEMPLATES, "report.css").read_text(encoding="utf-8")


@functools.cache
def environment() -> jinja2.Environment:
    """The templates' environment: autoescaping on for every template, an undefined
    name an error."""
    return jinja2.Environment(loader=jinja2.PackageLoader(__package__, TEMPLATES), autoescape=True,
                              undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)


def _cell(column: str, value) -> tuple[str, str]:
    """A table cell's text and its CSS class (a claim's verdict is coloured by it)."""
    text = "—" if value is None or (isinstance(value, float) and math.isnan(value)) else str(value)
    css = f"verdict-{text.replace(' ', '-')}" if column == "verdict" and text in claims.VERDICTS else ""
    return text, css


def _table(frame: pd.DataFrame) -> dict:
    return {"columns": [str(c) for c in frame.columns],
            "rows": [[_cell(c, v) for c, v in zip(frame.columns, row)]
                     for row in frame.itertuples(index=False, name=None)]}


def _part(report: Report, b: Block, with_js: bool) -> dict:
    """What the template needs of one block: plain text, and for a figure Plotly's div."""
    if b.kind == "table":
        return {"kind": "table", "title": b.title, "caption": b.text, **_table(b.frame)}
    if b.kind == "figure":
        div = pio.to_html(report.figures[b.name], full_html=False, include_plotlyjs=with_js, include_mathjax=False,
                          div_id=f"figure-{b.name}", config=FIGURE_CONFIG, validate=False)
        return {"kind": "figure", "plot": Markup(div), "caption": b.text}
    return {"kind": b.kind, "title": b.title, "text": b.text, "level": b.level, "entries": b.items}


def to_html(report: Report) -> str:
    """The report as one self-contained HTML file (module docstring): tables as HTML,
    figures as interactive Plotly, all text escaped."""
    parts, with_js = [], True
    for b in report.blocks():
        parts.append(_part(report, b, with_js))
        with_js = with_js and b.kind != "figure"
    return environment().get_template("report.html.j2").render(
        title=report.title, parts=parts)
