"""Workers sharing one database: throughput, claim latency and dashboard refresh time.

Prints, each measured in this process against a baseline measured here too:

1. wall time of 8 tiny-preset runs trained by 1 worker process and by 2, and the ratio;
2. claim latency: one ``QueueRepository.queue.claim_next`` transaction (queued → running), median of
   ``--claims`` claims, on SQLite and on a throwaway PostgreSQL server; and queued →
   running as an idle ``engine worker`` sees it (its poll period included);
3. the dashboard's refresh (``runs_frame`` plus a ``MetricsFeed`` poll of 8 runs) while
   4 writer threads add metrics as workers do, against the same refresh with none.

    python bench/fleet.py [--runs 8] [--steps 60] [--claims 50]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from engine.config import RunConfig
from engine.runner import jobs
from storage import MetricsFeed, RunStore
from tests.support.postgres import ThrowawayPostgres

ROOT = Path(__file__).resolve().parents[1]


def _workers(url: str, ckpt: Path, n: int) -> float:
    """Seconds until ``n`` worker processes have trained every queued run and exited."""
    env = {**os.environ, "BASIS_LAB_CHECKPOINTS": str(ckpt)}
    start = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-m", "engine", "worker", "--db", url, "--idle-exit", "3"],
                              cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for _ in range(n)]
    for p in procs:
        p.wait()
    return time.perf_counter() - start - 3.0  # less the idle wait before exiting


def throughput(tmp: Path, runs: int, steps: int) -> None:
    config = RunConfig(preset="tiny", steps=steps, eval_interval=max(steps // 3, 1), probe_interval=0, val_batches=2)
    times = {}
    for n in (1, 2):
        url = f"sqlite:///{tmp / f'fleet-{n}.db'}"
        store = RunStore(url)
        jobs.queue_runs(store, [config.replace(seed=s) for s in range(runs)])
        times[n] = _workers(url, tmp / f"ckpt-{n}", n)
        assert all(r.status == "finished" for r in store.runs.list_runs()), "a run did not finish"
    print(f"\n{runs} tiny runs of {steps} steps, wall time (s), worker processes on this machine ({os.cpu_count()} cores)")
    print(f"  1 worker : {times[1]:8.1f}")
    print(f"  2 workers: {times[2]:8.1f}   speed-up {times[1] / times[2]:.2f}x")


def claim_latency(url: str, label: str, claims: int) -> float:
    store = RunStore(url)
    for i in range(claims):
        store.runs.create_run(name=f"q{i}", config={}, estimator="basis", rank=4, lam=0.0, seed=i, preset="tiny", steps=1)
    seconds = []
    for _ in range(claims):
        t0 = time.perf_counter()
        assert store.queue.claim_next("bench:1", "bench") is not None
        seconds.append(time.perf_counter() - t0)
    median = statistics.median(seconds)
    print(f"  {label:10s} claim_next: median {1000 * median:6.2f} ms, p90 {1000 * sorted(seconds)[int(0.9 * len(seconds))]:6.2f} ms")
    return median


def queued_to_running(url: str, tmp: Path) -> None:
    store = RunStore(url)
    env = {**os.environ, "BASIS_LAB_CHECKPOINTS": str(tmp / "ckpt-latency")}
    worker = subprocess.Popen([sys.executable, "-m", "engine", "worker", "--db", url], cwd=ROOT, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(15)  # the worker is up and polling
        waits = []
        for i in range(5):
            run_id = jobs.queue_runs(store, [RunConfig(preset="tiny", steps=1, eval_interval=1, probe_interval=0,
                                                       val_batches=1, seed=i)])[0]
            t0 = time.perf_counter()
            while store.runs.get_run(run_id).status == "queued":
                time.sleep(0.01)
            waits.append(time.perf_counter() - t0)
            while store.runs.get_run(run_id).status == "running":
                time.sleep(0.05)
        print(f"  queued → running with an idle worker (poll every {jobs.PULL_POLL_S:g} s): "
              f"median {statistics.median(waits):.2f} s over {len(waits)} runs")
    finally:
        worker.terminate()
        worker.wait()


def refresh(url: str, label: str, writers: int, seconds: float = 6.0) -> float:
    store = RunStore(url)
    ids = [store.runs.create_run(name=f"r{i}", config={}, estimator="basis", rank=4, lam=0.0, seed=i, preset="tiny",
                            steps=10**6, status="running") for i in range(8)]
    stop = threading.Event()

    def write(run_id: int) -> None:
        w = RunStore(url)
        step = 0
        while not stop.is_set():
            step += 1
            w.metrics.add_metrics(run_id, [(step, 0.1 * step, name, 1.0) for name in ("train_loss", "val_loss", "cos_mean")])
            w.runs.heartbeat(run_id, step)
            time.sleep(0.02)

    threads = [threading.Thread(target=write, args=(ids[i],), daemon=True) for i in range(writers)]
    for t in threads:
        t.start()
    feed, times = MetricsFeed(), []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        t0 = time.perf_counter()
        store.frames.runs_frame()
        feed.poll(store, ids)
        times.append(time.perf_counter() - t0)
        time.sleep(0.1)
    stop.set()
    for t in threads:
        t.join()
    median = statistics.median(times[1:])
    print(f"  {label:10s} {writers} writers: refresh median {1000 * median:7.2f} ms ({len(times)} refreshes, "
          f"{len(feed.frame):,} metric rows read)")
    return median


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--claims", type=int, default=50)
    ap.add_argument("--skip-throughput", action="store_true")
    args = ap.parse_args()
    pg = ThrowawayPostgres()
    if pg.skip_reason:
        print(f"PostgreSQL rows skipped: {pg.skip_reason}")
    try:
        with tempfile.TemporaryDirectory() as d:
            tmp = Path(d)
            if not args.skip_throughput:
                throughput(tmp, args.runs, args.steps)
            print("\nclaim latency (queued → running, one transaction)")
            backends = {"SQLite": f"sqlite:///{tmp / 'claims.db'}"}
            if not pg.skip_reason:
                backends["PostgreSQL"] = pg.new_database()[1]
            medians = {label: claim_latency(url, label, args.claims) for label, url in backends.items()}
            if "PostgreSQL" in medians:
                print(f"  PostgreSQL / SQLite: {medians['PostgreSQL'] / medians['SQLite']:.2f}x")
            queued_to_running(f"sqlite:///{tmp / 'latency.db'}", tmp)
            print("\ndashboard refresh (runs table + incremental metrics of 8 runs)")
            for label, make in (("SQLite", lambda n: f"sqlite:///{tmp / f'refresh-{n}.db'}"),
                                ("PostgreSQL", (lambda n: pg.new_database()[1]) if not pg.skip_reason else None)):
                if make is None:
                    continue
                idle = refresh(make(0), label, writers=0)
                busy = refresh(make(4), label, writers=4)
                print(f"  {label}: with 4 writers / without: {busy / idle:.2f}x")
    finally:
        pg.stop()


if __name__ == "__main__":
    main()
