"""How the pages dress plain data: status symbols, user text as plain text (``app.text.plain``), and the one chart-render helper."""

from __future__ import annotations

from typing import Mapping, Sequence

import streamlit as st

from app.text import plain  # noqa: F401  (the one plain-text helper, re-exported for the pages)

STATUS_LABELS = {  # text symbols, not emoji: they render with any font
    "queued": "○ queued",
    "running": "▶ running",
    "finished": "✓ finished",
    "failed": "✗ failed",
    "cancelled": "■ cancelled",
    "interrupted": "⚠ interrupted",
}
WORKER_LABELS = {"active": "▶ active", "stopped": "■ stopped", "gone": "⚠ gone"}
IMAGE_FORMATS = ("png", "svg")
IMAGE_FORMAT = "display.image_format"  # the sidebar's choice of chart download format


def status_text(status: str) -> str:
    """``✓ finished``: a status with its symbol."""
    return STATUS_LABELS.get(status, status)


def worker_state_text(state: str) -> str:
    """``⚠ gone``: a worker's state with its symbol."""
    return WORKER_LABELS.get(state, state)


def resume_text(checkpoint_steps: Mapping[int, int | None], moved: Sequence[int]) -> str:
    """What a Resume did: which run continues from which checkpoint step (or from
    step 0), and which of those asked for (the keys) were not resumable."""
    parts = [f"#{i} from checkpoint step {checkpoint_steps.get(i):,}" if checkpoint_steps.get(i)
             else f"#{i} from step 0 (no checkpoint)" for i in moved]
    left = [i for i in checkpoint_steps if i not in set(moved)]
    text = f"Resumed {', '.join(parts)}." if parts else "Nothing was resumed."
    return text + (f" Not resumable now: {', '.join(f'#{i}' for i in left)}." if left else "")


def plot(fig, key: str) -> None:
    """A chart whose zoom survives live refreshes (stable key, ``uirevision``); its
    toolbar's camera downloads it in the sidebar's format (PNG or SVG)."""
    fmt = st.session_state.get(IMAGE_FORMAT, "png")
    config = {"displaylogo": False, "toImageButtonOptions": {"format": fmt, "scale": 2 if fmt == "png" else 1,
                                                              "filename": f"basis-lab-{key}"}}
    st.plotly_chart(fig, width="stretch", config=config, key=key)
