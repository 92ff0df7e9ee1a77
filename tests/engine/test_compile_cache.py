"""The persistent compilation cache of runs (``engine.training.compile_cache``): where it lives,
that the suite's own cache wins, and, in child processes training a tiny run with a cache of
their own, that two processes at once share it without damage, a later process of the same
shape compiles nothing, and a damaged entry is compiled again, not a failed run."""

import json
import os
import subprocess
import sys
from pathlib import Path

import jax

from engine.training import compile_cache
from tests.conftest import PYTEST_CACHE

ROOT = Path(__file__).resolve().parents[2]

# trains a tiny run in this process and prints what JAX's persistent cache did meanwhile
CHILD = """
import json, sys, warnings
import jax.monitoring
from engine.config import RunConfig
from engine.training.loop import train
from engine.training.phases import Phases

events = {}
jax.monitoring.register_event_listener(lambda e, **_: events.__setitem__(e, events.get(e, 0) + 1))
config = RunConfig(preset="tiny", steps=2, eval_interval=2, probe_interval=0, val_batches=1, rank=4, seed=int(sys.argv[1]))
phases = Phases()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    records = list(train(config, phases=phases))
print(json.dumps({"hits": events.get("/jax/compilation_cache/cache_hits", 0),
                  "misses": events.get("/jax/compilation_cache/cache_misses", 0),
                  "cache_warnings": [str(w.message) for w in caught if "compilation cache" in str(w.message)],
                  "steps": records[-1].step, "compile_s": phases.metrics()["time/compile_s"]}))
"""


def _start(cache: Path, seed: int) -> subprocess.Popen:
    env = {**os.environ, compile_cache.ENV: str(cache)}
    env.pop("JAX_COMPILATION_CACHE_DIR", None)  # the suite's cache would win over the run's
    return subprocess.Popen([sys.executable, "-c", CHILD, str(seed)], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _result(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def _entries(cache: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in cache.glob("*-cache")}


def test_the_folder_is_the_data_folders_xla_unless_named_or_off(monkeypatch, tmp_path):
    monkeypatch.delenv(compile_cache.ENV, raising=False)
    monkeypatch.setenv("BASIS_LAB_CACHE", str(tmp_path / "data"))
    assert compile_cache.cache_dir() == tmp_path / "data" / "xla"
    monkeypatch.setenv(compile_cache.ENV, str(tmp_path / "elsewhere"))
    assert compile_cache.cache_dir() == tmp_path / "elsewhere"
    for off in ("off", "OFF", "0", "none"):
        monkeypatch.setenv(compile_cache.ENV, off)
        assert compile_cache.cache_dir() is None


def test_the_suites_cache_wins():
    """This process's cache, configured already (``tests/conftest.py``: pytest's own folder),
    is kept by ``enable``, settings and all."""
    suite = os.environ[PYTEST_CACHE]
    assert compile_cache.enable() == Path(suite)
    assert jax.config.jax_compilation_cache_dir == suite
    assert jax.config.jax_compilation_cache_max_size == -1  # the suite's: unbounded, untouched


def test_processes_share_the_cache_and_a_damaged_entry_is_compiled_again(tmp_path):
    cache = tmp_path / "xla"
    first = [_start(cache, seed) for seed in (0, 1)]  # two processes at once, on an empty cache
    results = [_result(p) for p in first]
    assert all(r["steps"] == 2 for r in results)
    entries = _entries(cache)
    assert entries, "nothing was written to the cache"
    assert (cache / ".lockfile").exists()  # bounded: reads and writes hold JAX's file lock

    again = _result(_start(cache, 2))  # the same shapes, another seed
    assert again["hits"] == len(entries) and again["misses"] == 0, again  # every program loaded, none compiled
    assert not again["cache_warnings"]

    broken = {name: data[: len(data) // 2] if i % 2 else b"\x00garbage" * 64  # truncated or garbled
              for i, (name, data) in enumerate(sorted(entries.items()))}
    for name, data in broken.items():
        (cache / name).write_bytes(data)
    damaged = _result(_start(cache, 3))
    assert damaged["steps"] == 2 and damaged["cache_warnings"], damaged  # compiled again, with a warning
