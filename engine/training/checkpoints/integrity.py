"""Proof of a checkpoint's contents: the SHA-256 of every saved array and of the
metadata, written with it and checked on restore (``engine.training.checkpoints``,
"Proof of contents"), and the checks that a restored tree is the run's."""

from __future__ import annotations

import hashlib
import json

import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from engine.errors import BasisLabError
from engine.training.checkpoints.errors import ORBAX_ERRORS

FORMAT = "basis_lab_format"  # custom step metadata: 2 = written with checksums (absent: before them)
CHECKSUMMED = 2
SUMS = "basis_lab_sha256"  # meta key: {array path: SHA-256 hex, "meta": digest of the rest}


class Damaged(BasisLabError, ValueError):
    """A restored array or the metadata does not match the checksum saved with it."""


def array_checksums(state) -> dict[str, str]:
    """``{path: SHA-256 hex}`` of the bytes of every array leaf of ``state`` (as the host
    holds them: C order, the array's own dtype). An array sharded over several
    processes (``jax.distributed``) is gathered whole first, so every process hashes
    the same bytes; that gather is collective, as ``save`` and ``restore`` are."""
    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
        if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
            leaf = multihost_utils.process_allgather(leaf, tiled=True)
        data = np.ascontiguousarray(np.asarray(leaf))
        out[jax.tree_util.keystr(path)] = hashlib.sha256(data.reshape(-1).view(np.uint8).data).hexdigest()
    return out


def meta_digest(extra: dict) -> str:
    return hashlib.sha256(json.dumps(extra, sort_keys=True, allow_nan=False).encode()).hexdigest()


def verify(state, extra: dict, sums: dict | None, *, checksummed: bool) -> None:
    """Raise ``Damaged`` unless ``state``'s arrays and ``extra`` hash to ``sums``.
    ``sums`` None is taken as it is only for a checkpoint of the older format
    (``checksummed`` False): for one of the current format the record was lost."""
    if sums is None:
        if checksummed:
            raise Damaged(f"its checksum record ({SUMS}) is missing")
        return
    if not isinstance(sums, dict):
        raise Damaged(f"its checksum record ({SUMS}) is not a mapping")
    if sums.get("meta") != meta_digest(extra):
        raise Damaged("its metadata does not match its checksum")
    got = array_checksums(state)
    for path in sorted(set(got) | (set(sums) - {"meta"})):
        if got.get(path) != sums.get(path):
            raise Damaged(f"array {path} does not match its checksum")


def declared_format(manager: ocp.CheckpointManager, step: int):
    """The format the checkpoint at ``step`` declares in orbax's step metadata (None:
    none, as before checksums; also when that metadata is unreadable)."""
    try:
        return (manager.metadata(step).custom_metadata or {}).get(FORMAT)
    except ORBAX_ERRORS:  # a missing or damaged step metadata declares nothing
        return None


def check_like(state, target) -> None:
    """Raise ValueError unless ``state`` has ``target``'s tree, shapes and dtypes."""
    got, want = jax.tree.structure(state), jax.tree.structure(target)
    if got != want:  # type: ignore[operator]  # jaxlib's stubs leave PyTreeDef unresolved
        raise ValueError(f"tree {got} differs from the run's {want}")
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(target)):
        if a.shape != b.shape or a.dtype != b.dtype:
            raise ValueError(f"array {a.dtype}{list(a.shape)} where the run has {b.dtype}{list(b.shape)}")


def leaf_types(tree) -> dict[str, str]:
    """``{path: "float32[3, 4]"}`` of every array leaf of ``tree``."""
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {jax.tree_util.keystr(p): f"{x.dtype}{list(x.shape)}" for p, x in leaves}
