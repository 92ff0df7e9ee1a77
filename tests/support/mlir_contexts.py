"""One MLIR context for many lowerings, in the suite's own processes.

JAX lowers each program into a new MLIR context (``jax._src.interpreters.mlir.make_ir_context``),
and making one registers and loads its dialects: about 4 ms on this machine (LLVM measures
~3.7 ms per context in llvm/llvm-project#217320), paid once for each of the suite's thousands
of small programs: ``test_basis.py`` spent 129 CPU s with a context per program, 99 with shared
ones. What a context keeps beyond its modules is what it has uniqued
(types, attributes), so :func:`share` hands out one context for ``lowerings`` lowerings and
then a new one, which bounds that growth. A context only holds the IR: the program lowered
into it, and so what XLA compiles and runs, is the same.

Only pytest's processes use it (``tests/conftest.py``, ``tests.support.scale_checks``); the
``python -m engine`` and dashboard processes that tests start lower as users' do.
"""

from __future__ import annotations

import os
import threading


def share(lowerings: int = 200) -> None:
    """Make JAX reuse each MLIR context for ``lowerings`` lowerings (idempotent); not where
    ``BASIS_LAB_TEST_FRESH_CONTEXTS=1`` (to compare)."""
    if os.environ.get("BASIS_LAB_TEST_FRESH_CONTEXTS") == "1":
        return
    from jax._src.interpreters import mlir

    make = getattr(mlir.make_ir_context, "__wrapped__", mlir.make_ir_context)
    lock = threading.Lock()
    state: dict = {"context": None, "uses": 0}

    def shared_context():
        with lock:
            if state["context"] is None or state["uses"] >= lowerings:
                state["context"], state["uses"] = make(), 0
            state["uses"] += 1
            return state["context"]

    shared_context.__wrapped__ = make  # type: ignore[attr-defined]
    mlir.make_ir_context = shared_context
