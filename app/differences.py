"""Compare's "What sets these runs apart": a parallel-coordinates figure over the fields
the selected runs differ in and their final metrics, and the config diff as a table
(``engine.analysis.parallel``: both derive the fields from the run schema)."""

from __future__ import annotations

import streamlit as st

from app.display import plot
from engine.analysis.parallel import FINAL_METRICS, config_diff, parallel_figure
from storage import RunStore


def section(store: RunStore, records: dict) -> None:
    """The figure and the table for the runs ``records`` (id → ``RunRecord``)."""
    st.subheader("What sets these runs apart")
    finals = store.metrics.final_metrics(list(records), names=list(FINAL_METRICS))
    plot(parallel_figure(records.values(), finals, title="Config fields that differ, and final metrics"), "parallel")
    st.caption("One line per run, coloured by its final validation loss (darker: lower). Drag along an axis to "
               "highlight the runs in a range; drag an axis title to reorder. Text fields are placed in sorted order.")
    diff = config_diff(records.values())
    if len(diff.columns) < 2:
        st.caption("Config diff: the selected runs share every config field." if len(records) > 1
                   else "Config diff: select two or more runs.")
        return
    st.markdown(f"**Config diff**: the {len(diff)} field{'s' if len(diff) != 1 else ''} that differ, one column per run")
    config = {"field": st.column_config.TextColumn("field", pinned=True, width=130)}
    config.update({c: st.column_config.TextColumn(c, width=150) for c in diff.columns[1:]})
    st.dataframe(diff, hide_index=True, width="stretch", column_config=config,
                 height=min(38 + 35 * len(diff), 420))
