"""What a claim's verdict can be, and how a claim's verdict follows from those of its groups
(``engine.analysis.claims``)."""

from __future__ import annotations

import pandas as pd

from engine.core.stats import WITHIN_NOISE

SUPPORTED, INCONCLUSIVE, NOT_SUPPORTED, NOT_MEASURED = "supported", "inconclusive", "not supported", "not measured"
VERDICTS = (SUPPORTED, INCONCLUSIVE, NOT_SUPPORTED, NOT_MEASURED)
LOWER, HIGHER = "lower", "higher"  # a ratio's interval below / above 1 (else WITHIN_NOISE)
LOWERING = {LOWER: SUPPORTED, WITHIN_NOISE: INCONCLUSIVE, HIGHER: NOT_SUPPORTED}  # a claim that x₁ < x₂, by its ratio
CLAIM_ESTIMATOR = "basis"  # claims (c)–(e) are about BASIS


def combine(results: list[tuple[str, str]]) -> tuple[str, str]:
    """(verdict, evidence) of a claim from those of its groups (``engine.analysis.claims``)."""
    measured = [r for r in results if r[0] != NOT_MEASURED]
    if not measured:
        return NOT_MEASURED, "; ".join(e for _, e in results if e) or "no data"
    verdicts = {v for v, _ in measured}
    verdict = NOT_SUPPORTED if NOT_SUPPORTED in verdicts else SUPPORTED if verdicts == {SUPPORTED} else INCONCLUSIVE
    return verdict, "; ".join(e for _, e in measured)


def lam_text(lam) -> str:
    return f" λ={float(lam):g}" if pd.notna(lam) and float(lam) else ""


def group_name(estimator, lam, setup) -> str:
    return f"{estimator}{lam_text(lam)}" + (f" [{setup}]" if isinstance(setup, str) and setup else "")
