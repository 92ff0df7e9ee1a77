"""glibc's malloc set to keep freed memory and hand it out again, in the processes that train on a CPU.

XLA on a CPU allocates a step's buffers with ``malloc`` and frees them when the step
ends. By default glibc serves an allocation above its mmap threshold (32 MiB at most)
with a fresh ``mmap`` and unmaps it on ``free``, and a thread's arena gives an empty heap
back to the kernel, so the next step touches new pages: one minor page fault, and a page
the kernel zeroes, per 4 KiB. ``reuse_freed_memory`` sets (``mallopt``)

- ``M_MMAP_MAX`` 0: no allocation gets a mapping of its own;
- ``M_ARENA_MAX`` 1: every thread allocates from the main arena, whose heap has no size
  cap. A thread of another arena allocates from heaps of at most 64 MiB, and glibc serves
  a larger block there with an ``mmap`` of its own whatever ``M_MMAP_MAX`` says, unmapped
  again on ``free``. So the arena count is not sized from the cores: two threads each
  allocating, writing and freeing two 100 MiB blocks six times took 106,500 faults and
  0.22 s of kernel time with one arena, 362,500 and 0.79 s with two (blocks of 16 and 48
  MiB: the same with 1, 2 and 8 arenas). What one arena costs is contention on its lock
  between threads allocating at once, which a 2-core machine cannot show;
- ``M_TRIM_THRESHOLD`` 1 GiB and ``M_TOP_PAD`` 64 MiB: free memory at the top of the heap
  stays there.

Measured on the 2-core CPU at the small preset (run defaults, 8 steps after warm-up, one
process each way, twice): the exact step took 66,600 faults and 171–185 ms of kernel
time per step, basis R=1 47,600 and 133–149 ms; with these settings 0–8,300 faults
(while the heap still grows) and 2–15 ms. ``bench/step.py`` at both presets now sees
no faults in any case but the first rounds. The cost: the process keeps the most memory
it ever used until it exits (a worker's next run reuses it).

Where (``for_training``): the CLI's process entry point (``engine.cli.main.main_exit``: the
``basis-lab`` script and ``python -m engine``) applies them first thing, before JAX starts
its threads (arena settings count only for threads that have not allocated yet), for a
command that trains in its own process (``run``, ``sweep``, ``resume``, ``worker``, ``tune``,
``reproduce``; not with ``--queue-only``), on JAX's CPU backend. Never in the dashboard, a
server that lives for days and whose memory should shrink after a peak (the runs it trains
in its own threads allocate with glibc's defaults; a worker, ``engine worker``, gets the
settings), nor in ``list``, ``show`` and the other commands that only read or queue.

Nothing is inherited: ``mallopt``'s settings belong to the process and end at ``exec``, and
the lab sets no ``GLIBC_TUNABLES``, so the programs a training process starts (``git``,
``pg_dump``) allocate with glibc's defaults, or with the user's own ``GLIBC_TUNABLES``,
which the lab leaves as it is. The user's own win in the training process too: a setting
that ``GLIBC_TUNABLES`` names (``glibc.malloc.arena_max=4``) is not changed.

``$BASIS_LAB_ALLOCATOR`` (``SWITCH``): ``auto``, the default, as above; ``off``: never.
Anywhere but glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import pkgutil
from importlib.metadata import entry_points
from typing import Mapping, NamedTuple

from engine.config import ConfigError

SWITCH = "BASIS_LAB_ALLOCATOR"
CHOICES = ("auto", "off")  # the first is the default


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


def choice(environ: Mapping[str, str]) -> str:
    """``$BASIS_LAB_ALLOCATOR``, lower-cased (``auto`` when unset or empty); another value is
    refused with a ``ConfigError`` naming the choices."""
    value = environ.get(SWITCH, "").strip().lower() or CHOICES[0]
    if value not in CHOICES:
        raise ConfigError(f"{SWITCH}={environ[SWITCH]!r} is not a choice; set it to {' or '.join(CHOICES)} "
                          "(off: glibc's default malloc in training processes too)")
    return value


def cpu_backend(environ: Mapping[str, str]) -> bool:
    """Whether JAX will compute on its CPU backend, told before JAX starts: ``$JAX_PLATFORMS``
    names ``cpu`` first, or names nothing and no accelerator plugin is installed (what JAX
    loads: a module of the ``jax_plugins`` namespace package, an entry point of that group,
    or ``libtpu``)."""
    platforms = environ.get("JAX_PLATFORMS", "").strip()
    if platforms:
        return platforms.split(",")[0].strip().lower() == "cpu"
    namespace = importlib.util.find_spec("jax_plugins")
    if namespace is not None and any(pkgutil.iter_modules(namespace.submodule_search_locations or [])):
        return False
    return not entry_points(group="jax_plugins") and importlib.util.find_spec("libtpu") is None


def for_training(environ: Mapping[str, str] = os.environ) -> bool:
    """Apply ``SETTINGS`` to this process, about to train, when ``SWITCH`` is ``auto`` and JAX
    will train on the CPU: True when glibc took all of them."""
    return choice(environ) == "auto" and cpu_backend(environ) and reuse_freed_memory(environ)


def reuse_freed_memory(environ: Mapping[str, str] = os.environ) -> bool:
    """Apply ``SETTINGS`` to this process's malloc, but for those that ``environ``'s
    ``GLIBC_TUNABLES`` sets (the user's, which glibc applied at the start); True when glibc
    took all it was given."""
    try:
        if not (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc"):
            return False
        mallopt = ctypes.CDLL(None).mallopt  # the process's own libc
    except (ValueError, OSError, AttributeError):  # no such confstr name, or no mallopt
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    given = {item.split("=")[0].strip() for item in environ.get("GLIBC_TUNABLES", "").split(":")}
    return all(mallopt(s.param, s.value) == 1 for s in SETTINGS if f"glibc.malloc.{s.name}" not in given)
