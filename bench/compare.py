"""Compare over many runs of distinct setups: the seconds its first render and a rerun take.

Writes ``--runs`` finished runs through the store (``tests.support.setups``: each run its
own setup, a few metrics each, all in one sweep, which Compare opens on by default), then
renders the Compare page under Streamlit's AppTest in this process: once in a fresh
session (what a reader who opens the page waits for), then a rerun of the same session
(what a control that changes nothing read costs), each in wall and CPU seconds (on a shared
machine the CPU seconds compare better), and the peak memory. ``--profile N`` prints the N functions
with the most cumulative time of the first render (cProfile). No assertions: the numbers
are printed.

    PYTHONPATH=$PWD python bench/compare.py [--runs 300] [--db PATH] [--profile 30]

``--db PATH`` keeps the database there and reuses it when it already holds the runs.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import resource
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _database(path: Path, runs: int) -> str:
    """The database at ``path`` with ``runs`` runs of distinct setups (written unless it holds them)."""
    from storage import RunStore
    from tests.support.setups import write_setups

    url = f"sqlite:///{path}"
    store = RunStore(url)
    try:
        held = len(store.runs.list_runs())
        if held == 0:
            start = time.perf_counter()
            write_setups(store, runs)
            print(f"wrote {runs} runs in {time.perf_counter() - start:.1f} s")
        elif held != runs:
            raise SystemExit(f"{path} holds {held} runs, not {runs}: give another --db")
    finally:
        store.close()
    return url


def _profiled() -> cProfile.Profile:
    """A profiler of the next script run: the page runs in a thread of its own, which the
    script runner's ``_run_script`` is the whole of."""
    from streamlit.runtime.scriptrunner.script_runner import ScriptRunner

    profiler, run = cProfile.Profile(), ScriptRunner._run_script

    def profiled(self, rerun_data):
        ScriptRunner._run_script = run  # once
        profiler.runcall(run, self, rerun_data)

    ScriptRunner._run_script = profiled
    return profiler


def _render(profile: int) -> None:
    """The Compare page, first in a fresh session then rerun; the seconds of each printed."""
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(ROOT / "app" / "main.py"), default_timeout=1800)
    at.run()
    profiler = _profiled() if profile else None
    start, cpu = time.perf_counter(), time.process_time()
    at.switch_page("views/compare.py").run()
    first, first_cpu = time.perf_counter() - start, time.process_time() - cpu
    if at.exception:
        raise SystemExit(f"Compare failed: {[e.value for e in at.exception]}")
    start, cpu = time.perf_counter(), time.process_time()
    at.run()
    rerun, rerun_cpu = time.perf_counter() - start, time.process_time() - cpu
    tables = [len(d.value) for d in at.dataframe]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"Compare: first render {first:.1f} s ({first_cpu:.1f} s CPU), rerun {rerun:.1f} s ({rerun_cpu:.1f} s CPU); "
          f"tables of {tables} rows; peak RSS {peak:.0f} MiB")
    if profiler:
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(profile)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--db", type=Path, default=None, help="keep the database here (reused when it holds the runs)")
    parser.add_argument("--profile", type=int, default=0,
                        help="print this many functions of the first render's profile")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("BASIS_LAB_CACHE", str(Path(tmp) / "cache"))
        os.environ["HF_HUB_OFFLINE"] = "1"
        url = _database(args.db or Path(tmp) / "compare.db", args.runs)
        os.environ["BASIS_LAB_DB_URL"] = url
        _render(args.profile)


if __name__ == "__main__":
    main()
