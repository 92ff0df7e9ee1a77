"""What ``python -m engine list`` prints: the runs, newest first, fitted to a terminal.

By default the table fits ``WIDTH`` columns: the id, name, status, steps (done/total),
last validation loss and sweep id; a name too long for what is left is cut with ``…``.
``wide``: every column, nothing cut (as wide as the values make it). No JAX here."""

from __future__ import annotations

import pandas as pd

from engine.cli.output import table_text

WIDTH = 100  # characters: a terminal split in two still shows a whole line
GAP = 2  # spaces between columns
NAME_MIN = 12  # a name is never cut shorter than this
WIDE_COLUMNS = ["id", "name", "status", "sweep_id", "tags", "estimator", "rank", "lam", "seed", "preset", "steps_done",
                "steps", "last_train_loss", "last_val_loss", "last_mean_cos", "owner", "created_at"]


def _steps_text(done, total) -> str:
    total = "?" if pd.isna(total) else f"{int(total):,}"
    return f"{0 if pd.isna(done) else int(done):,}/{total}"


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[:max(width - 1, 1)] + "…"


def narrow_frame(frame: pd.DataFrame, width: int = WIDTH) -> pd.DataFrame:
    """``FramesRepository.frames.runs_frame()`` as the default list's columns (text), newest first, the
    names cut so that a line is at most ``width`` characters where a name of
    ``NAME_MIN`` characters leaves room."""
    frame = frame.sort_values("id", ascending=False)
    out = pd.DataFrame({
        "id": frame["id"].astype(str),
        "name": frame["name"].astype(str),
        "status": frame["status"].astype(str),
        "steps": [_steps_text(d, t) for d, t in zip(frame["steps_done"], frame["steps"])],
        "val": ["-" if pd.isna(v) else f"{v:.3f}" for v in frame["last_val_loss"]],
        "sweep": frame["sweep_id"].fillna("-").astype(str),
    })
    widths = {c: max(len(c), int(out[c].str.len().max())) for c in out}
    excess = sum(widths.values()) + GAP * (len(widths) - 1) - width
    if excess > 0:
        out["name"] = out["name"].map(lambda n: _cut(n, max(widths["name"] - excess, NAME_MIN)))
    return out


def list_text(frame: pd.DataFrame, *, wide: bool = False, width: int = WIDTH) -> str:
    """The text of ``engine list`` for ``FramesRepository.frames.runs_frame()``'s rows: newest first;
    ``wide``: every column of ``WIDE_COLUMNS``, else :func:`narrow_frame`."""
    if wide:
        shown = frame.sort_values("id", ascending=False)
        shown = shown[[c for c in WIDE_COLUMNS if c in shown.columns]].assign(
            tags=[", ".join(t) if isinstance(t, (list, tuple)) else t for t in shown["tags"]])
        return table_text(shown)
    shown = narrow_frame(frame, width)
    widths = {c: max(len(c), int(shown[c].str.len().max())) for c in shown}
    right = {"id", "steps", "val"}  # numbers line up on the right
    lines = [[c for c in shown], *shown.itertuples(index=False)]
    return "\n".join((" " * GAP).join(str(v).rjust(widths[c]) if c in right else str(v).ljust(widths[c])
                                       for c, v in zip(shown.columns, line)).rstrip() for line in lines)
