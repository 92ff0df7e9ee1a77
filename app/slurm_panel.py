"""The workers view's Slurm section: the lab's Slurm jobs (job id, state, node, worker, the
run it trains) and a form that submits worker jobs or cancels them, through the functions
``python -m engine workers --slurm / --cancel`` call (``engine.runner.slurm``). A refused
request (no Slurm here, SQLite, an unknown partition, a database the jobs cannot reach) is
one error line, kept on the page until the next request, and submits nothing: the engine's
line, shared with the CLI, with the CLI's flags named as this panel's fields (``panel_text``).
Job states are shown as Slurm writes them (RUNNING, PENDING, ...)."""

from __future__ import annotations

import re
import shutil
from typing import NoReturn

import streamlit as st

from app import display, state
from engine.errors import UserError
from engine.runner import slurm

KEY = "runs.slurm."
PARTITION, GPUS, TIME = "Partition", "GPUs per job", "Time limit (min)"  # the form's fields a refusal names
# The CLI's words in the engine's refusals (``engine workers --slurm``) → this panel's; the
# dashboard's database is the one BASIS_LAB_DB_URL named when it started.
CLI_WORDS = (
    (re.compile(r"use one of (.+) \(--partition\)"), rf"enter one of \1 in {PARTITION} (empty: the cluster's default)"),
    (re.compile(r"`--cancel` takes them back"), "the button “Cancel these Slurm jobs” takes them back"),
    (re.compile(r"fix the Slurm flags"), f"fix {PARTITION}, {GPUS} or {TIME} below, or for what this form lacks "
     "submit from a terminal on the same database (BASIS_LAB_DB_URL): “python -m engine workers --slurm N "
     "--partition P --gpus G --time MIN --mem GB --slurm-option account=NAME”"),
    (re.compile(r"--db (?=\S+://)"), "BASIS_LAB_DB_URL="),
    (re.compile(r"--db\b"), "BASIS_LAB_DB_URL"),
)


def panel_text(line: str) -> str:
    """The engine's one-line refusal as this panel says it: the CLI's flags named as the
    panel's fields (``CLI_WORDS``), the first letter a capital."""
    for cli, panel in CLI_WORDS:
        line = cli.sub(panel, line)
    return line[:1].upper() + line[1:]


def jobs_table(jobs: list[slurm.SlurmJob]):
    """``slurm.jobs_frame`` (shared with the CLI) with each job's state as Slurm writes it."""
    return slurm.jobs_frame(jobs).assign(state=[j.state for j in jobs])


def section(store) -> None:
    """Drawn inside the workers expander behind a toggle (off: no Slurm command runs): the jobs,
    then the form; a caption where there is no Slurm."""
    if not st.toggle("Workers on Slurm", key=KEY + "show",
                     help="The lab's Slurm jobs, and a form to put workers on the cluster or take them back"):
        return
    if shutil.which("sbatch") is None:
        st.caption("Workers on a Slurm cluster: run the dashboard (or `python -m engine workers --slurm N`) on a "
                   "login node of the cluster; this machine has no `sbatch`.")
        return
    _last_said()
    _jobs(store)
    _form(store)


@state.guarded
def _jobs(store) -> None:
    jobs = slurm.lab_jobs(store)
    if not jobs:
        st.caption("No Slurm job of this lab is queued or running.")
        return
    st.dataframe(jobs_table(jobs), hide_index=True, width="stretch", placeholder="—", key=KEY + "jobs",
                 column_config={"run": st.column_config.NumberColumn("training run", format="%d")})
    if st.button("Cancel these Slurm jobs", key=KEY + "cancel", icon=":material/cancel:",
                 help="scancel: each job's runs checkpoint and go back to the queue (resumable)"):
        cancelled = slurm.cancel(store)
        _said(f"Cancelled Slurm job(s) {', '.join(cancelled) or '(none left)'}: their runs checkpoint and go back "
              "to the queue")


def _form(store) -> None:
    with st.form(KEY + "form", border=False):
        cols = st.columns(5)
        count = cols[0].number_input("Slurm jobs", min_value=1, max_value=256, value=2, step=1)
        partition = cols[1].text_input(PARTITION, value="", placeholder="the cluster's default")
        gpus = cols[2].number_input(GPUS, min_value=0, max_value=16, value=0, step=1)
        minutes = cols[3].number_input(TIME, min_value=1, value=60, step=10)
        idle = cols[4].number_input("Exit after idle (s)", min_value=slurm.MIN_IDLE_EXIT_S, value=60.0, step=10.0)
        if st.form_submit_button("Put workers on Slurm", icon=":material/cloud_upload:",
                                 help="Each job drains the queue of this database (PostgreSQL) and exits"):
            _submit(store, slurm.SlurmRequest(jobs=int(count), partition=partition.strip() or None, gpus=int(gpus),
                                              time_min=int(minutes), idle_exit=float(idle)))


def _submit(store, request: slurm.SlurmRequest) -> None:
    try:
        ids = slurm.submit(store, request)
    except UserError as e:  # refused before anything was submitted: one line, kept like a success
        _said(panel_text((str(e).strip().splitlines() or [type(e).__name__])[0]), refused=True)
    _said(f"Submitted Slurm job(s) {', '.join(ids)}")


def _said(text: str, refused: bool = False) -> NoReturn:
    """Keep ``text`` for the section's next draws (the page refreshes itself every few
    seconds, which would wipe a message drawn once) and draw again, so the jobs table already
    holds what was just done."""
    st.session_state[KEY + "said"] = (text, refused)
    st.rerun()


def _last_said() -> None:
    if (said := st.session_state.get(KEY + "said")) is not None:
        text, refused = said
        if refused:
            st.error(display.plain(text), icon=":material/error:")
        else:
            st.success(display.plain(text), icon=":material/check:")
