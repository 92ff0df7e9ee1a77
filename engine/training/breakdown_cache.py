"""Saved-activation breakdowns kept beside the compiled programs, so a run's memory figures cost a file read.

``engine.model.memory.memory_breakdown`` lists the residuals a model's step keeps by tracing it:
two traces a run (its own model's and exact backprop's), about 0.3 CPU s at the paper preset on
the 2-core CPU, paid again by every run process. What it returns depends only on the model
config, the batch's shape and dtype, whether a sketch key is passed, and the code it traces, so
``cached(memo, compute)`` keeps each breakdown in ``<compilation cache>/memory/<digest>.json``
(``engine.training.compile_cache``; JAX's own entries there are the ``*-cache`` files, which
this folder never touches). The digest covers ``memo`` and the source of every module the
trace runs (``engine.model``, ``engine.sketch``, ``engine.core``) with the JAX and Flax
versions: a change of any of them is a new entry, never a stale figure.

With the compilation cache off it computes every time. A file that cannot be read (a process
killed mid-write, a disk error) is computed again and rewritten; writes are atomic (a
temporary file renamed), so two processes writing one entry leave one whole file.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
from pathlib import Path
from typing import Callable

from engine.core.files import atomic_write_text
from engine.training import compile_cache

log = logging.getLogger(__name__)

SUBFOLDER = "memory"
TRACED = ("model", "sketch", "core")  # the packages of ``engine`` whose code a breakdown's trace runs


@functools.lru_cache(maxsize=1)
def code_digest() -> str:
    """``digest_of`` the installed ``engine`` (once per process)."""
    return digest_of(Path(__file__).resolve().parents[1])


def digest_of(root: Path) -> str:
    """A digest of the source of ``root``'s ``TRACED`` packages and the JAX and Flax versions."""
    import flax
    import jax

    h = hashlib.sha256(f"jax {jax.__version__} flax {flax.__version__}".encode())
    for package in TRACED:
        for path in sorted((root / package).rglob("*.py")):
            h.update(str(path.relative_to(root)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()


def entry(memo: str) -> Path | None:
    """The file of breakdown ``memo`` (its model, shapes and key, as text), or None with the cache off."""
    folder = compile_cache.enable()
    if folder is None:
        return None
    digest = hashlib.sha256(f"{code_digest()}\n{memo}".encode()).hexdigest()
    return Path(folder) / SUBFOLDER / f"{digest}.json"


def cached(memo: str, compute: Callable[[], dict[str, int]]) -> dict[str, int]:
    """The breakdown ``memo`` names: read from its file, else ``compute()``d and written there."""
    path = entry(memo)
    if path is None:
        return compute()
    try:
        stored = json.loads(path.read_text())
        if stored.get("memo") == memo:
            return {str(k): int(v) for k, v in stored["bytes"].items()}
    except FileNotFoundError:
        pass
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        log.warning("memory figures computed again: %s unreadable (%s)", path, e)
    out = compute()
    _write(path, {"memo": memo, "bytes": out})
    return out


def _write(path: Path, value: dict) -> None:
    """Write ``value`` to ``path`` as JSON, atomically; a failure costs only the next read."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(value))
    except OSError as e:
        log.warning("memory figures not kept: %s (%s)", path, e)
