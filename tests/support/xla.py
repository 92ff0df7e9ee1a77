"""The XLA compiler settings of the suite's processes (``tests/conftest.py`` sets them).

The suite's models are tiny: its time goes to compiling programs and to running them for
a few steps, never to large arrays. Both settings compile LLVM without its expensive passes
and with XLA's loop emitters instead of its fusion emitters, which compiles a tiny GPT's
step two to three times faster.

- ``COMPILE_BOUND``, LLVM at O0: pytest's own workers, ``tests.support.scale_checks`` and
  every ``python -m engine`` and dashboard process the tests start (they inherit it), where
  each test compiles programs it runs a handful of times. A tiny step compiles in
  about 1 s and runs in about 130 ms. Its LLVM module is compiled in one piece
  (``--xla_cpu_parallel_codegen_split_count=1``): XLA splits it into parts for threads of
  their own by default, which saves wall time only on idle cores. Three workers on two
  cores have none to spare, and the split's overhead cost 7-15 % of the CPU seconds of
  ``test_basis.py``, ``test_memory.py`` and ``test_draws.py`` (interleaved runs).
- Until 2026-11 the child processes compiled at LLVM O1 instead (about 2.4 s, then 50 ms a
  step), on the claim that the two levels agree bit for bit; on this project's AMD EPYC
  machines they do not (the parameters of a run killed in an engine process and resumed in
  pytest's differed from its twin's by about 4e-8), so the twins the tests compare now
  compile alike everywhere.

Neither changes the math beyond rounding: LLVM keeps IEEE semantics at every level (no fast
math); only the order of some floating-point operations may differ between levels.
"""

COMMON = "--xla_llvm_disable_expensive_passes=true --xla_cpu_use_fusion_emitters=false"
COMPILE_BOUND = f"--xla_backend_optimization_level=0 --xla_cpu_parallel_codegen_split_count=1 {COMMON}"


def forced_devices(devices: int, flags: str = COMPILE_BOUND) -> str:
    """``flags`` for a process whose CPU backend holds ``devices`` devices."""
    return f"{flags} --xla_force_host_platform_device_count={devices}"
