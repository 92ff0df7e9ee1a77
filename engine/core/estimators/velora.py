"""VeLoRA: rank-1 sub-token projection of X (Miles et al., "VeLoRA: Memory Efficient
Training using Rank-1 Sub-Token Projections", NeurIPS 2024).

Each token x_b ∈ R^N is cut into g sub-tokens x_bj ∈ R^s (s = N/g), each kept as one
scalar, its coefficient on a unit vector v ∈ R^s::

    c_bj = ⟨x_bj, v⟩,   x̂_bj = c_bj v,   d̂W = c² X̂ᵀ dY,   c = 1 − λ.

v is the unit mean sub-token of the step's batch, v = m/‖m‖ with m = mean_{b,j} x_bj
(e_1 when m = 0). The paper fixes v from the first batch; here it is taken afresh from
each step's X, so d̂W is a pure function of the step's X and dY (resuming, cohorts and a
diagnosis replay a step from its inputs alone) and no key is drawn.

With Π = I_g ⊗ v vᵀ (the orthogonal projector onto span(v) in every sub-token),
X̂ = X Π and d̂W = c² Π dW: the exact gradient with each block of s rows projected onto
v. Deterministic and biased: the bias is −(I − Π) dW (at c = 1), zero exactly when every
block of s rows of dW lies on span(v) (so whenever every sub-token of X does), and ‖d̂W‖_F ≤ c² ‖dW‖_F. Rank R sets g, at equal memory with
the row sketches (R·N floats): the largest divisor of N with g ≤ ⌈R·N/B⌉, so the kept
coefficients are B·g scalars (plus v, s floats). At R ≥ B, g = N and s = 1: exact up to c².
"""

from __future__ import annotations

from typing import Any

from engine.core.estimators.spec import Estimator, projection_width


def groups(rows: int, features: int, rank: int) -> int:
    """g: the largest divisor of N = ``features`` not above ⌈R·N/B⌉ (at least 1)."""
    target = min(features, max(1, projection_width(rows, features, rank)))
    return max(d for d in range(1, target + 1) if features % d == 0)


class SubTokenProjection:
    """The ``Compression`` of VeLoRA (module docstring), on any array-API namespace."""

    def encode(self, x: Any, rank: int) -> tuple[Any, Any]:
        """(coefficients c (B×g), v (s,)) of X (B×N)."""
        xp = x.__array_namespace__()
        rows, features = x.shape
        g = groups(rows, features, rank)
        sub = xp.reshape(x, (rows * g, features // g))
        mean = xp.mean(sub, axis=0)
        norm = xp.sqrt(xp.sum(mean * mean))
        first = xp.astype(xp.arange(mean.shape[0]) == 0, x.dtype)
        v = xp.where(norm > 0, mean / xp.where(norm > 0, norm, 1.0), first)
        return xp.reshape(sub @ v, (rows, g)), v

    def decode(self, kept: tuple[Any, ...], rows: int, features: int) -> Any:
        """X̂ = c_bj v, reassembled to B×N."""
        coefficients, v = kept
        xp = v.__array_namespace__()
        return xp.reshape(coefficients[:, :, None] * v[None, None, :], (rows, features))


def kept_bytes(rows: int, features: int, rank: int) -> int:
    """4·(B·g + s): the float32 coefficients and v."""
    g = groups(rows, features, rank)
    return 4 * (rows * g + features // g)


ESTIMATOR = Estimator(
    "velora", "VeLoRA: rank-1 projection of each sub-token on the batch's mean sub-token (Miles et al. 2024)",
    "biased", "compress", kept_bytes, needs_key=False, row_space=False, compression=SubTokenProjection(),
)
