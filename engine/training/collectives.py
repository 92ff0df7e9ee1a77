"""The collectives of a compiled step, read from its HLO text (``compiled.as_text()``).

Every instruction ``%name = <shape> <op>(...)`` whose op is a cross-device collective
(``all-reduce``, ``all-gather``, ``reduce-scatter``, ``all-to-all``,
``collective-permute``, or their ``-start`` halves) becomes a ``Collective`` with the
bytes of the array it carries: for an all-gather its (gathered) result, for the others
their result too (an all-reduce's result is its operand; a reduce-scatter's is 1/D of
it, so its operand is D times that). Tuple shapes (several arrays in one combined
collective) add up. ``ring_bytes`` turns that into what each of D devices sends under
the ring algorithms:

    all-reduce S: 2·(D − 1)/D · S     all-gather to S: (D − 1)/D · S
    reduce-scatter of S: (D − 1)/D · S    all-to-all S: (D − 1)/D · S   permute S: S
"""

from __future__ import annotations

import re
from dataclasses import dataclass

OPS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4,
          "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16}
_INSTRUCTION = re.compile(
    r"=\s*(?P<shape>\(.*?\)|[a-z0-9]+\[[0-9,]*\](?:\{[^}]*\})?)\s+(?P<op>" + "|".join(OPS) + r")(?P<start>-start)?\("
)
_ARRAY = re.compile(r"\b(?P<dtype>[a-z]+[0-9]*)\[(?P<dims>[0-9,]*)\]")


@dataclass(frozen=True)
class Collective:
    op: str  # one of OPS
    shapes: tuple[tuple[str, tuple[int, ...]], ...]  # (dtype, dims) of every array it carries
    bytes: int  # the bytes of those arrays (for a reduce-scatter: of its operand)

    def ring_bytes(self, devices: int) -> float:
        """Bytes each of ``devices`` sends for it under the ring algorithm."""
        share = (devices - 1) / devices
        return {"all-reduce": 2 * share, "collective-permute": 1.0}.get(self.op, share) * self.bytes


def _arrays(shape: str) -> tuple[tuple[str, tuple[int, ...]], ...]:
    out = []
    for m in _ARRAY.finditer(shape):
        if m.group("dtype") in _BYTES:
            out.append((m.group("dtype"), tuple(int(d) for d in m.group("dims").split(",") if d)))
    return tuple(out)


def _nbytes(arrays) -> int:
    total = 0
    for dtype, dims in arrays:
        n = 1
        for d in dims:
            n *= d
        total += n * _BYTES[dtype]
    return total


def collectives(hlo_text: str, devices: int) -> list[Collective]:
    """Every collective instruction of ``hlo_text`` (``-done`` halves are not counted twice)."""
    out = []
    for line in hlo_text.splitlines():
        m = _INSTRUCTION.search(line)
        if not m:
            continue
        op, arrays = m.group("op"), _arrays(m.group("shape"))
        if m.group("start") and op == "all-gather" and len(arrays) == 2:
            arrays = arrays[1:]  # an all-gather-start's shape is (operand, result)
        size = _nbytes(arrays)
        if op == "reduce-scatter":
            size *= devices
        out.append(Collective(op, arrays, size))
    return out


def bytes_by_op(hlo_text: str, devices: int) -> dict[str, dict[str, float]]:
    """``{op: {"count", "bytes", "ring_bytes"}}`` over the collectives of ``hlo_text``."""
    table: dict[str, dict[str, float]] = {}
    for c in collectives(hlo_text, devices):
        row = table.setdefault(c.op, {"count": 0, "bytes": 0, "ring_bytes": 0.0})
        row["count"] += 1
        row["bytes"] += c.bytes
        row["ring_bytes"] += c.ring_bytes(devices)
    return table
