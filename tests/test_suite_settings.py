"""What the suite's settings (``tests/conftest.py``, ``tests.support.xla``) leave to the processes
its tests start: a user's compiler defaults, and the lab's bounded compilation cache in the
folder the suite named for them, not the unbounded one of pytest's own processes (which a
twin shares with them); XLA flags it does not know are found by
a probe, not by every process aborting."""

import json
import os
import subprocess
import sys
from pathlib import Path

import jax

from engine.training import compile_cache
from tests.conftest import PYTEST_CACHE
from tests.support import xla

ROOT = Path(__file__).resolve().parents[1]
CHILD = """
import json, os, jax
from engine.training import compile_cache
print(json.dumps({"disable_most_optimizations": jax.config.values["jax_disable_most_optimizations"],
                  "cache": str(compile_cache.enable()), "xla_flags": os.environ.get("XLA_FLAGS"),
                  "bound": jax.config.values["jax_compilation_cache_max_size"]}))
"""


def _child(env: dict) -> dict:
    done = subprocess.run([sys.executable, "-c", CHILD], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_tests_child_compiles_as_a_users_process_with_the_suites_cache():
    assert jax.config.values["jax_disable_most_optimizations"]  # pytest's own process: compile bound
    own = jax.config.jax_compilation_cache_dir
    assert own == os.environ[PYTEST_CACHE] != os.environ[compile_cache.ENV]
    assert _child(dict(os.environ)) == {"disable_most_optimizations": False, "cache": os.environ[compile_cache.ENV],
                                        "xla_flags": None, "bound": compile_cache.MAX_BYTES}


def test_a_twin_compiles_as_this_process():
    seen = _child(xla.twin_env())
    assert seen["disable_most_optimizations"] is True and seen["xla_flags"] == os.environ[xla.VETTED]
    assert seen["cache"] == jax.config.jax_compilation_cache_dir and seen["bound"] == -1  # this process's, unbounded


def test_an_xla_flag_that_xla_does_not_know_is_found_before_it_aborts_every_process():
    assert os.environ[xla.VETTED] in (xla.RAW, "")  # the session's probe ran, before any test
    refusal = xla.accepted("--xla_no_such_flag_anywhere=1")
    assert refusal is not None and "xla_no_such_flag_anywhere" in refusal
