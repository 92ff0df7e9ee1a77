"""Compare's summary in the paper's Table 3 form: its controls (the equivalence margin and
Holm's adjustment), the table, its notes and its downloads. Compare computes the table
once per rerun, before the rank figure above it, which draws its rows (``chosen`` reads
the controls' values for that, before they are drawn); ``section`` shows it."""

from __future__ import annotations

from functools import partial

import pandas as pd
import streamlit as st

from app import state
from app.display import plain
from app.viewstate import MARGIN_RANGE
from engine.analysis.summary import display_frame, holm_note, noise_note, paper_note, read_notes, split_notes
from engine.core.choices import EQUIVALENCE_MARGIN as MARGIN
from engine.core.stats import VERDICT_RULE
from engine.reads.queries import table3_text

MARGIN_KEY, ADJUST_KEY = "compare.margin", "compare.adjust"
WIDTHS = {"method": 95, "rank": 50, "λ": 50, "seeds": 55, "step": 60, "split": 50, "tuned": 110, "loss": 130,
          "Δ loss": 105, "95% CI": 150, "verdict": 95, "Δ per seed": 220, "train loss": 130, "cos": 55,
          "saved MiB": 80, "saved ÷ exact": 100}


def _width(column: str) -> int | None:
    """A column's width; the loss and Δ columns by their kind, whichever split they are headed by."""
    kind = "Δ loss" if column.startswith("Δ ") and column.endswith(" vs exact") else \
        "loss" if column.endswith(" loss") and column != "train loss" else column
    return WIDTHS.get(kind)


def chosen() -> tuple[float, bool]:
    """(margin, adjust): what the section's controls hold now (their defaults before the
    first visit), so the table can be computed before they are drawn."""
    return float(st.session_state.get(MARGIN_KEY, MARGIN)), bool(st.session_state.get(ADJUST_KEY, True))


def controls(persist: state.Persist = None) -> tuple[float, bool]:
    """The section's heading and its two controls (their values set in the session before:
    Compare keeps them in its URL, ``app.viewstate``'s ``margin`` and ``holm``); (margin, adjust) they hold."""
    st.subheader("Summary (the paper's Table 3 form)")
    st.session_state.setdefault(MARGIN_KEY, MARGIN)
    st.session_state.setdefault(ADJUST_KEY, True)
    margin = st.number_input(
        "Equivalence margin δ (nats)", min_value=MARGIN_RANGE[0], max_value=MARGIN_RANGE[1], step=0.005,
        format="%.3f", key=MARGIN_KEY, persist_state=persist,
        help=f"A method reads 'equivalent' to exact when the 90 % interval of its paired Δ val lies inside ±δ (two "
             f"one-sided tests). Default {MARGIN:g}: no more than exact backprop's own seed-to-seed SD of validation "
             "loss in this lab's CPU reproductions (0.01–0.026 nats).")
    adjust = st.toggle("Hold the verdicts at 5 % for the whole table (Holm)", key=ADJUST_KEY, persist_state=persist,
                       help="Several ranks are several tests: with this on, the chance of any false verdict in the "
                            "table stays at 5 %. Off: each row at its own 5 % level.")
    return float(margin), bool(adjust)


def section(table: pd.DataFrame, margin: float) -> None:
    """Below ``controls``: the table (``table3`` at ``margin``), where it was read and why,
    its notes and its downloads (each file written when its button is clicked, not on every rerun)."""
    with st.container():  # where the table was read and why: the notes come and go as runs progress
        for text in read_notes(table, whole=False):
            st.info(plain(text), icon=":material/vertical_align_bottom:")
        for text in [*read_notes(table, whole=True), *split_notes(table)]:
            st.caption(plain(text))
    shown = display_frame(table)
    st.dataframe(shown, hide_index=True, width="stretch", placeholder="—",
                 column_config={c: st.column_config.Column(width=w) for c in shown if (w := _width(c))})
    delta = next(c for c in shown if c.startswith("Δ ") and c.endswith(" vs exact"))
    notes = [f"{delta}: the mean over seeds of the paired difference to the exact run of the same seed "
             "(same initial parameters and batches), each seed's in Δ per seed, with its 95 % interval and the 90 % "
             f"interval of the equivalence test against ±{margin:g}. Verdict: {VERDICT_RULE}",
             "saved ÷ exact: bytes kept for the backward pass, this method ÷ exact backprop of the same config."]
    notes += [f"Note: {n}" for n in (holm_note(table), noise_note(table), paper_note(table)) if n]
    st.caption(plain(" ".join(notes)))
    d1, d2, d3 = st.columns(3)
    for column, fmt, ext, mime in ((d1, "markdown", "md", "text/markdown"), (d2, "latex", "tex", "text/x-tex"),
                                   (d3, "csv", "csv", "text/csv")):
        column.download_button(f"Table 3 as {fmt}", data=partial(table3_text, table, fmt),  # written on a click
                               file_name=f"basis-table3.{ext}", mime=mime, icon=":material/download:",
                               key=f"table3_download.{fmt}")
