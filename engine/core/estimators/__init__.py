"""The dW estimators as data: one ``Estimator`` entry each (``spec``), and the registry
every consumer reads (the names a run may choose, their labels, bias and flags).

The built-in family is ``builtin.BUILTIN``. Any other module of this package that defines
``ESTIMATOR`` (an ``Estimator`` of the ``compress`` family, whose math travels in its
entry) joins the registry after them, in module-name order: adding such an estimator is
that one module plus its tests. No framework is imported here (the run schema, the CLI's
``--help`` and the Launch form read it); ``engine.sketch`` runs each entry's math.
"""

from __future__ import annotations

import importlib
import pkgutil

from engine.core.estimators.builtin import BUILTIN
from engine.core.estimators.spec import Compression, Estimator

__all__ = ["ESTIMATORS", "EXACT", "REGISTRY", "Compression", "Estimator", "described", "is_exact", "lookup"]

_OWN = ("builtin", "spec")


def _discovered() -> tuple[Estimator, ...]:
    """The ``ESTIMATOR`` of every module of this package besides ``_OWN``, by module name."""
    found = []
    for module in sorted(m.name for m in pkgutil.iter_modules(__path__) if m.name not in _OWN):
        entry = getattr(importlib.import_module(f"{__name__}.{module}"), "ESTIMATOR", None)
        if entry is not None:
            found.append(entry)
    return tuple(found)


def _registry(entries: tuple[Estimator, ...]) -> dict[str, Estimator]:
    names = [e.name for e in entries]
    if len(set(names)) != len(names):
        raise ValueError(f"two estimators share a name: {names}")
    return {e.name: e for e in entries}


REGISTRY: dict[str, Estimator] = _registry(BUILTIN + _discovered())
ESTIMATORS: tuple[str, ...] = tuple(REGISTRY)  # the names, the built-in ones first
EXACT = "exact"  # the name of plain backprop, stored with every exact run
assert REGISTRY[EXACT].exact


def lookup(name: str) -> Estimator:
    """The entry of ``name``; ``ValueError`` naming the choices for an unknown one."""
    try:
        return REGISTRY[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown estimator {name!r}; choose one of {', '.join(ESTIMATORS)}") from None


def is_exact(name: object) -> bool:
    """Whether a run's stored ``estimator`` value is plain backprop: None (a record
    without a method) or a name whose entry is exact; False for any other value."""
    if name is None:
        return True
    entry = REGISTRY.get(name) if isinstance(name, str) else None
    return entry is not None and entry.exact


def described() -> str:
    """Every estimator as ``name: label [bias]``, for the CLI's ``--help`` and the Launch form."""
    return "; ".join(f"{e.name}: {e.label}" + ("" if e.exact else f" [{e.bias}]") for e in REGISTRY.values())
