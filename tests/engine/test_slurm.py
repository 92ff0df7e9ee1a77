"""Workers on a real Slurm (``engine workers --slurm``, ``engine.runner.slurm``): a throwaway
one-node cluster (``tests.support.slurm``) and the throwaway PostgreSQL. A sweep is trained
exactly once across the jobs; a job cancelled mid-run leaves its run resumable and another
job finishes it; a preemption / time-limit signal checkpoints the run and the job is
requeued. Bad cluster input is one line and submits nothing. Where Slurm is not installed
(``scripts/install_slurm.sh``) or does not come up, the cluster tests skip with the reason."""

from __future__ import annotations

import os
import stat
import subprocess

import pytest

from app import slurm_panel
from engine.cli.main import main
from engine.config import RunConfig
from engine.runner import jobs, slurm, slurm_jobs
from storage import RunStore
from tests.support import pages
from tests.support.pages import url  # noqa: F401 (a fixture)
from tests.support.runs import wait_for
from tests.support.slurm import PARTITION, ThrowawaySlurm

QUICK = RunConfig(preset="tiny", steps=10, eval_interval=5, probe_interval=0, val_batches=1, checkpoint_interval=5)
LONG = QUICK.replace(steps=400, eval_interval=20, checkpoint_interval=20)


@pytest.fixture(scope="module")
def cluster():
    found = ThrowawaySlurm()
    yield found
    found.stop()


@pytest.fixture
def on_slurm(cluster, monkeypatch, tmp_path):
    """The cluster's clients on this process's environment, checkpoints in ``tmp_path``."""
    if cluster.skip_reason:
        pytest.skip(cluster.skip_reason)
    monkeypatch.setenv("SLURM_CONF", cluster.env["SLURM_CONF"])
    monkeypatch.setenv("BASIS_LAB_CHECKPOINTS", str(tmp_path / "ckpt"))
    return cluster


def _refused(capsys, *argv: str) -> str:
    """``engine workers`` with ``argv``: exit 2 and one line on stderr, returned."""
    assert main(["workers", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and len(err.splitlines()) == 1, err
    return err


def test_sqlite_with_slurm_is_refused_naming_postgresql(tmp_path, capsys):
    err = _refused(capsys, "--slurm", "2", "--db", f"sqlite:///{tmp_path / 'lab.db'}")
    assert "PostgreSQL" in err
    assert not (tmp_path / "lab.db").exists() and not (tmp_path / "slurm-jobs").exists()


def test_no_slurm_on_the_machine_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch
    err = _refused(capsys, "--slurm", "1", "--db", "postgresql+psycopg://lab@db.example.org/lab")
    assert "sbatch" in err and "engine worker" in err


def test_a_local_database_is_refused_when_the_nodes_are_other_machines(tmp_path, monkeypatch):
    """A loopback host or a socket reaches this machine only: refused when ``sinfo`` names
    nodes elsewhere, accepted when every node is this machine."""
    fake = tmp_path / "sinfo"
    fake.write_text("#!/bin/sh\necho \"$NODES\"\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    for host in ("localhost", "127.0.0.1", "/run/postgresql"):
        monkeypatch.setenv("NODES", "gpu01 10.1.2.3")
        assert not slurm._nodes_local(None)
        assert slurm._is_local(host)
        monkeypatch.setenv("NODES", "gpu01 127.0.0.1")
        assert slurm._nodes_local(None)
    assert not slurm._is_local("db.example.org") and not slurm._is_local("10.1.2.3")


def test_the_settings_file_is_the_users_alone(tmp_path):
    path = slurm_jobs.write_settings(tmp_path / "lab", "postgresql+psycopg://u:secret@h/db", tmp_path / "ckpt")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert slurm_jobs.read_settings(path) == ("postgresql+psycopg://u:secret@h/db", str(tmp_path / "ckpt"))


@pytest.mark.postgres
def test_bad_cluster_input_submits_nothing(on_slurm, pg_url, capsys):
    RunStore(pg_url)
    err = _refused(capsys, "--slurm", "1", "--db", pg_url, "--partition", "nosuch")
    assert "nosuch" in err and PARTITION in err
    err = _refused(capsys, "--slurm", "1", "--db", pg_url, "--slurm-option", "nosuch-option=1")
    assert "sbatch refused" in err and "went in" not in err
    err = _refused(capsys, "--slurm", "1", "--db", "postgresql+psycopg://lab@127.0.0.1:1/nothing")
    assert "127.0.0.1" in err or "database" in err
    assert on_slurm.run("squeue", "-h").strip() == ""


def _table(store: RunStore, ids: list[int], events: list[str]) -> str:
    """Jobs, runs and who trained what: each run's claims from its log, each claim's Slurm job
    (the job whose worker, host:pid, claimed it)."""
    jobs = {}
    for path in (slurm.lab_folder(store) / "workers").glob("*"):
        for worker in path.read_text().split():
            jobs[worker.rsplit(":", 1)[0]] = path.name
    lines = [*events, "run  status    steps  claimed by (Slurm job: worker, lease)"]
    for run_id in ids:
        run = store.runs.get_run(run_id)
        claims = [line.text.split()[2:] for line in store.logs.run_logs(run_id) if line.text.startswith("claimed by")]
        said = "; ".join(f"job {jobs.get(c[0], '?')}: {' '.join(c)}" for c in claims)
        lines.append(f"{run_id:<4} {run.status:<9} {run.steps_done:<6} {said}")
    return "\n".join(lines)


def _job_of(store: RunStore, run_id: int) -> str | None:
    return next((j.job_id for j in slurm.lab_jobs(store) if j.run_id == run_id and j.state == "RUNNING"), None)


def _steps(store: RunStore, run_id: int) -> list[int]:
    return store.metrics([run_id], names=["val_loss"])["step"].tolist()


@pytest.mark.postgres
def test_a_sweep_on_slurm_trained_once_through_a_cancel_and_a_preemption(on_slurm, pg_url, capsys):
    store = RunStore(pg_url)
    long_id = jobs.queue_runs(store, [LONG])[0]
    quick = jobs.queue_runs(store, [QUICK.replace(seed=s) for s in range(3)])
    ids, events = [long_id, *quick], []
    assert main(["workers", "--slurm", "2", "--db", pg_url, "--partition", PARTITION, "--idle-exit", "15",
                 "--time", "20"]) == 0
    submitted = capsys.readouterr().out
    events.append(f"submitted: {submitted.strip()}")
    try:
        wait_for(lambda: (store.runs.get_run(long_id).checkpoint_step or 0) >= 40, what="a checkpoint of the long run")
        first = wait_for(lambda: _job_of(store, long_id), what="the job training the long run")
        assert main(["workers", "--cancel", first, "--db", pg_url]) == 0
        events.append(f"scancel {first} while it trained run {long_id}")
        second = wait_for(lambda: (j := _job_of(store, long_id)) != first and j, what="another job to resume it")
        at = store.runs.get_run(long_id).checkpoint_step or 0
        wait_for(lambda: (store.runs.get_run(long_id).checkpoint_step or 0) > at, what="a checkpoint after the resume")
        on_slurm.run("scancel", "--signal=USR2", second)  # what Slurm sends before a time limit or preemption
        events.append(f"USR2 to {second} while it trained run {long_id}")
        wait_for(lambda: any(j.job_id == second and j.state == "PENDING" for j in slurm.lab_jobs(store)),
                 what="the job requeued")
        on_slurm.run("scontrol", "update", f"JobId={second}", "StartTime=now")  # Slurm holds a requeued job ~2 min
        wait_for(lambda: all(store.runs.get_run(i).status == "finished" for i in ids), timeout=900, what="every run finished")
        wait_for(lambda: not slurm.lab_jobs(store), timeout=120, what="the jobs to drain the queue and exit")
    finally:
        print(_table(store, ids, events))
        print(f"run {long_id}'s log:", *(f"  {line.text}" for line in store.logs.run_logs(long_id)), sep="\n")
        for job_file in sorted((slurm.lab_folder(store)).glob("*/*_log.*")):
            print(f"--- {job_file.name}\n{job_file.read_text()[-1500:]}")
    for run_id in quick:
        assert _steps(store, run_id) == [0, 5, 10]  # trained once: no step twice, none missing
    assert _steps(store, long_id) == list(range(0, LONG.steps + 1, LONG.eval_interval))
    run = store.runs.get_run(long_id)
    assert "resumed from the checkpoint at step" in run.notes
    claims = [line.text for line in store.logs.run_logs(long_id) if line.text.startswith("claimed by")]
    assert len(claims) >= 3  # the first job, the one that resumed it after the scancel, then after USR2
    interruptions = [line.text for line in store.logs.run_logs(long_id) if "interrupted" in line.text]
    assert len(interruptions) >= 2, interruptions  # the scancel and the USR2 each checkpointed it
    starts = (slurm.lab_folder(store) / "workers" / second).read_text().split()
    assert len(starts) == 2 and claims[-1].split()[2] == starts[-1].rsplit(":", 1)[0]  # the requeued job finished it


def test_the_jobs_environment_holds_no_database_url(on_slurm, tmp_path, monkeypatch):
    """A job submitted as the lab submits (``--export``) sees every variable of the submitter
    but the two that may hold the password, which it sees empty; the submitter's own
    environment is never changed (the dashboard's threads read it)."""
    monkeypatch.setenv("BASIS_LAB_DB_URL", "postgresql+psycopg://u:secret@h/db")
    monkeypatch.setenv("PGPASSWORD", "secret")
    monkeypatch.setenv("BASIS_LAB_PROBE", "kept")
    out = tmp_path / "job.out"
    subprocess.run(["sbatch", f"--export={slurm.exported()}", "-p", PARTITION, "-o", str(out), "--wrap",
                    "env; srun env | grep -c BASIS_LAB_PROBE"], check=True, capture_output=True)  # as submitit: os.environ
    wait_for(lambda: out.exists() and out.read_text().strip().endswith("1"), timeout=60, what="the job's environment")
    seen = out.read_text()
    assert "secret" not in seen and "BASIS_LAB_PROBE=kept" in seen
    assert "PGPASSWORD=\n" in seen and "BASIS_LAB_DB_URL=\n" in seen
    assert os.environ["PGPASSWORD"] == "secret"
    with pytest.raises(slurm.SlurmError, match="drop export"):
        slurm.SlurmRequest(jobs=1, options={"export": "ALL"}).check()


def test_the_workers_panel_lists_and_submits_through_the_same_checks(on_slurm, url):
    """The Runs page's Workers panel: behind its toggle, the lab's jobs (none) and the form,
    whose refusal of this SQLite lab is the CLI's one line, with nothing submitted."""
    at = pages.page(pages.app(), "runs")
    at.toggle(key=slurm_panel.KEY + "show").set_value(True).run()
    assert any("No Slurm job of this lab" in c.value for c in at.caption)
    next(b for b in at.button if b.label == "Put workers on Slurm").click().run()
    assert [e.value for e in at.error] and "PostgreSQL" in at.error[0].value
    assert on_slurm.run("squeue", "-h").strip() == ""


def test_without_sbatch_the_panel_says_where_to_run_it(url, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch
    at = pages.page(pages.app(), "runs")
    at.toggle(key=slurm_panel.KEY + "show").set_value(True).run()
    assert any("no `sbatch`" in c.value for c in at.caption)
