"""The training processes' malloc settings (``engine.training.allocator``): a buffer freed by a
thread is handed out again without new page faults, where glibc's defaults map it afresh
every time; ``python -m engine`` sets them for the commands that train and for no other,
``BASIS_LAB_ALLOCATOR=off`` turns them off, a user's own ``GLIBC_TUNABLES`` wins, and a
program a training process starts allocates with glibc's defaults."""

import os
import subprocess
import sys
from pathlib import Path

import jax
import pytest

from engine.config import ConfigError
from engine.training import allocator

ROOT = Path(__file__).resolve().parents[2]
MIB = 2**20
SIZE = 48 * MIB  # above glibc's largest mmap threshold (32 MiB), like a step's XLA buffers
PAGES = SIZE // os.sysconf("SC_PAGE_SIZE")
USERS = "glibc.malloc.mmap_max=65536"  # a user's own tunable: big blocks mapped again

# rounds(): in a new thread (as XLA's pool allocates), malloc SIZE, write every page, free;
# three times: the minor page faults each round's writes took.
ROUNDS = f"""
import ctypes, os, resource, threading
def rounds():
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    faults = []
    def run():
        for _ in range(3):
            block = libc.malloc({SIZE})
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            ctypes.memset(block, 1, {SIZE})
            faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
            libc.free(block)
    thread = threading.Thread(target=run)
    thread.start(); thread.join()
    return " ".join(map(str, faults)) + " " + os.environ.get("GLIBC_TUNABLES", "-")
"""
# a process that prints its rounds and GLIBC_TUNABLES; with the argument "reuse" it sets the settings first
PROBE = ROUNDS + """
import sys
if sys.argv[1:] == ["reuse"]:
    from engine.training.allocator import reuse_freed_memory
    reuse_freed_memory()
print(rounds())
"""
# ``python -m engine ARGS`` whose process, as it exits, prints its own rounds (THIS) and those
# of a program it starts as the lab starts git or pg_dump (CHILD: the environment inherited)
ENTRY = ROUNDS + f"""
import atexit, runpy, subprocess, sys
def report():
    child = subprocess.run([sys.executable, "-c", {PROBE!r}], capture_output=True, text=True)
    print("THIS", rounds(), flush=True)
    print("CHILD", child.stdout.strip(), flush=True)
atexit.register(report)
sys.argv = ["engine", *sys.argv[1:]]
runpy.run_module("engine", run_name="__main__", alter_sys=True)
"""

glibc_only = pytest.mark.skipif(not hasattr(os, "confstr") or not os.confstr("CS_GNU_LIBC_VERSION"),
                                reason="the settings are glibc's; another libc is left as it is")


def _env(**env: str | None) -> dict:
    merged = {**os.environ, "PYTHONPATH": str(ROOT)}
    merged.pop("GLIBC_TUNABLES", None)
    merged.pop(allocator.SWITCH, None)
    merged.update({k: v for k, v in env.items() if v is not None})
    return merged


def _parse(line: str) -> tuple[list[int], str]:
    *faults, tunables = line.split()
    return [int(n) for n in faults], tunables


def _reused(faults: list[int]) -> bool:
    """Only the first round touched new pages."""
    return faults[0] >= 0.9 * PAGES and max(faults[1:]) <= 0.02 * PAGES


def _fresh(faults: list[int]) -> bool:
    """Every round was mapped and zeroed afresh."""
    return all(n >= 0.9 * PAGES for n in faults)


def _probe(mode: str, **env: str | None) -> tuple[list[int], str]:
    done = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, cwd=ROOT,
                          env=_env(**env), timeout=120)
    assert done.returncode == 0, done.stderr
    return _parse(done.stdout.strip().splitlines()[-1])


@glibc_only
def test_a_freed_buffer_is_reused_without_page_faults_unless_the_user_says_otherwise():
    assert _fresh(_probe("default")[0])
    assert _reused(_probe("reuse")[0])
    faults, tunables = _probe("reuse", GLIBC_TUNABLES=USERS)  # the user's mmap_max is kept
    assert _fresh(faults) and tunables == USERS


def _engine(db: str, command: str, **env: str | None) -> subprocess.Popen:
    args = ["worker", "--db", db, "--idle-exit", "0"] if command == "worker" else [command, "--db", db]
    return subprocess.Popen([sys.executable, "-c", ENTRY, *args], cwd=ROOT, env=_env(**env), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _rounds(proc: subprocess.Popen) -> dict[str, tuple[list[int], str]]:
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    lines = [line.split(" ", 1) for line in out.splitlines() if line.startswith(("THIS ", "CHILD "))]
    return {name: _parse(rest) for name, rest in lines}


@glibc_only
def test_python_m_engine_sets_them_for_a_command_that_trains_and_for_no_other_nor_any_child(sqlite_template, tmp_path):
    db = sqlite_template.copy(tmp_path / "lab.db")
    procs = {
        "worker": _engine(db, "worker"),
        "list": _engine(db, "list"),
        "off": _engine(db, "worker", **{allocator.SWITCH: "off"}),
        "users": _engine(db, "worker", GLIBC_TUNABLES=USERS),
    }
    seen = {name: _rounds(proc) for name, proc in procs.items()}
    assert _reused(seen["worker"]["THIS"][0]), seen["worker"]
    child_faults, child_tunables = seen["worker"]["CHILD"]
    assert _fresh(child_faults) and child_tunables == "-"  # git, pg_dump: glibc's defaults, nothing set
    assert _fresh(seen["list"]["THIS"][0]), seen["list"]
    assert _fresh(seen["off"]["THIS"][0]), seen["off"]
    assert _fresh(seen["users"]["THIS"][0]), seen["users"]  # the user's mmap_max won
    assert seen["users"]["CHILD"][1] == USERS  # and reaches the programs started, unchanged


def test_a_bad_switch_is_one_line_naming_the_choices(tmp_path):
    done = subprocess.run([sys.executable, "-m", "engine", "worker", "--db", f"sqlite:///{tmp_path / 'lab.db'}"],
                          cwd=ROOT, env=_env(**{allocator.SWITCH: "always"}), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 2 and not (tmp_path / "lab.db").exists(), done.stderr
    assert done.stderr.strip().splitlines() == [
        "error: BASIS_LAB_ALLOCATOR='always' is not a choice; set it to auto or off "
        "(off: glibc's default malloc in training processes too)"]


def test_the_switch_and_the_backend_decide():
    assert [allocator.choice({allocator.SWITCH: v}) for v in ("", " Auto ", "OFF")] == ["auto", "auto", "off"]
    assert allocator.choice({}) == "auto"
    with pytest.raises(ConfigError, match="auto or off"):
        allocator.choice({allocator.SWITCH: "on"})
    assert allocator.for_training({allocator.SWITCH: "off"}) is False
    assert allocator.for_training({"JAX_PLATFORMS": "cuda"}) is False  # settles before any mallopt
    assert allocator.cpu_backend({"JAX_PLATFORMS": "cpu"}) and allocator.cpu_backend({"JAX_PLATFORMS": "CPU,cuda"})
    assert not allocator.cpu_backend({"JAX_PLATFORMS": "cuda,cpu"})
    assert allocator.cpu_backend({}) == (jax.default_backend() == "cpu")  # what JAX itself picked here
