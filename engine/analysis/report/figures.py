"""A report's figures as files: SVG through Plotly's static export (kaleido), the
images the Markdown links to (``render_markdown``)."""

from __future__ import annotations

from pathlib import Path

import plotly.graph_objects as go
import plotly.io as pio

from engine.analysis.report.model import Report

FIGURE_FORMAT = "svg"


def figure_files(report: Report, figure_dir: str) -> dict[str, str]:
    """Figure name → its path relative to the Markdown file: ``<figure_dir>/<name>.svg``."""
    return {name: f"{figure_dir}/{name}.{FIGURE_FORMAT}" for name in report.figures}


def figure_title(fig: go.Figure) -> str:
    """The figure's own title, "" when it has none."""
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
