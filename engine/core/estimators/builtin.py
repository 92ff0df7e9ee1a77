"""The estimators of the paper and its peers (``engine.sketch.basis`` has their math).

"Rank R" means R rows' worth of X, R·N floats, so methods compare at equal memory;
c = 1 − λ. Hash sketches have S[r, b] = s(b)·[h(b) = r] with Rademacher signs s, h
uniform or balanced (a permutation of arange(B) mod R); E[SᵀS] = I, so without the
invariant scalars γ the estimate is c²-unbiased. Row sampling keeps x̃ = c²·diag(w)·X[i]
and the indices (4 bytes each); ``proj`` keeps X P with k = ⌈R·N/B⌉ columns, or X
itself (exact up to c²) when k ≥ N.
"""

from __future__ import annotations

from engine.core.estimators.spec import Estimator, projection_width

KEY_BYTES = 8


def _whole(b: int, n: int, r: int) -> int:
    return 4 * b * n


def _sketch(b: int, n: int, r: int) -> int:
    return 4 * min(r, b) * n + KEY_BYTES


def _rows(b: int, n: int, r: int) -> int:
    return 4 * min(r, b) * n + 4 * min(r, b)


def _projected(b: int, n: int, r: int) -> int:
    k = projection_width(b, n, min(r, b))
    return 4 * b * k + KEY_BYTES if k < n else 4 * b * n


BUILTIN = (
    Estimator("exact", "exact backprop: keeps X, dW = Xᵀ dY", "none", "none", _whole,
              needs_key=False),
    Estimator("basis", "BASIS: balanced hash sketch of X and dY with invariant scalars", "biased",
              "balanced", _sketch, scalars=True),
    Estimator("countsketch", "CountSketch: uniform hash sketch of X and dY", "unbiased", "uniform", _sketch),
    Estimator("balanced", "balanced hash sketch of X and dY, no scalars", "unbiased", "balanced", _sketch),
    Estimator("scalars", "uniform hash sketch of X and dY with invariant scalars", "biased", "uniform",
              _sketch, scalars=True),
    Estimator("gaussian", "Gaussian sketch S with N(0, 1/R) entries", "unbiased", "gaussian", _sketch),
    Estimator("crs", "column-row sampling, p ∝ ‖x_b‖ (Adelman et al. 2021)", "unbiased", "crs", _rows),
    Estimator("wta-crs", "winner-take-all column-row sampling (Liu et al. 2023)", "unbiased", "wta-crs", _rows),
    Estimator("proj", "random feature projection X P (RAD, CompAct)", "unbiased", "projection", _projected,
              row_space=False),
)
