"""Workers as Slurm jobs: submit, list and cancel them (``engine workers --slurm``, the
dashboard's workers view). The job side is ``engine.runner.slurm_jobs``.

A request puts ``jobs`` Slurm jobs on the queue through ``submitit`` (no sbatch text is
written here); each runs a worker that claims the database's queued runs, like
``python -m engine worker``, and exits once it has had nothing to train for ``idle_exit``
seconds (the queue is drained) or at its time limit.

Contract:

- Everything is checked before anything is submitted (``SlurmError``: one line naming the
  fix, nothing queued, nothing written): ``sbatch`` on the ``PATH``, the partition among
  ``sinfo``'s, a database that is not SQLite (PostgreSQL: many machines share it) and that
  the jobs can reach (a loopback host or Unix socket only when every node of the partition
  is this machine), and that it answers from here.
- Secrets reach the jobs only through a file: the database URL and the checkpoint root are
  written to ``<folder>/settings.json`` with mode 0600 in the lab's Slurm folder (``folder``:
  ``slurm-jobs/<database uid>`` beside the checkpoint root, which the nodes must share), and
  a job gets that file's path. ``sbatch`` exports every variable with ``BASIS_LAB_DB_URL``
  and ``PGPASSWORD`` set empty (``exported``), so no job's environment holds them.
- A lab's jobs are named ``basis-lab-<first 12 digits of the database uid>``; ``lab_jobs``
  lists those ``squeue`` knows (job id, state, node) with the worker each job registered
  (``<folder>/workers/<job id>``: a line per start of the job, the last one now) and the
  run that worker trains now.
"""

from __future__ import annotations

import contextlib
import io
import ipaddress
import os
import shutil
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from engine.errors import UserError
from engine.runner.jobs import PULL_POLL_S
from engine.runner.paths import checked_root
from engine.runner.slurm_jobs import FailedJobError, SlurmExecutor, SlurmWorker, write_settings
from storage import RunStore, StorageError

JOB_PREFIX = "basis-lab-"
SECRET_VARIABLES = ("BASIS_LAB_DB_URL", "PGPASSWORD")  # never exported to a job (``exported``)
COMMAND_TIMEOUT_S = 60


MIN_IDLE_EXIT_S = 5 * PULL_POLL_S  # a job waits this long at least for a first claim

class SlurmError(UserError, ValueError):
    """Slurm or the request cannot put workers on the cluster; the message names the fix."""


@dataclass(frozen=True)
class SlurmRequest:
    """What to submit: ``jobs`` workers, each a job on ``partition`` (None: the cluster's
    default) with ``gpus`` GPUs, ``cpus`` CPUs, ``mem_gb`` GB (None: the partition's default)
    for at most ``time_min`` minutes, training ``concurrent`` runs at once and exiting after
    ``idle_exit`` seconds with nothing to train; ``options``: more sbatch options,
    ``{"qos": "high"}`` for ``--qos=high``."""

    jobs: int
    partition: str | None = None
    gpus: int = 0
    cpus: int = 1
    mem_gb: float | None = None
    time_min: int = 60
    concurrent: int = 1
    idle_exit: float = 60.0
    options: dict[str, str] = field(default_factory=dict)

    def check(self) -> None:
        for name in ("jobs", "cpus", "time_min", "concurrent"):
            if getattr(self, name) < 1:
                raise SlurmError(f"{name.replace('_', ' ')} must be at least 1 (got {getattr(self, name)})")
        if self.gpus < 0 or (self.mem_gb is not None and self.mem_gb <= 0):
            raise SlurmError("GPUs must be ≥ 0 and the memory > 0; fix the request")
        if "export" in self.options:
            raise SlurmError("the lab sets sbatch's --export itself (the environment without the database's password); "
                             "drop export from the Slurm options")
        if self.idle_exit < MIN_IDLE_EXIT_S:
            raise SlurmError(f"the idle exit must be at least {MIN_IDLE_EXIT_S:g} s (got {self.idle_exit:g}): a job's "
                             "worker looks at the queue once a second, and would leave before its first look")


@dataclass(frozen=True)
class SlurmJob:
    """One of the lab's jobs as ``squeue`` shows it, with the worker it registered (None
    until it starts) and the run that worker trains (None: idle or not started)."""

    job_id: str
    state: str
    node: str
    worker: str | None
    run_id: int | None


def job_name(store: RunStore) -> str:
    """The name of the lab's jobs."""
    return _name(store.identities.identity().uid)


def _name(uid: str) -> str:
    return JOB_PREFIX + uid[:12]


def lab_folder(store: RunStore) -> Path:
    """The lab's Slurm folder: submitit's pickles and logs, the settings file, the workers' ids."""
    return checked_root(store, None).parent / "slurm-jobs" / store.identities.identity().uid


def _run(*cmd: str) -> str:
    """A Slurm command's stdout; its failure as a ``SlurmError`` with its first line."""
    try:
        done = subprocess.run(list(cmd), capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SlurmError(f"`{' '.join(cmd)}` failed ({e}); check that Slurm answers (`sinfo`)") from None
    if done.returncode != 0:
        first = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[0]
        raise SlurmError(f"`{' '.join(cmd)}` failed: {first}; check that Slurm answers (`sinfo`)")
    return done.stdout


def require_slurm() -> None:
    if shutil.which("sbatch") is None:
        raise SlurmError("no Slurm here (`sbatch` is not on the PATH): run this on a login node of the cluster, or "
                         "start workers by hand with `python -m engine worker`")


def partitions() -> list[str]:
    """The cluster's partitions, its default first."""
    names = [line.strip() for line in _run("sinfo", "-h", "-o", "%P").splitlines() if line.strip()]
    return sorted({n.rstrip("*") for n in names}, key=lambda n: (n + "*" not in names, n))


def check_partition(partition: str | None) -> None:
    known = partitions()
    if not known:
        raise SlurmError("Slurm lists no partition (`sinfo`); ask the cluster's admins which to use")
    if partition is not None and partition not in known:
        raise SlurmError(f"no partition {partition!r} on this cluster; use one of {', '.join(known)} (--partition)")


def _is_local(host: str | None) -> bool:
    """Whether ``host`` names this machine only: none or a path (a Unix socket), localhost, a loopback address."""
    if not host or host.startswith("/") or host == "localhost":
        return True
    with contextlib.suppress(ValueError):
        return ipaddress.ip_address(host).is_loopback
    return False


def _nodes_local(partition: str | None) -> bool:
    """Whether every node of ``partition`` is this machine (its address loopback or its own name)."""
    out = _run("sinfo", "-h", "-N", "-o", "%N %o", *(["-p", partition] if partition else []))
    me = {socket.gethostname(), socket.gethostname().split(".")[0], socket.getfqdn()}
    pairs = [line.split() for line in out.splitlines() if line.strip()]
    return bool(pairs) and all(p[0] in me or (len(p) > 1 and (p[1] in me or _is_local(p[1]))) for p in pairs)


def refuse_sqlite(url: str | None) -> None:
    """Refuse a SQLite database (``url`` None: ``$BASIS_LAB_DB_URL`` or the default file)."""
    from storage.db import resolve_url

    if resolve_url(url).startswith("sqlite"):
        raise SlurmError("workers on Slurm need a database many machines share: use PostgreSQL "
                         "(--db postgresql+psycopg://user@host/db, the password in ~/.pgpass), not a SQLite file")


def check_database(store: RunStore, partition: str | None) -> None:
    """Refuse a database the jobs cannot share or reach (see the module's contract)."""
    from sqlalchemy.engine import make_url

    refuse_sqlite(store.url)
    url = make_url(store.url)
    host = url.host or url.query.get("host")
    host = host if isinstance(host, str) or host is None else host[0]
    if _is_local(host) and not _nodes_local(partition):
        raise SlurmError(f"the database's host {host or '(a local socket)'} is this machine only, which the nodes "
                         "cannot reach: give --db the database server's network name or address")
    try:
        store.workers.list_workers()
    except StorageError as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
        raise SlurmError(f"the database does not answer from here ({first}); start it or fix --db") from None


def exported() -> str:
    """sbatch's ``--export``: every variable of the submitter's environment (``ALL``, as sbatch
    does by default) but the ``SECRET_VARIABLES``, set empty, so no job's environment holds
    them (an empty ``PGPASSWORD`` is no password to libpq: a node's ``~/.pgpass`` still
    serves). Named here rather than taken out of ``os.environ`` while sbatch starts: the
    dashboard's other threads read that environment meanwhile."""
    return ",".join(["ALL", *(f"{name}=" for name in SECRET_VARIABLES)])


def _job_url(store: RunStore) -> str:
    """The URL the jobs connect with, for the 0600 settings file: this process's, with the
    password that ``PGPASSWORD`` gives it here when the URL has none (the jobs never see the
    variable; ``~/.pgpass``, read on the nodes, needs nothing)."""
    url = store.engine.url
    if url.password is None and url.get_backend_name() == "postgresql" and os.environ.get("PGPASSWORD"):
        url = url.set(password=os.environ["PGPASSWORD"])
    return url.render_as_string(hide_password=False)


def submit(store: RunStore, request: SlurmRequest) -> list[str]:
    """Check everything, then submit ``request.jobs`` worker jobs; their Slurm job ids."""
    request.check()
    require_slurm()
    check_partition(request.partition)
    check_database(store, request.partition)
    folder = lab_folder(store)
    settings = write_settings(folder, _job_url(store), checked_root(store, None))
    executor = SlurmExecutor(folder=folder / "%j", max_num_timeout=3)
    params: dict = dict(job_name=job_name(store), time=request.time_min, cpus_per_task=request.cpus,
                        additional_parameters=dict(request.options, export=exported()))
    if request.partition:
        params["partition"] = request.partition
    if request.gpus:
        params["gpus_per_node"] = request.gpus
    if request.mem_gb is not None:
        params["mem"] = f"{request.mem_gb:g}GB"
    executor.update_parameters(**params)
    worker = SlurmWorker(str(settings), str(folder), concurrent=request.concurrent, idle_exit=request.idle_exit)
    ids: list[str] = []
    with own_stderr_kept():  # submitit prints sbatch's refusal too, which the SlurmError says in one line
        try:
            for _ in range(request.jobs):
                ids.append(executor.submit(worker).job_id)
        except FailedJobError as e:  # sbatch refused a job: an option, a limit, the account
            first = (str(e).strip().splitlines() or ["no reason given"])[0][:200]
            more = f"; jobs {', '.join(ids)} went in before it (`--cancel` takes them back)" if ids else ""
            raise SlurmError(f"Slurm's sbatch refused the job ({first}): fix the Slurm flags{more}") from None
    return ids


class _ThreadStderr:
    """``sys.stderr`` while one thread's output to it is kept back (``own_stderr_kept``): while
    ``active``, that thread's writes go to ``kept``; every other write goes on to the stream it
    stands in for, which answers everything else (``flush``, ``isatty``, ``encoding``,
    ``fileno``). Once inactive it only passes writes through, so a reference kept meanwhile
    (a handler made during the block, a wrapper installed over it) loses nothing later."""

    def __init__(self, stream, thread: int):
        self.stream, self.thread, self.kept, self.active = stream, thread, io.StringIO(), True

    def write(self, text: str) -> int:
        keep = self.active and threading.get_ident() == self.thread
        return (self.kept if keep else self.stream).write(text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str):
        return getattr(self.stream, name)


_STDERR_SWAP = threading.Lock()


@contextlib.contextmanager
def own_stderr_kept() -> Iterator[io.StringIO]:
    """Keep what this thread writes to ``sys.stderr`` in the block (yielded) out of the real
    stream, while the other threads' writes (the dashboard's, a foreground run's) still reach
    it: ``contextlib.redirect_stderr`` would swallow theirs too. Blocks of two threads take
    turns. The stream is put back only if it is still this block's stand-in: one installed
    over it meanwhile (a run's console, ``engine.runner.console``) stays, and the stand-in
    beneath it then passes everything through."""
    if sys.stderr is None:  # no stream (pythonw): nothing to keep back, nothing to swap
        yield io.StringIO()
        return
    with _STDERR_SWAP:
        proxy = _ThreadStderr(sys.stderr, threading.get_ident())
        sys.stderr = proxy
        try:
            yield proxy.kept
        finally:
            proxy.active = False
            if sys.stderr is proxy:
                sys.stderr = proxy.stream


def lab_jobs(store: RunStore) -> list[SlurmJob]:
    """The lab's jobs that Slurm still knows, oldest first, each with its worker and run."""
    require_slurm()
    known = store.identities.read()  # a read writes nothing: a database without an identity never submitted
    if known is None:
        return []
    out = _run("squeue", "-h", "--me", "--name", _name(known.uid), "-o", "%i|%T|%N")  # this user's: scancel can take them
    if not out.strip():
        return []
    workers = {w.id: w for w in store.workers.list_workers()}
    folder = lab_folder(store) / "workers"
    jobs = []
    for line in out.splitlines():
        if not line.strip():
            continue
        job_id, state, node = (line.split("|") + ["", ""])[:3]
        found = folder / job_id
        worker = found.read_text().split()[-1] if found.is_file() and found.read_text().strip() else None
        record = workers.get(worker) if worker else None
        run_id = record.current_run_id if record is not None and record.status == "active" else None
        jobs.append(SlurmJob(job_id, state, node or "-", worker, run_id))
    return sorted(jobs, key=lambda j: [int(p) if p.isdigit() else 0 for p in j.job_id.split("_")])


def jobs_frame(jobs: list[SlurmJob]):
    """The jobs as the CLI prints them and the workers view shows them: job, state, node,
    worker and run, missing values as NA (a pending job has no node, worker or run yet)."""
    import pandas as pd

    frame = pd.DataFrame({"job": [j.job_id for j in jobs], "state": [j.state.lower() for j in jobs],
                          "node": [None if j.node == "-" else j.node for j in jobs],
                          "worker": [j.worker for j in jobs]}, dtype="string")
    return frame.assign(run=pd.array([j.run_id for j in jobs], dtype="Int64"))


def cancel(store: RunStore, job_ids: list[str] | None = None) -> list[str]:
    """``scancel`` the lab's jobs (``job_ids`` of them; None: all); the ids cancelled. Each
    running worker gets SIGTERM: its runs checkpoint, end interrupted and go back to the queue."""
    mine = [job.job_id for job in lab_jobs(store)]
    chosen = mine if job_ids is None else [j for j in job_ids if j in mine]
    unknown = sorted(set(job_ids or ()) - set(mine))
    if unknown:
        raise SlurmError(f"no job {', '.join(unknown)} of this lab on Slurm; `python -m engine workers` lists them")
    if chosen:
        _run("scancel", *chosen)
    return chosen
