"""The training processes' malloc settings (``engine.training.allocator``): a buffer freed
by a thread is handed out again without new page faults, where glibc's defaults map it
afresh every time; set by mallopt or, from a process's start, by GLIBC_TUNABLES."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.training.allocator import tunables

ROOT = Path(__file__).resolve().parents[2]
MIB = 2**20
SIZE = 48 * MIB  # above glibc's largest mmap threshold (32 MiB), like a step's XLA buffers

# In a thread (as XLA's pool allocates): malloc SIZE, write every page, free; three times.
# Prints the minor page faults that each round's writes took.
CHILD = f"""
import ctypes, resource, sys, threading
if sys.argv[1] == "reuse":
    from engine.training.allocator import reuse_freed_memory
    assert reuse_freed_memory()
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
faults = []
def rounds():
    for _ in range(3):
        block = libc.malloc({SIZE})
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        ctypes.memset(block, 1, {SIZE})
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        libc.free(block)
thread = threading.Thread(target=rounds)
thread.start(); thread.join()
print(*faults)
"""


def _faults(mode: str, **env: str) -> list[int]:
    done = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **env}, timeout=60)
    assert done.returncode == 0, done.stderr
    return [int(n) for n in done.stdout.split()]


@pytest.mark.skipif(not hasattr(os, "confstr") or not os.confstr("CS_GNU_LIBC_VERSION"),
                    reason="the settings are glibc's; another libc is left as it is")
def test_a_freed_buffer_is_reused_without_page_faults():
    pages = SIZE // os.sysconf("SC_PAGE_SIZE")
    default, reuse = _faults("default"), _faults("reuse")
    assert all(n >= 0.9 * pages for n in default), default  # mapped and zeroed afresh each round
    assert reuse[0] >= 0.9 * pages and max(reuse[1:]) <= 0.02 * pages, reuse  # only the first touch
    # the same settings given at the start as GLIBC_TUNABLES (how the dashboard's server gets them)
    tuned = _faults("default", GLIBC_TUNABLES=tunables({}))
    assert tuned[0] >= 0.9 * pages and max(tuned[1:]) <= 0.02 * pages, tuned
