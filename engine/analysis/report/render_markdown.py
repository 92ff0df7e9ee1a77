"""A report as Markdown: GitHub pipe tables, every text escaped (``md_text``), its
figures as images beside the file (``figures.write_figures`` draws them)."""

from __future__ import annotations

import math
import re
from typing import Any

import pandas as pd
from tabulate import tabulate

from engine.analysis.report.figures import figure_files, figure_title
from engine.analysis.report.model import Report

_MD_SPECIAL = re.compile(r"([\\`*_\[\]<>|~])")


def md_text(text: Any) -> str:
    """Plain text for Markdown: every character Markdown or HTML would act on escaped,
    so a run name such as ``![x](http://host/x.png)`` or ``<script>`` stays text."""
    return _MD_SPECIAL.sub(r"\\\1", str(text)).replace("\r", " ").replace("\n", " ")


def _md_table(frame: pd.DataFrame) -> str:
    rows = [[md_text("—" if v is None or (isinstance(v, float) and math.isnan(v)) else v) for v in row]
            for row in frame.itertuples(index=False, name=None)]
    return tabulate(rows, headers=[md_text(c) for c in frame.columns], tablefmt="pipe", disable_numparse=True)


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
            title = figure_title(report.figures[b.name]) or b.name
            parts.append(f"![{md_text(title)}]({files[b.name]})\n\n*{md_text(b.text)}*")
    return "\n\n".join(parts) + "\n"
