"""The claims themselves (``CLAIMS``: sentence, rule, judge, plan) and ``judge``, which reads
every one of them on the tables (``engine.analysis.claims``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import pandas as pd

from engine.analysis.claims.diagnoses import (
    BIAS_MARGIN,
    DIAGNOSIS_COLUMNS,
    NO_EFFECT_MARGIN,
    hashing,
    keys_plan,
    scalars,
)
from engine.analysis.claims.matching import MATCH_DELTA, MATCH_RANK, match_plan, matches_exact
from engine.analysis.claims.ratios import Z
from engine.analysis.claims.trends import MEMORY_FALL, TIME_FALL, memory, step_time, time_plan
from engine.core.stats import CONFIDENCE, EQUIVALENCE_ALPHA, MARGIN

STEP_TIME_COLUMNS = ["estimator", "rank", "lam", "setup", "seeds", "mean", "std"]


@dataclass(frozen=True)
class Claim:
    """One of the paper's claims: a key (``a``–``e``), its sentence and its rule."""

    key: str
    sentence: str
    rule: str | Callable[[float], str]  # a callable takes the margin δ
    judge: Callable[..., tuple[str, str]]  # (table3, diagnoses, step_times, **options) -> (verdict, evidence)
    options: tuple[str, ...] = ()  # keyword arguments of ``judge`` beyond the three tables (``timings``, ``margin``)
    plan: Callable[..., str] | None = None  # (table3, diagnoses, step_times, **options) -> what would decide it

    def rule_text(self, margin: float = MARGIN) -> str:
        return self.rule(margin) if callable(self.rule) else self.rule


@dataclass(frozen=True)
class Verdict:
    key: str
    sentence: str
    verdict: str
    evidence: str
    rule: str
    power: str = ""  # the seeds (or keys, runs) that would decide it at the observed spread


CLAIMS = (
    Claim("a", "Balanced hashing lowers the variance of the dW estimate.",
          "(a) is supported when, in the stored estimator diagnoses (all sketched layers pooled; the diagnoses that "
          "hold both estimators of a pair pooled, their keys combined), balanced hashing has a significantly lower dW "
          "variance than uniform hashing at every rank and λ measured with both, for each pair measured (balanced vs "
          f"countsketch; basis vs scalars): the {100 * CONFIDENCE:g} % interval of the variance ratio V₁/V₂ lies below "
          "1. Ranks where the two hashings are the same distribution (R = 1: one bin holds every row) and ranks where "
          "both are exact are left out. The interval comes from each sketch key's ‖e − ē‖², which the two estimators "
          "share keys for (paired): the delta method of the log ratio with a t quantile (or a BCa bootstrap over "
          "keys), as the numbers say; a diagnosis stored without per-key values gives the old bound "
          f"V₁/V₂ · exp(± {Z:.2f} √(2/ν₁ + 2/ν₂)), ν = K − 1, marked 'bound'. Not supported when at some rank the "
          "interval lies above 1; inconclusive when neither (some interval holds 1, none lies above it); not measured "
          "when no diagnosis holds such a pair.", hashing, plan=keys_plan),
    Claim("b", "The invariant scalars trade a little bias for lower variance.",
          "(b) tests both halves against the same hashing without the scalars (scalars vs countsketch; basis vs "
          "balanced), at every rank and λ measured with both, pooled as in (a) (ranks where the estimator without "
          "scalars is exact are left out). Lower variance: the "
          f"{100 * CONFIDENCE:g} % interval of the variance ratio V₁/V₂ (as in (a); scalars on and off share S) lies "
          f"below 1; it is no effect when it lies inside [{1 - NO_EFFECT_MARGIN:g}, {1 / (1 - NO_EFFECT_MARGIN):.4g}]. "
          "A little bias: the interval of the bias² the scalars add, (b₁² − b₂²)/M₂ as a share of the MSE without "
          f"them (b² = M − V per key, delta method, t quantile), lies below {BIAS_MARGIN:g}; not a little when it "
          f"lies above {BIAS_MARGIN:g}. Supported when at every rank the variance is lower and the bias a little, "
          "and the MSE ratio's interval does not lie above 1; not supported when at some rank the variance is higher "
          "or no effect, the bias not a little, or the MSE higher; inconclusive otherwise; not measured when no "
          "diagnosis holds such a pair. Old diagnoses without per-key values use the bounds of (a) and their stored "
          "standard error of b², marked 'bound'.", scalars, plan=keys_plan),
    Claim("c", f"BASIS at R = {MATCH_RANK} matches exact backprop.", lambda margin: (
          f"(c) is an equivalence claim, tested by two one-sided t-tests (TOST, each at "
          f"{100 * EQUIVALENCE_ALPHA:g} %) on Δ, the validation loss of basis at R = {MATCH_RANK} minus exact paired "
          f"over seeds (Table 3): supported when the 90 % interval of Δ lies inside ±δ, δ = {margin:g} nats; not "
          "supported when it lies wholly above +δ or wholly below −δ (|Δ| > δ at 5 %); inconclusive otherwise (more "
          f"seeds decide: see the seeds needed); not measured without a basis R = {MATCH_RANK} row with at least two "
          f"paired seeds. The default δ, {MATCH_DELTA:g} nats (set with --margin), is no more than exact backprop's "
          "own seed-to-seed SD of validation loss in this lab's CPU reproductions (0.01–0.026 nats): a difference "
          "inside ±δ is one that reseeding exact backprop makes."),
          matches_exact, options=("margin",), plan=match_plan),
    Claim("d", "Activation memory falls with R: the fewer rows a sketch keeps, the fewer bytes the backward pass holds.",
          f"(d) is supported when, for basis (each λ and setup), the bytes saved for backward never decrease as R "
          f"grows over the ranks measured, the smallest R saves at least {100 * MEMORY_FALL:g} % of exact's bytes "
          "less than the largest R, and less than exact; not supported otherwise; not measured with fewer than two "
          "ranks.", memory,
          plan=lambda *_: "deterministic: the compiled step's bytes do not depend on the seed; one run per rank "
                          "decides it"),
    Claim("e", "Step time falls with R: a smaller sketch makes a faster train step.",
          "(e) is supported when, for basis (each λ and setup), over the runs that trained alone (a run that "
          "overlapped another stored run, of any selection, on the same machine, or whose host load (the 1-minute "
          "load average it recorded, the median over its timed windows) exceeded the host's cores, times the "
          "sharing, not the method, and is left out; when that leaves too few runs it is not measured (machine "
          "shared), with the load shown), the "
          "least-squares slope b of each run's median step time (over its evaluation windows, train steps only) on "
          "R gives a change across the ranks, b·(R_max − R_min), whose 95 % t-interval (n − 2 degrees of freedom) "
          f"lies above 0; not supported when its 90 % interval lies within ±{100 * TIME_FALL:g} % of the largest "
          "R's step time (no material change) or its 95 % interval lies below 0; inconclusive otherwise; not "
          "measured with fewer than 3 runs timed alone at 2 ranks or more.", step_time, options=("timings",),
          plan=time_plan),
)


def judge(table3: pd.DataFrame, diagnoses: pd.DataFrame | None = None,
          step_times: pd.DataFrame | None = None, *, timings: pd.DataFrame | None = None,
          margin: float = MATCH_DELTA) -> list[Verdict]:
    """The verdict of every claim in ``CLAIMS`` on the given tables (``engine.analysis.claims``), with
    what would decide it; ``timings``: ``method_frames.run_time_frame`` (None: (e) is not measured);
    ``margin``: δ of claim (c)."""
    diagnoses = pd.DataFrame(columns=DIAGNOSIS_COLUMNS) if diagnoses is None else diagnoses
    step_times = pd.DataFrame(columns=STEP_TIME_COLUMNS) if step_times is None else step_times
    context = {"timings": timings, "margin": margin}
    out = []
    for c in CLAIMS:
        options = {k: context[k] for k in c.options}
        verdict, evidence = c.judge(table3, diagnoses, step_times, **options)
        power = c.plan(table3, diagnoses, step_times, **options) if c.plan is not None else ""
        out.append(Verdict(c.key, c.sentence, verdict, evidence, c.rule_text(margin), power))
    return out


def verdict_frame(verdicts: list[Verdict]) -> pd.DataFrame:
    """The claims table: claim, verdict, the numbers behind it."""
    return pd.DataFrame({"claim": [f"({v.key}) {v.sentence}" for v in verdicts],
                         "verdict": [v.verdict for v in verdicts],
                         "numbers": [v.evidence for v in verdicts]})
