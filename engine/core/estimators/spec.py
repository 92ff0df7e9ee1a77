"""What an estimator is, as data: ``Estimator``, the entry every consumer reads.

An estimator of dW for a dense layer ``Y = X W`` (X ∈ R^{B×N}, R the rank) is fixed by
what its forward pass keeps of X and how its backward pass forms d̂W from that and dY
(dX = dY Wᵀ is exact for all of them). ``sketch`` names the family of that math, run by
``engine.sketch`` (a custom VJP, keys, residual tags, gathering across devices):

- ``none``: keep X, dW = Xᵀ dY (exact backprop);
- ``balanced``, ``uniform``, ``gaussian``: a random S ∈ R^{R×B} (``engine.sketch.draws``),
  keep S X, d̂W = (S X)ᵀ (S dY);
- ``crs``, ``wta-crs``: keep R sampled, weighted rows of X (``engine.sketch.basis.sample_rows``);
- ``projection``: keep X P, P ∈ R^{N×k} random, d̂W = P (X P)ᵀ dY;
- ``compress``: keep ``compression.encode(X, R)``, d̂W = decode(kept)ᵀ dY: the entry's own
  ``Compression`` (array math on the namespace of its input, no framework import), so an
  estimator of this family is one module of this package and nothing else.

Every estimator scales d̂W by the shrink c² = (1 − λ)².
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

SKETCHES = ("none", "balanced", "uniform", "gaussian", "crs", "wta-crs", "projection", "compress")
BIASES = ("none", "unbiased", "biased")  # E[d̂W] = dW exactly; = c² dW; otherwise


class Compression(Protocol):
    """A deterministic or key-free compression of X (B×N, float32) for dW = X̂ᵀ dY.

    Both methods take and return arrays of one array-API namespace
    (``x.__array_namespace__()``): JAX's in training, NumPy in a test."""

    def encode(self, x: Any, rank: int) -> tuple[Any, ...]:
        """What the forward pass keeps of X at rank R (every array is tagged as X's sketch)."""
        ...

    def decode(self, kept: tuple[Any, ...], rows: int, features: int) -> Any:
        """X̂ (B×N) from what ``encode`` kept."""
        ...


@dataclass(frozen=True)
class Estimator:
    """One dW estimator. ``kept_bytes(B, N, R)``: the bytes its backward pass holds for
    dW besides W (float32 arrays; a PRNG key is 8 bytes), the law its memory test checks.
    ``row_space``: its d̂W depends on X only through XXᵀ and its row norms, so X may be
    replaced by X Q for an orthonormal basis Q of its row space (``engine.analysis.diagnostics``)."""

    name: str  # stored with every run: never renamed
    label: str  # one line: what it keeps and how, with its reference
    bias: str  # one of BIASES
    sketch: str  # one of SKETCHES
    kept_bytes: Callable[[int, int, int], int]
    scalars: bool = False  # invariant scalars γ = ‖a‖_F / ‖S a‖_F (hash sketches)
    needs_key: bool = True  # draws from a PRNG key every step
    row_space: bool = True
    compression: Compression | None = None  # the ``compress`` family's math

    def __post_init__(self):
        if self.bias not in BIASES or self.sketch not in SKETCHES:
            raise ValueError(f"estimator {self.name!r}: bias must be one of {BIASES}, sketch one of {SKETCHES}")
        if (self.sketch == "compress") != (self.compression is not None):
            raise ValueError(f"estimator {self.name!r}: a compression goes with sketch='compress', and only there")

    @property
    def exact(self) -> bool:
        """Plain backprop: X kept whole, no key."""
        return self.sketch == "none"

    @property
    def unbiased(self) -> bool:
        """E[d̂W] = c² dW (or dW itself, exact)."""
        return self.bias != "biased"

    @property
    def draws(self) -> str | None:
        """The kind of S ∈ R^{R×B} it draws (``engine.sketch.draws.Sketch.kind``), or None."""
        return self.sketch if self.sketch in ("balanced", "uniform", "gaussian") else None

    @property
    def samples_rows(self) -> bool:
        """Keeps R sampled rows of X (``crs``, ``wta-crs``)."""
        return self.sketch in ("crs", "wta-crs")

    @property
    def draws_together(self) -> bool:
        """Layers can draw their sketches together from one key: the hash sketches."""
        return self.sketch in ("balanced", "uniform")

    @property
    def gathers(self) -> bool:
        """Its d̂W is a product of two R-row factors, which devices can all-gather instead
        of summing each one's dW (hash and Gaussian sketches, sampled rows)."""
        return self.draws is not None or self.samples_rows


def projection_width(rows: int, features: int, rank: int) -> int:
    """k = ⌈R·N/B⌉: the width at which B = ``rows`` rows of k floats hold what R = ``rank``
    rows of N = ``features`` floats do (equal memory at rank R)."""
    return -(-rank * features // rows)
