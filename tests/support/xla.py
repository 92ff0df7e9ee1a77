"""The XLA compiler settings of the suite's processes (``tests/conftest.py`` sets them).

The suite's models are tiny: its time goes to compiling programs and to running them for
a few steps, never to large arrays. Both settings compile LLVM without its expensive passes
and with XLA's loop emitters instead of its fusion emitters, which compiles a tiny GPT's
step two to three times faster.

- ``COMPILE_BOUND``, LLVM at O0: pytest's own workers and ``tests.support.scale_checks``,
  where each test compiles programs it runs a handful of times. A tiny step compiles in
  about 1 s and runs in about 130 ms. Its LLVM module is compiled in one piece
  (``--xla_cpu_parallel_codegen_split_count=1``): XLA splits it into parts for threads of
  their own by default, which saves wall time only on idle cores. Three workers on two
  cores have none to spare, and the split's overhead cost 7-15 % of the CPU seconds of
  ``test_basis.py``, ``test_memory.py`` and ``test_draws.py`` (interleaved runs).
- ``TRAINING``, LLVM at O1: the ``python -m engine`` and dashboard processes that tests start
  (they inherit it; XLA's split kept, as there it cost no CPU). They train tens of steps of
  programs compiled once per process, then loaded from the shared persistent cache, so the
  faster code is worth the slower compile: about 2.4 s, then 50 ms a step. The fleet,
  durable, fault and job tests use 23 % less CPU.

Neither changes the math beyond rounding: LLVM keeps IEEE semantics at every level (no fast
math), but the two levels need not round alike. On this project's AMD EPYC machines they do
not: a run killed in an engine process (O1) and resumed in pytest's (O0) differed from its
twin by about 4e-8. So a test whose child process trains half of a twin that pytest's own
process compares bit for bit starts that child with ``twin_env()``: the settings of this
process.
"""

import os

COMMON = "--xla_llvm_disable_expensive_passes=true --xla_cpu_use_fusion_emitters=false"
COMPILE_BOUND = f"--xla_backend_optimization_level=0 --xla_cpu_parallel_codegen_split_count=1 {COMMON}"
TRAINING = f"--xla_backend_optimization_level=1 {COMMON}"


OWN: str | None = None  # the settings this process's backend started with (``tests/conftest.py`` records them)


def twin_env(**extra: str) -> dict[str, str]:
    """The environment for a child process whose training pytest's own process continues or
    compares bit for bit: the compiler settings this process runs with (``OWN``: under
    ``make test``'s workers, which inherit ``TRAINING`` from the controller, that is TRAINING;
    in a lone pytest, COMPILE_BOUND), with ``extra``."""
    flags = OWN if OWN is not None else os.environ.get("XLA_FLAGS", "")
    return {**os.environ, "XLA_FLAGS": flags, **extra}


def forced_devices(devices: int, flags: str = COMPILE_BOUND) -> str:
    """``flags`` for a process whose CPU backend holds ``devices`` devices."""
    return f"{flags} --xla_force_host_platform_device_count={devices}"
