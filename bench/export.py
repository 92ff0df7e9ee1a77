"""Exports at scale: ``engine export`` (long and wide) and ``Lab().metrics()``, wall time and peak memory.

Writes ``--runs`` runs (distinct setups: each its own learning rate) of ``--rows`` metric
rows each through the store (``RunsRepository.runs.create_runs``, then one ``add_metrics`` per run: 24
metrics a record, as a probed run records them, every 10 steps), then measures, each in a
fresh child process so its peak is its own:

- ``engine export`` to a file, ``--format long`` and ``--format wide`` (the CLI, a subprocess);
- ``Lab().metrics_chunks()`` iterated to the end (the chunked reader; the rows only counted);
- ``Lab().metrics()`` (the whole frame: its size is the table's, so its peak is too).

Peak memory is the child's maximum resident set size (``resource.getrusage(RUSAGE_CHILDREN)
.ru_maxrss`` read by a wrapper process that runs nothing else). ``--before REV`` runs the
same commands on the code of git revision ``REV`` too (``git archive`` of ``engine`` and
``storage`` into a temporary directory), on the same runs and rows written by that code
(a database of its own schema), so before and after are measured side by side, and each
file's SHA-256 shows whether both wrote the same bytes. No assertions: the numbers are printed.

    python bench/export.py [--runs 2000] [--rows 2400] [--before HEAD] [--db PATH] [--skip-whole]

``--db PATH`` keeps the database there and reuses it when it already holds the runs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path

from tabulate import tabulate

from engine.config import RunConfig
from storage import RunStore

ROOT = Path(__file__).resolve().parents[1]
MIB = 2**20
LAYERS = [f"block_{b}/{part}" for b in range(4) for part in ("mlp/fc", "mlp/proj")]
NAMES = ["train_loss", "val_loss", "tokens_per_s", "cos_mean", "rel_err_mean", *(f"cos/{n}" for n in LAYERS),
         *(f"rel_err/{n}" for n in LAYERS), "sys/cpu_percent", "sys/rss_mib", "sys/load1"]  # 24 a record
RUN_BATCH = 500  # runs per create_runs transaction
WRAPPER = """import json, resource, subprocess, sys, time
start = time.perf_counter()
done = subprocess.run(sys.argv[2:], cwd=sys.argv[1], stdout=subprocess.PIPE)
wall = time.perf_counter() - start
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # KiB on Linux
print(json.dumps({"rc": done.returncode, "wall_s": wall, "peak_bytes": peak, "out": done.stdout.decode()[-300:]}))
"""
CHUNKED = "from engine.api import Lab; print(sum(len(p) for p in Lab(sys.argv[1]).metrics_chunks()), 'rows')"
WHOLE = "from engine.api import Lab; print(len(Lab(sys.argv[1]).metrics()), 'rows')"


def config(i: int) -> RunConfig:
    """Run ``i``'s setup: estimators and ranks in turn, and a learning rate of its own."""
    estimator, rank = [("exact", 8), ("basis", 8), ("basis", 32), ("countsketch", 8)][i % 4]
    return RunConfig(preset="tiny", steps=10_000, estimator=estimator, rank=rank, seed=i % 3, lr=1e-3 * (1 + i / 1000))


def rows_of(i: int, rows: int) -> list[tuple[int, float, str, float]]:
    """``rows`` metric rows of run ``i``: records of the 24 ``NAMES`` every 10 steps."""
    out = []
    for k in range(rows):
        step = 10 * (k // len(NAMES))
        out.append((step, 0.05 * step + 0.001 * i, NAMES[k % len(NAMES)], 1.0 / (1 + step) + 1e-6 * i + 1e-9 * k))
    return out


def write(url: str, runs: int, rows: int) -> float:
    """Write the runs and their metrics through the store; the seconds it took."""
    start = time.perf_counter()
    store = RunStore(url)
    for first in range(0, runs, RUN_BATCH):
        specs = []
        for i in range(first, min(first + RUN_BATCH, runs)):
            c = config(i)
            specs.append(dict(name=c.label(), config=c.to_dict(), estimator=c.estimator,
                              rank=None if c.is_exact else c.rank, lam=c.lam, seed=c.seed, preset=c.preset,
                              steps=c.steps, status="finished", sweep_id="bench-export"))
        for i, run_id in zip(range(first, first + len(specs)), store.runs.create_runs(specs)):
            store.metrics.add_metrics(run_id, rows_of(i, rows))
    store.close()
    return time.perf_counter() - start


def held(url: str) -> tuple[int, int]:
    """(runs, metric rows) the database holds."""
    store = RunStore(url)
    with store.db.session() as s:
        runs = s.connection().exec_driver_sql("SELECT count(*) FROM runs").scalar_one()
        metrics = s.connection().exec_driver_sql("SELECT count(*) FROM metrics").scalar_one()
    store.close()
    return int(runs), int(metrics)


def measure(cwd: Path, command: list[str]) -> dict:
    """Run ``command`` in ``cwd`` under a wrapper process: its wall time and peak RSS."""
    done = subprocess.run([sys.executable, "-c", WRAPPER, str(cwd), *command], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"measuring {' '.join(command)} failed:\n{done.stderr}")
    result = json.loads(done.stdout)
    if result["rc"]:
        raise SystemExit(f"{' '.join(command)} exited {result['rc']}")
    return result


def checkout(rev: str, into: Path) -> Path:
    """``engine`` and ``storage`` of git revision ``rev`` under ``into``."""
    archive = subprocess.run(["git", "archive", rev, "engine", "storage"], cwd=ROOT, capture_output=True,
                             check=True).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


def cases(url: str, out: Path, skip_whole: bool) -> list[tuple[str, list[str], Path | None]]:
    """(what, command, file it writes) of each measurement."""
    py = sys.executable
    rows = [(f"engine export --format {fmt}",
             [py, "-m", "engine", "export", "--db", url, "--out", str(out / f"{fmt}.csv"), "--format", fmt, "--force"],
             out / f"{fmt}.csv") for fmt in ("long", "wide")]
    rows.append(("Lab().metrics_chunks()", [py, "-c", "import sys; " + CHUNKED, url], None))
    if not skip_whole:
        rows.append(("Lab().metrics() (whole frame)", [py, "-c", "import sys; " + WHOLE, url], None))
    return rows


def before_database(rev: str, tmp: Path, runs: int, rows: int) -> tuple[Path, str]:
    """Revision ``rev``'s code and a database it wrote (its own schema) of the same runs and rows."""
    tree = checkout(rev, tmp / "before")
    url = f"sqlite:///{tmp / 'before.db'}"
    subprocess.run([sys.executable, __file__, "--write-only", url, "--runs", str(runs), "--rows", str(rows)],
                   env={**os.environ, "PYTHONPATH": str(tree)}, check=True)
    return tree, url


def run_cases(trees: dict[str, tuple[Path, str]], tmp: Path, skip_whole: bool) -> list[list]:
    """The table: each case measured on each code (label → (tree, database url))."""
    table = []
    for i, (what, _, path) in enumerate(cases("", tmp, skip_whole)):
        for label, (tree, url) in trees.items():
            if "metrics_chunks" in what and tree is not ROOT:
                continue  # the chunked reader is new
            command = cases(url, tmp, skip_whole)[i][1]
            result = measure(tree, command)
            size = result["out"].strip() if path is None else f"{path.stat().st_size / MIB:,.0f} MiB, sha256 {digest(path)}"
            table.append([what, label, f"{result['wall_s']:.1f}", f"{result['peak_bytes'] / MIB:,.0f}", size])
    return table


def digest(path: Path) -> str:
    """The first 12 hex digits of the file's SHA-256 (before and after write the same bytes)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(MIB):
            h.update(block)
    return h.hexdigest()[:12]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=2000)
    ap.add_argument("--rows", type=int, default=2400, help="metric rows per run")
    ap.add_argument("--before", metavar="REV", help="also measure git revision REV's code (e.g. HEAD)")
    ap.add_argument("--db", type=Path, help="SQLite file to keep (reused when it holds --runs × --rows)")
    ap.add_argument("--skip-whole", action="store_true", help="leave out Lab().metrics()'s whole frame")
    ap.add_argument("--write-only", metavar="URL", help=argparse.SUPPRESS)  # --before's writer, on that code
    args = ap.parse_args()
    if args.write_only:
        write(args.write_only, args.runs, args.rows)
        return
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        path = args.db or tmp / "bench.db"
        url = f"sqlite:///{path.resolve()}"
        if path.exists() and held(url) == (args.runs, args.runs * args.rows):
            print(f"reusing {path}: {args.runs:,} runs × {args.rows:,} rows")
        else:
            path.unlink(missing_ok=True)
            seconds = write(url, args.runs, args.rows)
            print(f"wrote {args.runs:,} runs × {args.rows:,} metric rows through the store in {seconds:.0f} s "
                  f"({os.path.getsize(path) / MIB:,.0f} MiB database)")
        trees = {"after": (ROOT, url)}
        if args.before:
            trees = {f"before ({args.before})": before_database(args.before, tmp, args.runs, args.rows), **trees}
        table = run_cases(trees, tmp, args.skip_whole)
    print(tabulate(table, headers=["what", "code", "wall s", "peak MiB", "output"], tablefmt="github"))


if __name__ == "__main__":
    main()
