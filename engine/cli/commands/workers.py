"""``workers``: the registered workers and what they train; the lab's Slurm jobs beside them;
``--slurm N`` puts N workers on a Slurm cluster, ``--cancel`` takes them back
(``engine.runner.slurm``)."""

from __future__ import annotations

import shutil
import sys

from engine.cli import arguments
from engine.cli.output import table_text


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "workers", parents=[arguments.db_parent()], help="the registered workers and what they train; workers on Slurm",
        description="Without flags: the workers' heartbeats and the lab's Slurm jobs. --slurm N submits N worker jobs "
                    "(through submitit) that drain the queue of a PostgreSQL database and exit; --cancel takes them "
                    "back, their runs checkpointed and queued again.")
    slurm = p.add_argument_group("workers on Slurm")
    slurm.add_argument("--slurm", type=int, metavar="N", help="submit N worker jobs to Slurm")
    slurm.add_argument("--partition", help="the Slurm partition (default: the cluster's default)")
    slurm.add_argument("--gpus", type=int, default=0, help="GPUs per job (default: 0)")
    slurm.add_argument("--cpus", type=int, default=1, help="CPUs per job (default: 1)")
    slurm.add_argument("--mem", type=float, metavar="GB", help="memory per job in GB (default: the partition's)")
    slurm.add_argument("--time", type=int, default=60, metavar="MIN", help="time limit per job in minutes (default: 60)")
    slurm.add_argument("--idle-exit", type=float, default=60.0, metavar="S",
                       help="a job exits after S seconds with nothing to train (default: 60)")
    slurm.add_argument("--slurm-option", action="append", default=[], metavar="KEY=VALUE",
                       help="another sbatch option, e.g. qos=high for --qos=high (repeatable)")
    arguments.add_concurrent(slurm)
    slurm.add_argument("--cancel", nargs="*", metavar="JOB",
                       help="scancel the lab's Slurm jobs (these ids; none given: all of them)")


def run(args) -> int:
    from engine.runner import slurm

    if args.slurm is not None:
        return _submit(args, slurm)
    store = arguments.open_store(args.db, create=False)
    if args.cancel is not None:
        cancelled = slurm.cancel(store, args.cancel or None)
        print(f"cancelled Slurm job(s) {', '.join(cancelled)}: their runs checkpoint and go back to the queue"
              if cancelled else "no Slurm job of this lab to cancel")
        return 0
    _print_workers(store)
    if shutil.which("sbatch") is not None:
        try:
            _print_jobs(slurm.lab_jobs(store))
        except slurm.SlurmError as e:  # a client without a cluster that answers: the workers above still stand
            print(f"no Slurm jobs listed: {e}", file=sys.stderr)
    return 0


def _options(pairs: list[str]) -> dict[str, str]:
    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise arguments.CliError(f"--slurm-option {pair!r} is not KEY=VALUE; write e.g. --slurm-option qos=high")
        options[key.strip().lstrip("-")] = value
    return options


def _submit(args, slurm) -> int:
    request = slurm.SlurmRequest(jobs=args.slurm, partition=args.partition, gpus=args.gpus, cpus=args.cpus,
                                 mem_gb=args.mem, time_min=args.time, concurrent=args.concurrent,
                                 idle_exit=args.idle_exit, options=_options(args.slurm_option))
    request.check()
    slurm.require_slurm()
    slurm.refuse_sqlite(args.db)
    store = arguments.open_store(args.db, create=False)
    ids = slurm.submit(store, request)
    print(f"submitted {len(ids)} worker job(s) to Slurm: {', '.join(ids)}; `python -m engine workers` lists them, "
          "`python -m engine workers --cancel` takes them back")
    return 0


def _print_workers(store) -> None:
    from engine.runner.liveness import worker_states

    frame = worker_states(store.frames.workers_frame())
    if frame.empty:
        print("no workers yet: start one with `python -m engine worker` (or on Slurm: `--slurm N`)")
        return
    cols = ["id", "state", "host", "pid", "device", "concurrent", "current_run_id", "started_at", "heartbeat_at"]
    print(table_text(frame[cols].rename(columns={"current_run_id": "run"})))


def _print_jobs(jobs) -> None:
    if not jobs:
        return
    from engine.runner.slurm import jobs_frame

    print("\nSlurm jobs of this lab:")
    print(table_text(jobs_frame(jobs)))

