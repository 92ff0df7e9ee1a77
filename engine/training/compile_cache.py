"""JAX's persistent compilation cache for runs: a program is compiled once per machine and shape.

Before its first step a run compiles its train step, its evaluation, its dW probe and the
small programs around them (at the paper preset on a 2-core CPU, 4-6 CPU s and as many
seconds before its first step), and every process used to pay that again. ``enable()``,
called by every training (``engine.training.loop``) and by
``engine.training.build.model_config`` (the start-up estimate's measured step), so by the
CLI, workers and the dashboard alike, points JAX's persistent cache at
``<data folder>/xla``, the data folder being the token cache's (``$BASIS_LAB_CACHE``, else
``~/.cache/basis-lab``), so the next process that builds the same program (same model,
shapes, optimizer setting, backend, JAX and XLA flags: JAX's cache key) loads the executable
XLA wrote instead of compiling it again. Within one process the jitted functions are kept
already (``engine.training.devices``, ``engine.model.memory``, ``engine.training.loop``).

- ``$BASIS_LAB_COMPILE_CACHE`` names another folder; ``off`` (or ``0``, ``none``) disables it.
- A cache configured already wins: when ``jax_compilation_cache_dir`` is set (the test suite's
  session cache, a user's ``JAX_COMPILATION_CACHE_DIR``) ``enable`` changes nothing.
- Bounded: at most ``MAX_BYTES`` (``jax_compilation_cache_max_size``); the least recently used
  entries are deleted to make room.
- Several processes: with a size bound JAX reads and writes every entry holding a file lock
  (``filelock`` on ``<folder>/.lockfile``), so no process reads an entry another is writing.
- Damage: an entry that cannot be decoded (a process killed while writing it, a disk error)
  makes JAX warn and compile the program again, never fail the run. JAX does not overwrite
  the entry, so every later process compiles that program again until the folder is cleared
  (``rm -r ~/.cache/basis-lab/xla``): only public JAX settings are used here, no patch of
  JAX's private cache functions.
- What is stored: every program that took at least ``MIN_COMPILE_S`` to compile.

Only ``enable`` imports JAX, so the module is cheap to import.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

ENV = "BASIS_LAB_COMPILE_CACHE"
OFF = frozenset({"off", "0", "none", "false", "no"})
SUBFOLDER = "xla"
MAX_BYTES = 2 * 1024**3  # LRU bound of the folder
MIN_COMPILE_S = 0.0  # store every program: a read (milliseconds) beats even a small compile

_LOCK = threading.Lock()
_state: dict[str, Any] = {"done": False, "path": None}


def cache_dir() -> Path | None:
    """The folder ``enable`` uses: ``$BASIS_LAB_COMPILE_CACHE``, else ``xla/`` in the data folder;
    None when the variable says ``off``."""
    from engine.data import CACHE_ENV, DEFAULT_CACHE_DIR

    chosen = os.environ.get(ENV, "").strip()
    if chosen.lower() in OFF:
        return None
    if chosen:
        return Path(chosen).expanduser()
    return Path(os.environ.get(CACHE_ENV) or DEFAULT_CACHE_DIR).expanduser() / SUBFOLDER


def enable() -> Path | None:
    """Turn the persistent compilation cache on for this process (once; later calls return
    the same answer): the folder in use, or None when it is off. A folder configured already
    (``jax_compilation_cache_dir``) is kept with its settings and returned; a folder that
    cannot be created leaves the cache off, with a warning."""
    with _LOCK:
        if not _state["done"]:
            _state["path"], _state["done"] = _enable(), True
        return _state["path"]


def _enable() -> Path | None:
    import jax

    configured = jax.config.values.get("jax_compilation_cache_dir")
    if configured:
        return Path(configured)
    path = cache_dir()
    if path is None:
        return None
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        log.warning("compilation cache off: cannot create %s (%s)", path, e)
        return None
    jax.config.update("jax_compilation_cache_max_size", MAX_BYTES)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_S)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    jax.config.update("jax_compilation_cache_dir", str(path))
    return path
