"""How the pages dress plain data: status symbols and the one chart-render helper."""

from __future__ import annotations

import streamlit as st

STATUS_LABELS = {  # text symbols, not emoji: they render with any font
    "queued": "○ queued",
    "running": "▶ running",
    "finished": "✓ finished",
    "failed": "✗ failed",
    "cancelled": "■ cancelled",
    "interrupted": "⚠ interrupted",
}
PLOT_CONFIG = {"displaylogo": False, "toImageButtonOptions": {"format": "png", "scale": 2}}


def status_text(status: str) -> str:
    """``✓ finished``: a status with its symbol."""
    return STATUS_LABELS.get(status, status)


def plot(fig, key: str) -> None:
    """A chart whose zoom survives live refreshes (stable key, ``uirevision``)."""
    st.plotly_chart(fig, width="stretch", config=PLOT_CONFIG, key=key)
