"""glibc's malloc set to keep freed memory and hand it out again, for processes that train.

XLA on a CPU allocates a step's buffers with ``malloc`` and frees them when the step
ends. By default glibc serves an allocation above its mmap threshold (32 MiB at most)
with a fresh ``mmap`` and unmaps it on ``free``, and a thread's arena gives an empty heap
back to the kernel, so the next step touches new pages: one minor page fault, and a page
the kernel zeroes, per 4 KiB. ``reuse_freed_memory`` sets (``mallopt``)

- ``M_MMAP_MAX`` 0: no allocation gets a mapping of its own;
- ``M_ARENA_MAX`` 1: every thread allocates from the main arena, whose heap has no size
  cap, instead of per-thread heaps of 64 MiB at most that are unmapped once empty;
- ``M_TRIM_THRESHOLD`` 1 GiB and ``M_TOP_PAD`` 64 MiB: free memory at the top of the heap
  stays there.

Measured on the 2-core CPU at the small preset (run defaults, 8 steps after warm-up, one
process each way, twice): the exact step took 66,600 faults and 171–185 ms of kernel
time per step, basis R=1 47,600 and 133–149 ms; with these settings 0–8,300 faults
(while the heap still grows) and 2–15 ms. ``bench/step.py`` at both presets now sees
no faults in any case but the first rounds. The cost: the process keeps the most memory
it ever used until it exits (a worker's next run reuses it).

Arena settings count only for threads that have not allocated yet, so this runs first
thing in a process, before JAX starts its thread pool. A program that execs another (the
dashboard's launcher, ``app.serve``, which becomes the Streamlit server that trains the
runs it launches) passes the same settings as ``GLIBC_TUNABLES`` (``tunables``). Anywhere
but glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import os
from typing import NamedTuple


class Setting(NamedTuple):
    """One malloc setting: its ``mallopt`` parameter (glibc's <malloc.h>), its name as a
    glibc tunable (``glibc.malloc.<name>``) and its value."""

    param: int
    name: str
    value: int


SETTINGS = (
    Setting(-4, "mmap_max", 0),  # M_MMAP_MAX
    Setting(-8, "arena_max", 1),  # M_ARENA_MAX
    Setting(-1, "trim_threshold", 1 << 30),  # M_TRIM_THRESHOLD
    Setting(-2, "top_pad", 64 << 20),  # M_TOP_PAD
)


def tunables(environ: dict) -> str:
    """``GLIBC_TUNABLES`` that give a process ``SETTINGS`` from its first allocation, for a
    program that execs another (mallopt's settings die with the process image); tunables
    already in ``environ`` come after ours, so the user's own win."""
    ours = ":".join(f"glibc.malloc.{s.name}={s.value}" for s in SETTINGS)
    given = environ.get("GLIBC_TUNABLES")
    return f"{ours}:{given}" if given else ours


def reuse_freed_memory() -> bool:
    """Apply ``SETTINGS`` to this process's malloc; True when glibc took all of them."""
    try:
        if not (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc"):
            return False
        mallopt = ctypes.CDLL(None).mallopt  # the process's own libc
    except (ValueError, OSError, AttributeError):  # no such confstr name, or no mallopt
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return all(mallopt(s.param, s.value) == 1 for s in SETTINGS)
