"""CPython's cyclic garbage collector in the suite's own processes (pytest's workers and
``tests.support.scale_checks``).

Tracing, lowering and compiling JAX programs allocates objects by the million. At the
default thresholds (700, 10, 10) the collector ran 4,777 collections in one process running
``test_basis.py``, ``test_draws.py`` and ``test_memory.py``, and took 6.0 of its 117 CPU s,
mostly walking the same long-lived objects (modules, JAX's caches, collected tests) again.
``tune`` raises the thresholds and ``freeze`` moves everything alive at that point out of the
collector's reach: 347 collections, 0.5 CPU s. Only when unreachable cycles are freed
changes, never what a test computes.
"""

import gc

THRESHOLDS = (100_000, 50, 100)  # allocations before a young collection; young collections per older one


def tune() -> None:
    """Collect less often (``THRESHOLDS``)."""
    gc.set_threshold(*THRESHOLDS)


def freeze() -> None:
    """Free what is garbage now, then exempt every live object from later collections."""
    gc.collect()
    gc.freeze()
