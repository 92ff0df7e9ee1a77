"""What ``engine workers --slurm`` decides before anything reaches Slurm (no Slurm needed): the
URL its jobs get, and the requests it refuses."""

import os
import stat
from types import SimpleNamespace

import pytest
from sqlalchemy.engine import make_url

from engine.runner import slurm
from engine.runner.slurm_jobs import read_settings, write_settings


def _store(url: str):
    return SimpleNamespace(engine=SimpleNamespace(url=make_url(url)))


def test_a_password_only_in_pgpassword_reaches_the_jobs_through_the_settings_file_alone(monkeypatch, tmp_path):
    monkeypatch.setenv("PGPASSWORD", "s3cret")
    url = slurm._job_url(_store("postgresql+psycopg://lab@db.example/basis"))
    assert make_url(url).password == "s3cret"
    monkeypatch.delenv("PGPASSWORD")  # ~/.pgpass, or a password in the URL: kept as it is
    assert make_url(slurm._job_url(_store("postgresql+psycopg://lab@db.example/basis"))).password is None
    assert make_url(slurm._job_url(_store("postgresql+psycopg://lab:pw@db.example/basis"))).password == "pw"
    path = write_settings(tmp_path / "jobs", url, tmp_path / "ckpt")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600 and stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
    again = write_settings(tmp_path / "jobs", "postgresql+psycopg://lab@db.example/other", tmp_path / "ckpt")
    assert again == path and read_settings(path)[0].endswith("/other")  # replaced whole
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left


@pytest.mark.parametrize("field, value", [("idle_exit", 0.0), ("idle_exit", 1.0), ("jobs", 0), ("gpus", -1)])
def test_a_request_a_job_could_not_use_is_one_line(field, value):
    with pytest.raises(slurm.SlurmError) as refused:
        slurm.SlurmRequest(**{"jobs": 1, field: value}).check()
    assert "\n" not in str(refused.value)


def test_what_submitit_prints_is_kept_back_but_no_other_threads_output():
    """``own_stderr_kept`` (around sbatch, whose refusal submitit also prints): the block's own
    thread's stderr is kept back; another thread writing meanwhile (the dashboard's) loses
    nothing; two threads' blocks take turns and the real stream is put back."""
    import io
    import sys
    import threading

    real = sys.stderr
    sys.stderr = seen = io.StringIO()
    inside, written = threading.Event(), threading.Event()

    def other() -> None:
        inside.wait(10)
        print("theirs", file=sys.stderr)
        written.set()

    try:
        thread = threading.Thread(target=other)
        thread.start()
        with slurm.own_stderr_kept() as kept:
            print("sbatch: error: invalid partition", file=sys.stderr)
            inside.set()
            assert written.wait(10)
        thread.join()
        kepts: dict[int, str] = {}

        def submitter(i: int) -> None:
            with slurm.own_stderr_kept() as own:
                print(f"refusal {i}", file=sys.stderr)
            kepts[i] = own.getvalue()

        submitters = [threading.Thread(target=submitter, args=(i,)) for i in range(8)]
        for t in submitters:
            t.start()
        for t in submitters:
            t.join()
        assert sys.stderr is seen
    finally:
        sys.stderr = real
    assert kept.getvalue() == "sbatch: error: invalid partition\n"
    assert seen.getvalue() == "theirs\n"
    assert kepts == {i: f"refusal {i}\n" for i in range(8)}


def test_a_stream_installed_over_the_stand_in_stays_and_the_stand_in_then_passes_everything_on():
    """A run's console installed over ``sys.stderr`` during a submission (its wrapper holds the
    stand-in) stays installed after it, and what reaches the stand-in afterwards, from any
    thread, goes on to the real stream."""
    import io
    import sys

    real = sys.stderr
    sys.stderr = seen = io.StringIO()

    class Wrapper:  # as engine.runner.console.ThreadConsole wraps the stream it finds
        def __init__(self, inner):
            self.inner = inner

        def write(self, text):
            return self.inner.write(text)

    try:
        with slurm.own_stderr_kept() as kept:
            held = sys.stderr  # a handler made during the block keeps the stand-in
            sys.stderr = wrapper = Wrapper(sys.stderr)
            print("submitit's copy", file=sys.stderr)
        assert sys.stderr is wrapper
        print("after", file=sys.stderr)
        held.write("held\n")
    finally:
        sys.stderr = real
    assert kept.getvalue() == "submitit's copy\n" and seen.getvalue() == "after\nheld\n"
