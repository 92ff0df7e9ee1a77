"""A report of a set of runs: built from their records and metrics alone (no database, no
Streamlit; ``engine.reads.reports`` reads the database and stores the result), shown as
HTML, Markdown and on the dashboard's Report page, stored as JSON. A new section of every
report goes in ``building`` (and its block kind, if new, in ``model`` and each renderer).

- ``model``: what a report holds (``Report``), its document (``Report.blocks``: headings,
  text, tables and figures, in order, which every renderer walks) and its stored JSON,
  which round-trips exactly (frames as Arrow: ``stored``; reports stored in the older
  format still open);
- ``building``: ``build``, the report of run records, metric rows and diagnoses;
- ``render_html``: ``to_html``, one self-contained file from a Jinja2 template
  (autoescaped; plotly.js inlined once; a Content-Security-Policy forbids any request);
- ``render_markdown``: ``to_markdown``, text plus the figures written beside it as SVG
  (``figures.write_figures``);
- ``tuning``: a tuning campaign's section (``Campaign`` in, ``TuningSection`` stored): the
  protocol, the chosen values, the sensitivity figure, Table 3 tuned and untuned.
"""

from engine.analysis.report.building import build
from engine.analysis.report.figures import FIGURE_FORMAT, figure_files, write_figures
from engine.analysis.report.model import REPORT_VERSION, Block, Report, describe_selection, table3_caption
from engine.analysis.report.render_html import STYLE, to_html
from engine.analysis.report.render_markdown import md_text, to_markdown
from engine.analysis.report.tuning import Campaign, TuningSection
from engine.analysis.summary import TABLE3_COLUMNS

__all__ = ["Block", "Campaign", "FIGURE_FORMAT", "REPORT_VERSION", "Report", "STYLE", "TABLE3_COLUMNS", "build",
           "describe_selection", "figure_files", "md_text", "table3_caption", "to_html", "to_markdown",
           "TuningSection", "write_figures"]
