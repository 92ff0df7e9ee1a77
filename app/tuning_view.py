"""Compare's section for a tuning campaign: when the selected runs are a campaign's trials or its
comparison (``store.campaigns.of_sweep``), the sensitivity figure (each method's final validation
loss against the tuned value, ``engine.analysis.tuning_charts``, the report's own), the chosen
value per method, the protocol, and Table 3 each method at its own best value with Table 3 at the
untuned value one tab away. The campaign is read as the report reads it
(``engine.reads.reports.campaign_data``), once per state of its runs."""

from __future__ import annotations

from typing import TYPE_CHECKING

import streamlit as st

from app.display import plain, plot
from engine.analysis import tuning
from engine.analysis.summary import display_frame, read_notes
from engine.analysis.tuning_charts import sensitivity_figure
from storage import RunStore
from storage.campaigns import CampaignRecord

if TYPE_CHECKING:  # the report's modules load JAX: imported where a campaign is shown, not by every Compare
    from engine.analysis.report import Campaign

MEMO = "compare.tuning"
TAB_TITLES = {True: "Each at its best value (tuned)", False: "At the untuned value"}


def campaigns_of(store: RunStore, records: dict) -> list[tuple[CampaignRecord, str]]:
    """The campaigns whose trials or comparison the runs ``records`` (id → record) belong to, with
    which of the two ("trials" or "comparison"), each once."""
    found: dict[int, tuple[CampaignRecord, str]] = {}
    for sweep in dict.fromkeys(r.sweep_id for r in records.values() if r.sweep_id):
        campaign = store.campaigns.of_sweep(sweep)
        if campaign is not None and campaign.id not in found:
            found[campaign.id] = (campaign, "trials" if sweep == campaign.tune_sweep_id else "comparison")
    return list(found.values())


def _data(store: RunStore, campaign: CampaignRecord, role: str) -> Campaign:
    """``campaign_data`` once per state of the campaign's runs (their statuses and steps)."""
    from engine.reads.reports import campaign_data
    sweeps = {campaign.tune_sweep_id, campaign.eval_sweep_id}
    key = (campaign.id, campaign.stage, role,
           tuple((r.id, r.status, r.steps_done) for r in store.runs.list_runs() if r.sweep_id in sweeps))
    memo = st.session_state.setdefault(MEMO, {})
    if memo.get(campaign.id, (None,))[0] != key:
        memo[campaign.id] = (key, campaign_data(store, campaign, role))
    return memo[campaign.id][1]


def section(store: RunStore, records_now: dict, info=None, metrics=None) -> None:
    """The tuning section of every campaign among the selected runs (nothing for other runs)."""
    for campaign, role in campaigns_of(store, records_now):
        _campaign(_data(store, campaign, role))


def _stage_text(c: Campaign) -> str:
    ended = int(c.trials["status"].isin(tuning.SETTLED_STATUSES).sum()) if len(c.trials) else 0
    if c.stage == "tuning":
        return (f"Tuning: {ended} of {len(c.trials)} trial runs ended; each method's value is chosen, and the "
                "comparison queued, when the last one ends. The stars mark the best so far.")
    return (f"Tuned: every trial ended ({ended}); the comparison trains each method at its chosen value on "
            f"evaluation seeds {', '.join(map(str, c.spec.eval_seeds))}, none of them a tuning seed.")


def _campaign(c: Campaign) -> None:
    st.subheader(plain(f"Tuning campaign {c.id}: {c.name}"))
    st.caption(plain(f"The selected runs are its {c.role}. {_stage_text(c)}"))
    fields = list(c.spec.fields)
    name = fields[0]
    if len(fields) > 1:
        name = st.radio("Against", fields, horizontal=True, key=f"compare.tuning.{c.id}.field")
    plot(sensitivity_figure(c.trials, c.choices, name, base=c.base(name)), f"tuning.{c.id}.sensitivity")
    st.caption(plain(f"Each method's final validation loss against {name} (log axis): the line is the mean over the "
                     f"{len(c.spec.tune_seeds)} tuning seed(s) at each trial's value, every trial run a point, the "
                     "chosen value a star, a diverged trial an × at the top edge; the dotted line is the untuned "
                     "value."))
    st.markdown("**Chosen value per method**")
    st.dataframe(tuning.choice_table(c.choices), hide_index=True, width="stretch")
    lines = tuning.protocol(c.spec, c.choices)
    with st.expander("Protocol: the same for every method", icon=":material/rule:"):
        st.table({"item": [plain(a) for a, _ in lines], "how": [plain(b) for _, b in lines]}, hide_index=True)
    _tables(c)


def _tables(c: Campaign) -> None:
    """Table 3 at each method's best value and at the untuned value, a tab apart."""
    from engine.analysis.report.tuning import is_tuned
    if not c.tables:
        st.info("Table 3 of the comparison appears here once the comparison has runs: each method at its own best "
                "value beside every method at the untuned value.", icon=":material/hourglass_top:")
        return
    tables = sorted(c.tables, key=lambda t: not is_tuned(t[1]))
    tabs = st.tabs([TAB_TITLES[is_tuned(t)] for _, t in tables])
    for tab, (title, table) in zip(tabs, tables):
        with tab:
            st.caption(plain(f"Table 3, {title}."))
            st.dataframe(display_frame(table), hide_index=True, width="stretch", placeholder="—")
            for text in read_notes(table):
                st.caption(plain(text))
