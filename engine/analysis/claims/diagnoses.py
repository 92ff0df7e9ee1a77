"""Claims (a) and (b), read from stored estimator diagnoses: the pairs of estimators compared at
each (R, λ), pooled over the diagnoses that hold both, and what K would decide them."""

from __future__ import annotations

import math
from typing import Callable, NamedTuple, TypeVar

import numpy as np
import pandas as pd

from engine.analysis import keystats
from engine.analysis.claims.ratios import (
    INTERVAL,
    NO_EFFECT,
    Pooled,
    Ratio,
    Z,
    key_ratio,
    pooled_mse,
    pooled_variance,
    ratio,
)
from engine.analysis.claims.verdicts import (
    HIGHER,
    INCONCLUSIVE,
    LOWER,
    LOWERING,
    NOT_MEASURED,
    NOT_SUPPORTED,
    SUPPORTED,
    combine,
    lam_text,
)
from engine.core.stats import CONFIDENCE, WITHIN_NOISE
from engine.sketch.basis import hashings_agree

POOLED_LAYER = "all"  # the diagnosis row that pools every sketched layer
HASHING_PAIRS = (("balanced", "countsketch"), ("basis", "scalars"))  # (balanced hashing, uniform hashing), same scalars
SCALAR_PAIRS = (("scalars", "countsketch"), ("basis", "balanced"))  # (with scalars, without), same hashing
EXACT_VARIANCE = 1e-12  # a variance this small is an exact sketch (R = B·T with balanced hashing)
NO_EFFECT_MARGIN = 0.05  # (b): a variance ratio inside [0.95, 1/0.95] is no effect
BIAS_MARGIN = 0.10  # (b): added bias² below 10 % of the MSE without scalars is "a little"
LITTLE, NOT_LITTLE = "a little", "not a little"  # (b): the added bias², by its interval
KEY_VALUES = keystats.KEY_VALUES
BOUND_TEXT = "bound: diagnoses without per-key values, worst-case Gaussian variance"

DIAGNOSIS_COLUMNS = ["diagnosis_id", "run_id", "layer", "estimator", "rank", "lam", "bias2", "variance", "mse", "keys"]


class Compared(NamedTuple):
    """One (R, λ) of an estimator pair: the pooled moments of each, their ratios, the
    added bias² (θ = (b₁² − b₂²)/M₂ with its interval), the diagnoses behind them."""

    rank: int
    lam: float
    bias2: tuple[float, float]  # keys-weighted like M̄
    variance: tuple[Pooled, Pooled]
    mse: tuple[Pooled, Pooled]
    variance_ratio: Ratio
    mse_ratio: Ratio
    diagnoses: int
    keys: tuple[int, ...]
    added_bias: keystats.Interval | None = None
    interval: str = ""  # how the intervals were made, in words

    def name(self) -> str:
        return f"R={self.rank}{lam_text(self.lam)}"


def _pooled_rows(diagnoses: pd.DataFrame) -> pd.DataFrame:
    """The pooled-layer rows with keys (at least 2: a variance needs two draws), λ rounded."""
    if diagnoses is None or diagnoses.empty:
        return pd.DataFrame(columns=DIAGNOSIS_COLUMNS)
    d = diagnoses[diagnoses["layer"] == POOLED_LAYER].copy()
    d["lam"] = d["lam"].astype(float).round(12)
    d["keys"] = pd.to_numeric(d["keys"], errors="coerce").astype(float)
    if KEY_VALUES not in d.columns:
        d[KEY_VALUES] = None
    return d[d["keys"] >= 2]


def _bound_bias(g: pd.DataFrame, mse2: float) -> keystats.Interval:
    """θ from stored bias² and their bound standard errors (old diagnoses), keys-weighted;
    without a stored ``bias2_se``, the same bound from b², V and K: √(4 max(b², 0) V/K + 2 V²/K²)."""
    se = []
    for i in (1, 2):
        k, b2, v = (g[f"{c}_{i}"].to_numpy(float) for c in ("keys", "bias2", "variance"))
        stored = g[f"bias2_se_{i}"].to_numpy(float) if f"bias2_se_{i}" in g else np.full(len(g), np.nan)
        each = np.where(np.isnan(stored), np.sqrt(4 * np.maximum(b2, 0) * v / k + 2 * v**2 / k**2), stored)
        se.append(math.sqrt(float(np.sum((k * each) ** 2))) / float(np.sum(k)))
    k1, k2 = g["keys_1"].to_numpy(float), g["keys_2"].to_numpy(float)
    b1 = float(np.sum(k1 * g["bias2_1"]) / np.sum(k1))
    b2 = float(np.sum(k2 * g["bias2_2"]) / np.sum(k2))
    theta, half = (b1 - b2) / mse2, Z * math.hypot(*se) / mse2
    return keystats.Interval(theta, theta - half, theta + half, keystats.BOUND)


T = TypeVar("T")


def _pair(of: Callable[[int], T]) -> tuple[T, T]:
    """(``of(1)``, ``of(2)``): a quantity of the first and of the second estimator."""
    return of(1), of(2)


def compared(diagnoses: pd.DataFrame, first: str, second: str, margin: float | None = None) -> list[Compared]:
    """Each (R, λ) at which some stored diagnoses hold both ``first`` and ``second``,
    pooled over those diagnoses (``engine.analysis.claims``), by λ then R; the variance ratio read
    with ``margin``. Per-key intervals where every diagnosis behind a group kept its
    per-key values with equal K for both estimators, else the bounds."""
    rows = _pooled_rows(diagnoses)
    a, b = rows[rows["estimator"] == first], rows[rows["estimator"] == second]
    both = a.merge(b, on=["diagnosis_id", "rank", "lam"], suffixes=("_1", "_2"))
    out = []
    for (lam, rank), g in both.groupby(["lam", "rank"], sort=True):
        var = _pair(lambda i: pooled_variance(g[f"variance_{i}"], g[f"keys_{i}"]))
        mse = _pair(lambda i: pooled_mse(g[f"mse_{i}"], g[f"bias2_{i}"], g[f"variance_{i}"], g[f"keys_{i}"]))
        bias2 = _pair(lambda i: float(np.sum(g[f"keys_{i}"] * g[f"bias2_{i}"]) / np.sum(g[f"keys_{i}"])))
        keys = tuple(sorted({int(k) for i in (1, 2) for k in g[f"keys_{i}"]}))
        values = [(v1, v2) for v1, v2 in zip(g[f"{KEY_VALUES}_1"], g[f"{KEY_VALUES}_2"])]
        paired = all(isinstance(v1, np.ndarray) and isinstance(v2, np.ndarray) and v1.shape == v2.shape
                     for v1, v2 in values)
        if paired:
            p1 = [keystats.per_key(v1) for v1, _ in values]
            p2 = [keystats.per_key(v2) for _, v2 in values]
            pk1, pk2 = (keystats.PerKey(*(np.concatenate([getattr(p, f) for p in ps]) for f in keystats.PerKey._fields))
                        for ps in (p1, p2))
            strata = np.repeat(np.arange(len(p1)), [p.keys for p in p1])
            var_ratio = key_ratio(pk1.variance, pk2.variance, strata, margin)
            mse_ratio = key_ratio(pk1.mse, pk2.mse, strata)
            added = (keystats.bias_interval(pk1, pk2, confidence=CONFIDENCE, strata=strata)
                     if pk2.mse.mean() > 0 else None)
            how = (f"per-key delta method, t with {var_ratio.df:.0f} df" if INTERVAL == keystats.DELTA
                   else f"BCa bootstrap over {len(strata)} keys; bias by the per-key delta method")
        else:
            var_ratio, mse_ratio = ratio(*var, margin=margin), ratio(*mse)
            added = _bound_bias(g, mse[1].value) if mse[1].value > 0 else None
            how = BOUND_TEXT
        out.append(Compared(int(rank), float(lam), bias2, var, mse, var_ratio, mse_ratio,
                            int(g["diagnosis_id"].nunique()), keys, added, how))
    return out


def _basis_text(groups: list[Compared]) -> str:
    counts = sorted({g.diagnoses for g in groups})
    keys = sorted({k for g in groups for k in g.keys})
    hows = list(dict.fromkeys(g.interval for g in groups))
    return (f"{'/'.join(map(str, counts))} diagnos{'is' if counts == [1] else 'es'}, {'/'.join(map(str, keys))} keys; "
            f"intervals: {' / '.join(hows)}")


def hashing(table3: pd.DataFrame, diagnoses: pd.DataFrame, step_times: pd.DataFrame) -> tuple[str, str]:
    results = []
    for first, second in HASHING_PAIRS:
        groups = [g for g in compared(diagnoses, first, second)
                  if not hashings_agree(g.rank) and max(g.variance[0].value, g.variance[1].value) > EXACT_VARIANCE]
        if not groups:
            results.append((NOT_MEASURED, ""))
            continue
        verdict = combine([(LOWERING[g.variance_ratio.reading], "") for g in groups])[0]
        parts = [f"{g.name()} {g.variance[0].value:.3g} vs {g.variance[1].value:.3g}, ratio {g.variance_ratio.text()}"
                 for g in groups]
        results.append((verdict, f"variance {first} vs {second} ({_basis_text(groups)}): " + "; ".join(parts)))
    return combine(results)


def _bias_reading(added: keystats.Interval | None) -> str:
    if added is None:
        return WITHIN_NOISE
    return LITTLE if added.high < BIAS_MARGIN else NOT_LITTLE if added.low > BIAS_MARGIN else WITHIN_NOISE


def _scalars_verdict(g: Compared) -> str:
    """(b) on one group: both halves (``engine.analysis.claims``)."""
    variance, bias = g.variance_ratio.reading, _bias_reading(g.added_bias)
    if variance in (HIGHER, NO_EFFECT) or g.mse_ratio.reading == HIGHER or bias == NOT_LITTLE:
        return NOT_SUPPORTED
    return SUPPORTED if variance == LOWER and bias == LITTLE else INCONCLUSIVE


def scalars(table3: pd.DataFrame, diagnoses: pd.DataFrame, step_times: pd.DataFrame) -> tuple[str, str]:
    results = []
    for first, second in SCALAR_PAIRS:
        groups = [g for g in compared(diagnoses, first, second, margin=NO_EFFECT_MARGIN)
                  if g.variance[1].value > EXACT_VARIANCE]
        if not groups:
            results.append((NOT_MEASURED, ""))
            continue
        verdict = combine([(_scalars_verdict(g), "") for g in groups])[0]
        parts = []
        for g in groups:
            added = g.added_bias
            bias_text = ("no interval" if added is None else
                         f"added {added.value:+.3g} [{added.low:+.3g}, {added.high:+.3g}] of the MSE without, "
                         f"{_bias_reading(added)}")
            parts.append(f"{g.name()} bias² {g.bias2[0]:.2g} vs {g.bias2[1]:.2g} ({bias_text}), variance "
                         f"{g.variance[0].value:.3g} vs {g.variance[1].value:.3g} ratio {g.variance_ratio.text()}, "
                         f"MSE {g.mse[0].value:.3g} vs {g.mse[1].value:.3g} ratio {g.mse_ratio.text()}")
        results.append((verdict, f"{first} vs {second} ({_basis_text(groups)}): " + "; ".join(parts)))
    return combine(results)


def keys_plan(table3: pd.DataFrame, diagnoses: pd.DataFrame, step_times: pd.DataFrame) -> str:
    """The keys a diagnosis needs to detect a variance ratio of ``keystats.PLAN_RATIO`` with
    ``keystats.PLAN_POWER`` (``keystats.keys_for_power``), and the power the stored diagnoses' K gives."""
    need = keystats.DEFAULT_KEYS
    text = (f"{need} keys per diagnosis detect a variance ratio of {keystats.PLAN_RATIO:g} with probability "
            f"{keystats.PLAN_POWER:.0%} (per-key CV {keystats.PLAN_CV:g}; python -m engine diagnose RUN --keys {need})")
    keys = pd.to_numeric(diagnoses.get("keys", pd.Series(dtype=float)), errors="coerce").dropna()
    if not keys.empty:
        k = int(keys.min())
        text += f"; the stored diagnoses' K = {k} gives {keystats.power(keystats.PLAN_RATIO, max(k, 2)):.0%}"
    return text
