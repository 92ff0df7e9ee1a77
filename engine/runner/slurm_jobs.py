"""The Slurm job's side of ``engine.runner.slurm``: a worker that drains the queue.

``SlurmWorker`` is the callable ``submitit`` pickles into each job. In the job it opens the
database named by the settings file (``engine.runner.slurm.read_settings``), records its
worker id under ``<folder>/workers/<job id>`` (a line per start; so ``engine workers`` can say which run each
job trains), and runs a pulling ``JobManager``, the one ``python -m engine worker`` runs,
until nothing was left to train for ``idle_exit`` seconds.

How a job ends, and what becomes of its runs:

- drained: the worker exits, its runs all ended;
- ``scancel`` (SIGTERM to the job's steps): the running runs checkpoint and end
  ``interrupted`` (``JobManager.interrupt``), then go back to the queue unowned
  (``give_back``), where another worker resumes them from that checkpoint;
- preempted or at its time limit: Slurm sends ``USR2`` ``signal_delay_s`` before the kill
  (submitit's ``--signal``); submitit calls ``checkpoint``, which stops the worker the same
  way and hands submitit this callable again, and submitit requeues the job
  (``scontrol requeue``) where the partition allows.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

SETTINGS = "settings.json"
SUBMITIT_LOG = "SUBMITIT_LOG_LEVEL"
POLL_S = 0.5


@contextlib.contextmanager
def _submitit_quiet():
    """``submitit`` imported without its logging setup: at import it calls
    ``logging.config.dictConfig``, which closes every logging handler the process already has
    (the dashboard's, pytest's). A job, which imports it first, keeps its log lines."""
    saved = os.environ.get(SUBMITIT_LOG)
    os.environ[SUBMITIT_LOG] = "NOCONFIG"
    try:
        yield
    finally:
        if saved is None:
            del os.environ[SUBMITIT_LOG]
        else:
            os.environ[SUBMITIT_LOG] = saved


with _submitit_quiet():
    from submitit import SlurmExecutor as SlurmExecutor  # for engine.runner.slurm, imported quiet here
    from submitit.core.utils import FailedJobError as FailedJobError
    from submitit.helpers import Checkpointable, DelayedSubmission


def write_settings(folder: Path, url: str, checkpoints: Path) -> Path:
    """``folder/settings.json`` (mode 0600, folder 0700): the database URL and the checkpoint root."""
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    folder.chmod(0o700)
    path = folder / SETTINGS
    fd, fresh = tempfile.mkstemp(dir=folder, prefix=f".{SETTINGS}.")  # mode 0600; replaced whole, so a job
    with os.fdopen(fd, "w") as f:                                    # starting meanwhile reads old or new
        json.dump({"db": url, "checkpoints": str(checkpoints)}, f)
    os.replace(fresh, path)
    return path


def read_settings(path: str | Path) -> tuple[str, str]:
    """(database URL, checkpoint root) from a settings file ``write_settings`` wrote."""
    data = json.loads(Path(path).read_text())
    return data["db"], data["checkpoints"]


def give_back(store, outcomes: dict) -> list[int]:
    """Queue again, for any worker, the runs a stop of this worker interrupted (``outcomes``:
    run id → ``Outcome``); their ids."""
    stopped = [run_id for run_id, outcome in outcomes.items() if outcome.status == "interrupted"
               and outcome.cause == "signal"]
    return store.queue.requeue(stopped, owner=None) if stopped else []


class SlurmWorker(Checkpointable):
    """A worker job: ``settings`` is the settings file's path, ``folder`` the lab's Slurm folder."""

    def __init__(self, settings: str, folder: str, *, concurrent: int = 1, idle_exit: float = 60.0):
        self.settings, self.folder = settings, folder
        self.concurrent, self.idle_exit = concurrent, idle_exit
        self._manager: Any = None  # the JobManager while the job runs
        self._stopping = False

    def __getstate__(self) -> dict:
        """What the pickle keeps: the request, never the live manager."""
        return {key: value for key, value in self.__dict__.items() if key in ("settings", "folder", "concurrent",
                                                                            "idle_exit")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _manager=None, _stopping=False)

    def __call__(self) -> int:
        """Train queued runs until the queue has been empty ``idle_exit`` seconds; the runs started."""
        from engine.runner.jobs import JobManager
        from storage import RunStore

        url, checkpoints = read_settings(self.settings)
        manager = JobManager(RunStore(url, create=False), max_concurrent=self.concurrent, pull=True,
                             checkpoints=checkpoints)
        self._manager = manager
        self._record(manager.worker_id)
        signal.signal(signal.SIGTERM, self._on_term)  # submitit ignores SIGTERM; scancel means stop
        print(f"worker {manager.worker_id} of Slurm job {_job_id()}: draining the queue", flush=True)
        try:
            while not self._stopping and manager.idle_seconds() < self.idle_exit:
                time.sleep(POLL_S)
        finally:
            self.stop()
        return manager.started_runs

    def _record(self, worker_id: str) -> None:
        folder = Path(self.folder) / "workers"
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / _job_id(), "a") as f:  # one line per start: a requeued job starts again
            f.write(worker_id + "\n")

    def _on_term(self, signum, frame) -> None:
        print(f"{signal.Signals(signum).name}: checkpointing the runs and giving them back to the queue", flush=True)
        self._stopping = True
        if self._manager is not None:
            self._manager.interrupt()

    def stop(self) -> list[int]:
        """Stop the worker once: running runs checkpoint and end interrupted, then go back to
        the queue; the ids given back."""
        manager, self._manager = self._manager, None
        if manager is None:
            return []
        self._stopping = True
        manager.shutdown(cancel_running=False)
        given = give_back(manager.store, manager.outcomes)
        if given:
            print(f"runs {', '.join(map(str, given))} checkpointed and queued again", flush=True)
        return given

    def checkpoint(self, *args, **kwargs) -> DelayedSubmission:
        """submitit's hook before a preemption or time limit: stop as ``scancel`` does, then
        this same worker, to run again when Slurm requeues the job."""
        print("preempted or at the time limit: checkpointing before the job goes", flush=True)
        self.stop()
        return DelayedSubmission(SlurmWorker(self.settings, self.folder, concurrent=self.concurrent,
                                                              idle_exit=self.idle_exit))


def _job_id() -> str:
    return os.environ.get("SLURM_JOB_ID", "unknown")
