"""A short run's fixed cost: how soon its first step starts, and what the whole run costs in CPU.

Runs ``python -m engine run --preset P --steps N`` (default: the paper preset, 10 steps, BASIS
at R = 32, every other field at its default) ``--runs`` times one after the other, each in a
fresh process, all on one lab (a SQLite file the first run creates, as a user's first run
does, and one checkpoints folder) and with the machine's persistent compilation cache
(``engine.training.compile_cache``): the first may compile, the later ones find every program
of the shape compiled and the database made. For each it prints

- ``wall`` and ``cpu``: the process's wall time and CPU seconds (user + system, its children
  included), from its start to its exit;
- ``first step``: seconds from the process's start to its first train step, read as the
  claim (the run's ``started_at``, stored once the process has imported, opened the database
  and claimed the run) plus the step-0 record's ``wall_time`` (the training's own clock: data,
  compiling or loading programs, the memory figures and the step-0 validation), the moment
  the loop begins stepping;
- the run's stored phases (``time/<phase>_s``).

    PYTHONPATH=$PWD python bench/startup.py [--preset paper] [--steps 10] [--rank 32] [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from datetime import timezone
from pathlib import Path

from storage import RunStore

ROOT = Path(__file__).resolve().parents[1]
PHASES = ("setup", "compile", "eval", "train", "checkpoint", "write")


def one_run(url: str, args, seed: int) -> dict:
    """Train one run in a fresh process; its wall, CPU, first-step time and phases."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.time()
    subprocess.run([sys.executable, "-m", "engine", "run", "--db", url, "--preset", args.preset, "--steps",
                    str(args.steps), "--rank", str(args.rank), "--seed", str(seed)], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.time() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    store = RunStore(url, create=False)
    try:
        run = max(store.runs.list_runs(), key=lambda r: r.id)
        claimed = run.started_at.replace(tzinfo=run.started_at.tzinfo or timezone.utc).timestamp()
        rows = store.metrics([run.id])
        step0 = float(rows[rows["step"] == 0]["wall_time"].max())
        finals = {r.name: float(r.value) for r in store.metrics.final_metrics([run.id]).itertuples()}
    finally:
        store.close()
    return {"wall": wall, "cpu": cpu, "first": claimed - start + step0,
            **{p: finals.get(f"time/{p}_s", float("nan")) for p in PHASES}}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="paper")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--rank", type=int, default=32)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args(argv)
    print(f"{args.runs} × `engine run --preset {args.preset} --steps {args.steps} --rank {args.rank}`, one process "
          f"each; load {os.getloadavg()[0]:.2f} ({os.cpu_count()} cores)")
    print(f"{'run':<5}{'wall':>7}{'cpu':>7}{'first step':>12}" + "".join(f"{p:>10}" for p in PHASES) + "   (seconds)")
    with tempfile.TemporaryDirectory(prefix="basis-startup-") as d:
        os.environ["BASIS_LAB_CHECKPOINTS"] = str(Path(d) / "checkpoints")
        for i in range(args.runs):
            _print(i, one_run(f"sqlite:///{Path(d) / 'lab.db'}", args, seed=i))
    print(f"load {os.getloadavg()[0]:.2f} at the end")


def _print(i: int, row: dict) -> None:
    print(f"#{i + 1:<4}{row['wall']:7.1f}{row['cpu']:7.1f}{row['first']:12.1f}"
          + "".join(f"{row[p]:10.2f}" for p in PHASES))


if __name__ == "__main__":
    main()
