"""The Runs page's Slurm panel (``app.slurm_panel``) without a cluster: ``squeue`` and
``sinfo`` answered by stand-ins, so the panel's own words are checked here; the real
cluster's tests are tests/engine/test_slurm.py. A refusal names the panel's fields, not
the CLI's flags, and job states read as Slurm writes them."""

from __future__ import annotations

import shutil

import pytest

from app import display, slurm_panel
from engine.runner import slurm
from tests.support.pages import app, page, url  # noqa: F401  (fixtures)

JOBS = [slurm.SlurmJob("101", "RUNNING", "node1", "node1:41:aa", 7),
        slurm.SlurmJob("102", "RUNNING", "node2", "node2:42:bb", None),
        slurm.SlurmJob("103", "PENDING", "-", None, None)]


@pytest.fixture
def cluster(monkeypatch):
    """``sbatch`` on the PATH, two partitions (debug the default), the lab's jobs ``JOBS``."""
    which = shutil.which
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: f"/usr/bin/{name}" if name == "sbatch" else which(name, *a, **k))
    monkeypatch.setattr(slurm, "partitions", lambda: ["debug", "gpu"])
    monkeypatch.setattr(slurm, "lab_jobs", lambda store: list(JOBS))


def _refusal(check) -> str:
    with pytest.raises(slurm.SlurmError) as refused:
        check()
    return slurm_panel.panel_text(str(refused.value))


def test_the_engines_refusals_name_the_panels_fields_not_the_clis_flags(cluster):
    said = _refusal(lambda: slurm.check_partition("nosuch"))
    assert said == "No partition 'nosuch' on this cluster; enter one of debug, gpu in Partition (empty: the cluster's default)"
    said = _refusal(lambda: slurm.refuse_sqlite("sqlite:///lab.db"))
    assert "--" not in said and "(BASIS_LAB_DB_URL=postgresql+psycopg://user@host/db," in said
    said = slurm_panel.panel_text("the database does not answer from here (refused); start it or fix --db")
    assert said == "The database does not answer from here (refused); start it or fix BASIS_LAB_DB_URL"
    said = slurm_panel.panel_text("Slurm's sbatch refused the job (no account): fix the Slurm flags; jobs 5 went in before it "
                                  "(`--cancel` takes them back)")
    assert said.endswith("(the button “Cancel these Slurm jobs” takes them back)")
    assert said.startswith("Slurm's sbatch refused the job (no account): fix Partition, GPUs per job or Time limit (min) "
                           "below, or for what this form lacks submit from a terminal on the same database "
                           "(BASIS_LAB_DB_URL): “python -m engine workers --slurm N --partition P --gpus G --time MIN "
                           "--mem GB --slurm-option account=NAME”; jobs 5 went in"), said


def test_the_panel_shows_slurms_states_and_refuses_a_partition_by_its_field(cluster, url):  # noqa: F811
    at = page(app(), "runs")
    at.toggle(key=slurm_panel.KEY + "show").set_value(True).run()
    jobs = next(d for d in at.dataframe if "job" in d.value.columns)
    assert list(jobs.value["state"]) == ["RUNNING", "RUNNING", "PENDING"]
    assert jobs.proto.placeholder == "—"  # the pending job's node, worker and run, the idle worker's run
    at.text_input(key=next(t.key for t in at.text_input if t.label == "Partition")).input("nosuch")
    next(b for b in at.button if b.label == "Put workers on Slurm").click().run()
    assert [e.value for e in at.error] == [display.plain(
        "No partition 'nosuch' on this cluster; enter one of debug, gpu in Partition (empty: the cluster's default)")]
