"""The compiler settings of the suite's processes: JAX's public switches, and XLA flags only
where a probe found that XLA knows them.

- pytest's own processes (its workers, ``tests.support.scale_checks``) compile thousands of
  small programs that each runs a handful of times, so they compile with JAX's public
  ``jax_disable_most_optimizations`` (``compile_bound``): XLA's backend at O0 and LLVM
  without its expensive passes, the compile time being most of such a test's cost. Their CPU
  backend also starts with two XLA flags that JAX has no switch for (``RAW``: XLA's loop
  emitters instead of its fusion emitters, and one LLVM module compiled in one piece, not
  split for idle cores that a loaded 2-core machine does not have). Without them
  ``test_basis.py``, ``test_tags.py``, ``test_checkpoints.py`` and ``test_run_views.py`` took
  169 CPU s in one process, with them 126. XLA aborts a process on a flag it does not know,
  which a JAX upgrade can make of any flag, so the session probes them once in a process of
  its own (``vetted``) and goes on without them, with a warning, where XLA refuses them; and
  the flags never reach the environment that the processes a test starts inherit.
- Every process a test starts (``python -m engine``, the dashboard) compiles as a user's
  does: it inherits no XLA or JAX setting from the suite, only the folder of the lab's own
  compilation cache (``BASIS_LAB_COMPILE_CACHE``, the user's setting; ``tests/conftest.py``).

The two settings need not round alike (LLVM keeps IEEE semantics at every level, no fast
math, but two levels may still order operations differently): a run trained at O1 in an
engine process and resumed at O0 in pytest's differed from its twin by about 4e-8. So a test
whose child process trains half of a twin that pytest's own process continues or compares
bit for bit starts that child with ``twin_env()``: the settings of this process, its
compilation cache included (a JAX setting, which the lab's ``compile_cache.enable`` keeps).
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

SWITCH = "jax_disable_most_optimizations"  # JAX's config name; its environment variable is the name upper-cased
RAW = "--xla_cpu_use_fusion_emitters=false --xla_cpu_parallel_codegen_split_count=1"  # XLA's, no JAX switch
VETTED = "BASIS_LAB_TEST_XLA_FLAGS"  # what the session's probe kept of RAW, for pytest-xdist's workers


def accepted(flags: str) -> str | None:
    """None when a CPU backend starts with ``XLA_FLAGS=flags`` (in a process of its own: XLA
    aborts a process on a flag it does not know), else the last line XLA said."""
    probe = subprocess.run([sys.executable, "-c", "import jax; jax.devices()"], capture_output=True, text=True,
                           env={**os.environ, "XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu"}, timeout=600)
    return None if probe.returncode == 0 else (probe.stderr.strip().splitlines() or ["no message"])[-1]


def vetted() -> str:
    """``RAW`` if XLA accepts it, else nothing, with a warning; probed once a session."""
    if VETTED not in os.environ:
        refusal = accepted(RAW)
        if refusal is not None:
            warnings.warn(f"the suite compiles without XLA_FLAGS={RAW!r}: XLA refused them ({refusal}); "
                          "drop them from tests/support/xla.py", stacklevel=1)
        os.environ[VETTED] = RAW if refusal is None else ""
    return os.environ[VETTED]


def compile_bound() -> None:
    """Compile this process's programs for compile time rather than run time (``SWITCH``,
    and ``vetted()`` flags for its CPU backend, which this starts); a caller's own
    ``JAX_DISABLE_MOST_OPTIMIZATIONS`` or ``XLA_FLAGS`` wins. The flags stay out of the
    environment that the processes it starts inherit."""
    import jax

    if SWITCH.upper() not in os.environ:
        jax.config.update(SWITCH, True)
    if "XLA_FLAGS" in os.environ:
        return
    os.environ["XLA_FLAGS"] = vetted()
    try:
        jax.devices()  # the backend reads XLA_FLAGS once, as it starts
    finally:
        del os.environ["XLA_FLAGS"]


def twin_env(**extra: str) -> dict[str, str]:
    """The environment for a child process whose training pytest's own process continues or
    compares bit for bit: this process's compiler settings (``SWITCH``, the vetted XLA flags),
    with ``extra``."""
    import jax

    flags = {} if "XLA_FLAGS" in os.environ else {"XLA_FLAGS": os.environ.get(VETTED, "")}  # a caller's own are inherited
    cache = jax.config.values.get("jax_compilation_cache_dir")  # this process's, unbounded (tests/conftest.py)
    shared = {"JAX_COMPILATION_CACHE_DIR": cache, "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
              "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"} if cache else {}
    return {**os.environ, SWITCH.upper(): "1" if jax.config.values[SWITCH] else "0", **flags, **shared, **extra}


def forced_devices(devices: int) -> dict[str, str]:
    """The environment variables of a process whose CPU backend holds ``devices`` devices
    (JAX's ``jax_num_cpu_devices``), compiling as ``compile_bound`` does."""
    return {"JAX_NUM_CPU_DEVICES": str(devices), SWITCH.upper(): "1"}
