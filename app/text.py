"""The one way user text reaches a page: ``plain(text, medium)``, defined in
``engine.core.text`` (so engine.analysis's charts, shared with the reports, use it too)."""

from engine.core.text import MARKDOWN, PLOTLY, plain

__all__ = ["MARKDOWN", "PLOTLY", "plain"]
