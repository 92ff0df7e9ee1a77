"""What a user waits for: a small grid trained end to end by the real runner, and where its time went.

Queues the grid (``--preset`` × ``--ranks``, each ``exact`` or a BASIS rank R, × ``--seeds``,
``--steps`` steps each, every other field at the run defaults) in a fresh SQLite database with
``queue_runs``, starts ``--workers`` ``python -m engine worker`` processes (``--concurrent``
runs at a time each; they claim, train, evaluate, checkpoint and store the runs as any worker
does) and waits until every run has ended. Then it reads from the database, for each run:

- ``wall``: its claim to its stored end (``started_at`` → ``finished_at``);
- the phases its training stored at its last step (``time/<phase>_s``: ``engine.training.phases``):
  ``train`` (the train steps), ``compile`` (tracing, lowering, compiling or loading from the
  persistent compilation cache, and the memory figures' listing), ``eval`` (validation and
  test passes), ``probe`` (dW probes), ``ckpt`` (checkpoints), ``write`` (the loop waiting
  while the runner queues its records for the database) and ``setup`` (tokens, parameters);
- ``idle``: the rest of its wall time (its claim, checkpoint folders and end writes, the
  loop's bookkeeping), so the columns add up to ``wall``;
- ``share``: ``train`` ÷ ``wall``, the training share.

The total row sums the runs; below it, the sweep's wall time (the workers' start to the last
run's end), the worker-slot time outside any run (``workers × concurrent × sweep wall − Σ
run wall``: process start, imports, waiting for a claim), the training share of all slot time
and runs per hour. ``--cache`` picks the persistent compilation cache the workers use
(``engine.training.compile_cache``): ``default`` (the machine's, warm from earlier runs),
``fresh`` (an empty one) or ``off``; run ``off`` and ``default`` back to back for a before and
after. ``--cohorts on|off`` makes the workers train a setup's seeds (and a campaign's trials of one method) as one program or each
alone (``engine.runner.cohorts``; default ``auto``: on a GPU only); run both for the side-by-side
table (with cohorts a slot trains several runs at once, so the slot time outside runs can read
negative). The 1-minute load average is printed at the start and the end: on a shared machine the
seconds drift with it, the shares much less.

    PYTHONPATH=$PWD python bench/sweep.py [--preset paper] [--ranks exact,32] [--steps 1000]
        [--seeds 0] [--workers 1] [--concurrent 1] [--cache default|fresh|off] [--cohorts auto|on|off] [--quick]

``--quick`` is a smoke run of 50 steps.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from engine.config import RunConfig
from engine.config.sweep import parse_seeds
from engine.runner import jobs
from engine.runner.cohorts import ENV as COHORTS_ENV
from engine.runner.cohorts import SETTINGS
from engine.training.phases import OTHER, metric
from storage import RunStore

ROOT = Path(__file__).resolve().parents[1]
PHASES = ("train", "compile", "eval", "probe", "checkpoint", "write", "setup")
HEADS = {"checkpoint": "ckpt"}
IDLE_EXIT_S = 2.0


def grid(preset: str, ranks: list[str], steps: int, seeds: list[int]) -> list[RunConfig]:
    """The runs of the sweep: each seed × each rank (``exact``, or a BASIS rank), in that order."""
    out = []
    for seed in seeds:
        for rank in ranks:
            method = dict(estimator="exact") if rank == "exact" else dict(estimator="basis", rank=int(rank))
            out.append(RunConfig(preset=preset, steps=steps, seed=seed, **method))
    return out


def worker_env(tmp: Path, cache: str, cohorts: str = "auto") -> dict[str, str]:
    """The workers' environment: checkpoints in ``tmp``, the compilation cache ``cache`` asks for
    and the ``cohorts`` setting (``engine.runner.cohorts``)."""
    env = {**os.environ, "BASIS_LAB_CHECKPOINTS": str(tmp / "checkpoints"), COHORTS_ENV: cohorts,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    if cache != "default":
        env.pop("JAX_COMPILATION_CACHE_DIR", None)
        env["BASIS_LAB_COMPILE_CACHE"] = "off" if cache == "off" else str(tmp / "xla")
    return env


def train(url: str, tmp: Path, workers: int, concurrent: int, cache: str, cohorts: str = "auto") -> float:
    """Start the workers on the queued runs and wait for them to exit; the time they started
    (``time.time``'s clock)."""
    logs = [open(tmp / f"worker-{i}.log", "w") for i in range(workers)]
    start = time.time()
    procs = [subprocess.Popen([sys.executable, "-m", "engine", "worker", "--db", url, "--concurrent", str(concurrent),
                               "--idle-exit", str(IDLE_EXIT_S)], cwd=ROOT, env=worker_env(tmp, cache, cohorts),
                              stdout=log, stderr=subprocess.STDOUT) for log in logs]
    for p, log in zip(procs, logs):
        p.wait()
        log.close()
    failed = [i for i, p in enumerate(procs) if p.returncode]
    if failed:
        tail = (tmp / f"worker-{failed[0]}.log").read_text()[-3000:]
        raise SystemExit(f"worker {failed[0]} exited with {procs[failed[0]].returncode}:\n{tail}")
    return start


def epoch_s(when: datetime) -> float:
    """A stored time (UTC; SQLite gives it back without its zone) in seconds since the epoch."""
    return (when if when.tzinfo else when.replace(tzinfo=timezone.utc)).timestamp()


def rows_of(store: RunStore, run_ids: list[int]) -> list[dict]:
    """One row per run: its name, wall, phases, idle and training share (see the module docstring)."""
    finals = store.metrics.final_metrics(run_ids, names=[metric(p) for p in PHASES] + [OTHER])
    values = {(int(r.run_id), r.name): float(r.value) for r in finals.itertuples()}
    rows = []
    for run_id in run_ids:
        run = store.runs.get_run(run_id)
        if run.status != "finished" or run.started_at is None or run.finished_at is None:
            raise SystemExit(f"run {run_id} ended {run.status}: {run.error}")
        row = {"run": f"#{run_id} {run.name}", "wall": (run.finished_at - run.started_at).total_seconds(),
               "started": run.started_at, "finished": run.finished_at}
        row.update({p: values.get((run_id, metric(p)), float("nan")) for p in PHASES})
        row["idle"] = row["wall"] - sum(row[p] for p in PHASES)
        row["share"] = row["train"] / row["wall"]
        rows.append(row)
    return rows


def table(rows: list[dict]) -> list[str]:
    """The per-run table and its total row, as printed."""
    cols = ("wall",) + PHASES + ("idle",)
    head = f"{'run':<24}" + "".join(f"{HEADS.get(c, c):>9}" for c in cols) + f"{'share':>8}"
    lines = [head + "   (seconds; share = train ÷ wall)"]
    for row in rows:
        lines.append(f"{row['run'][:24]:<24}" + "".join(f"{row[c]:9.1f}" for c in cols) + f"{row['share']:8.1%}")
    total = {c: sum(r[c] for r in rows) for c in cols}
    lines.append(f"{f'total ({len(rows)} runs)':<24}" + "".join(f"{total[c]:9.1f}" for c in cols)
                 + f"{total['train'] / total['wall']:8.1%}")
    return lines


def summary(rows: list[dict], sweep_s: float, slots: int, workers: int, concurrent: int) -> list[str]:
    """The sweep's lines below the table: its wall time, slot time outside runs, shares, runs per hour."""
    in_runs = sum(r["wall"] for r in rows)
    outside = slots * sweep_s - in_runs
    train = sum(r["train"] for r in rows)
    return [f"sweep: {len(rows)} runs in {sweep_s:.1f} s by {workers} worker process(es) × {concurrent} at a time "
            f"({os.cpu_count()} cores): {3600 * len(rows) / sweep_s:.1f} runs/hour",
            f"  worker-slot time {slots * sweep_s:.1f} s: in runs {in_runs:.1f} s, outside runs {outside:.1f} s "
            f"(process start, imports, claims); training share of it {train / (slots * sweep_s):.1%}"]


def validation_lines(store: RunStore, run_ids: list[int]) -> list[str]:
    """The validation rule's cost in noise, per run: the standard error of ``val_loss`` at its
    interim evals (median over steps 1..last−1; step 0 is untrained) beside the last step's,
    which evaluates every batch (``engine.config.RunConfig.effective_interim_val_batches``)."""
    frame = store.metrics.metrics_after({i: 0 for i in run_ids}, names=["val_loss_se"])
    lines = ["validation (the interim evals' batches and val_loss SE, median over steps > 0; the last step's):"]
    for run_id in run_ids:
        rows = frame[frame["run_id"] == run_id].sort_values("step")
        last = int(rows["step"].max())
        between = rows[(rows["step"] > 0) & (rows["step"] < last)]["value"]
        final = float(rows[rows["step"] == last]["value"].iloc[0])
        config = RunConfig.from_dict(store.runs.get_run(run_id).config)
        interim, full = config.effective_interim_val_batches, config.effective_val_batches
        lines.append(f"  #{run_id}: interim {interim} batches, SE {between.median():.4f}; last step {full} batches, "
                     f"SE {final:.4f} ({between.median() / final:.2f}×)")
    return lines


def run(args) -> list[dict]:
    """Queue the grid, train it with the workers, print the table; the rows."""
    configs = grid(args.preset, args.ranks, args.steps, args.seeds)
    with tempfile.TemporaryDirectory(prefix="basis-sweep-") as d:
        tmp = Path(d)
        url = f"sqlite:///{tmp / 'sweep.db'}"
        store = RunStore(url)
        ids = jobs.queue_runs(store, configs)
        print(f"{len(ids)} runs ({args.preset}, {','.join(args.ranks)} × seeds {','.join(map(str, args.seeds))}, "
              f"{args.steps} steps), compilation cache: {args.cache}, cohorts: {args.cohorts}; "
              f"load {os.getloadavg()[0]:.2f}", flush=True)
        start = train(url, tmp, args.workers, args.concurrent, args.cache, args.cohorts)
        rows = rows_of(store, ids)
        noise = validation_lines(store, ids)
        sweep_s = max(epoch_s(r["finished"]) for r in rows) - start  # the workers' start to the last run's end
        store.engine.dispose()
    lines = table(rows) + summary(rows, sweep_s, args.workers * args.concurrent, args.workers, args.concurrent) + noise
    for line in lines:
        print(line)
    print(f"load {os.getloadavg()[0]:.2f} at the end", flush=True)
    return rows


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="paper")
    ap.add_argument("--ranks", default="exact,32", help="comma list: exact or BASIS ranks (default: exact,32)")
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--seeds", default="0", help="seeds, as the CLI takes them: 0,1,2 or 0-15 (default: 0)")
    ap.add_argument("--workers", type=int, default=1, help="worker processes (default: 1)")
    ap.add_argument("--concurrent", type=int, default=1, help="runs each worker trains at once (default: 1)")
    ap.add_argument("--cache", choices=("default", "fresh", "off"), default="default",
                    help="the workers' persistent compilation cache (default: the machine's)")
    ap.add_argument("--cohorts", choices=SETTINGS, default="auto",
                    help="train a setup's seeds (and learning rates) as one program: on, off, or auto (on a GPU only; default)")
    ap.add_argument("--quick", action="store_true", help="a smoke run: 50 steps")
    args = ap.parse_args(argv)
    args.ranks = [r.strip() for r in args.ranks.split(",") if r.strip()]
    args.seeds = parse_seeds(args.seeds)
    if args.quick:
        args.steps = 50
    if args.workers < 1 or args.concurrent < 1 or args.steps < 1 or not args.ranks or not args.seeds:
        ap.error("--workers, --concurrent and --steps are at least 1; --ranks and --seeds name at least one")
    return args


def main(argv: list[str] | None = None) -> list[dict]:
    return run(parse(argv))


if __name__ == "__main__":
    main()
