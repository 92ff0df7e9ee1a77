"""The one way user text reaches a page: ``plain(text, medium)``.

A run's name, its notes, a tag, a sweep id, a path typed into a form, and any error
message (which may quote any of those) are user text. Shown as markdown, ``![x](url)``
would make every viewer's browser fetch ``url``; shown in a Plotly label, ``<img>`` or
``<a href>`` would be obeyed. ``plain`` escapes for the medium so the text is shown as
typed and fetches nothing. Markdown escapes alone do not stop GFM's autolinks: Streamlit's
renderer finds ``http://…``, ``www.…`` and ``a@b.c`` in the text after the escapes are
read and makes them links, so ``unlinked`` first puts an invisible WORD JOINER where each
would start; it also turns ``>=``, ``->``, ``--`` … between spaces into ≥, →, — …, so
``untypeset`` puts one before each. Streamlit-free and in engine.core, so the chart builders of
engine.analysis (shared by the dashboard and the reports) use it too; app.text re-exports it.
"""

from __future__ import annotations

import html
import re

MARKDOWN = "markdown"  # st.markdown / st.caption / st.error / st.progress text / st.toast …
PLOTLY = "plotly"  # trace names, hover text, axis categories (Plotly's HTML subset)
_MARKDOWN_SPECIAL = "\\`*_{}[]()<>#+-.!|~$:"
WORD_JOINER = "\u2060"  # zero width, invisible: text looks the same, an autolink cannot match across it
_AUTOLINK_STARTS = re.compile(r"(?<=:)(?=//)|(?<=www)(?=\.)|(?<=@)", re.IGNORECASE)
_TYPESET = re.compile(r"(?<!\S)(?=(?:<->|->|<-|--|>=|<=|~=)(?!\S))")  # what Streamlit's markdown turns into symbols


def unlinked(text: str) -> str:
    """``text`` with a ``WORD_JOINER`` in every ``://``, after ``www`` before ``.`` and after
    ``@``: what GFM's autolink literals (``https://h``, ``www.h``, ``a@b.c``, ``mailto:``)
    need to be contiguous, so none matches; the text reads the same."""
    return _AUTOLINK_STARTS.sub(WORD_JOINER, text)


def untypeset(text: str) -> str:
    """``text`` with a ``WORD_JOINER`` before each ``>=``, ``<=``, ``->``, ``<-``, ``<->``,
    ``--`` and ``~=`` that stands between spaces: Streamlit's markdown shows those as ≥, ≤,
    →, ←, ↔, — and ≈ after the escapes are read, so ``rank >= 8`` in an error would read
    ``rank ≥ 8``, which no filter parses. The text reads the same."""
    return _TYPESET.sub(WORD_JOINER, text)


def plain(text, medium: str = MARKDOWN) -> str:
    """``text`` escaped for ``medium``: every markdown special character backslashed, and
    autolinks and typographic replacements broken (``unlinked``, ``untypeset``; line breaks
    kept), or HTML-escaped for Plotly."""
    if medium == PLOTLY:
        return html.escape(str(text), quote=False)
    if medium != MARKDOWN:
        raise ValueError(f"unknown medium {medium!r}; use {MARKDOWN!r} or {PLOTLY!r}")
    text = untypeset(unlinked(str(text)))
    return "".join("\\" + c if c in _MARKDOWN_SPECIAL else c for c in text).replace("\n", "  \n")
