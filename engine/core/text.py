"""The one way user text reaches a page: ``plain(text, medium)``.

A run's name, its notes, a tag, a sweep id, a path typed into a form, and any error
message (which may quote any of those) are user text. Shown as markdown, ``![x](url)``
would make every viewer's browser fetch ``url``; shown in a Plotly label, ``<img>`` or
``<a href>`` would be obeyed. ``plain`` escapes for the medium so the text is shown as
typed and fetches nothing. Streamlit-free and in engine.core, so the chart builders of
engine.analysis (shared by the dashboard and the reports) use it too; app.text re-exports it.
"""

from __future__ import annotations

import html

MARKDOWN = "markdown"  # st.markdown / st.caption / st.error / st.progress text / st.toast …
PLOTLY = "plotly"  # trace names, hover text, axis categories (Plotly's HTML subset)
_MARKDOWN_SPECIAL = "\\`*_{}[]()<>#+-.!|~$:"


def plain(text, medium: str = MARKDOWN) -> str:
    """``text`` escaped for ``medium``: every markdown special character backslashed (line
    breaks kept), or HTML-escaped for Plotly."""
    if medium == PLOTLY:
        return html.escape(str(text), quote=False)
    if medium != MARKDOWN:
        raise ValueError(f"unknown medium {medium!r}; use {MARKDOWN!r} or {PLOTLY!r}")
    return "".join("\\" + c if c in _MARKDOWN_SPECIAL else c for c in str(text)).replace("\n", "  \n")
