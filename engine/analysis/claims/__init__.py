"""The paper's claims, and the stated rules by which the stored data support them. A new claim
is an entry of ``rules.CLAIMS`` (its sentence, rule, judge and plan); the tests it reads
(ratios, trends, matching rows) live beside it.

Each claim is a sentence, a rule (printed under the claims table of every report),
and a pure function of three tables that returns a verdict with the numbers behind it:

* ``table3``: ``engine.analysis.summary.table3`` (paired Δ vs exact, its 95 %
  t-interval, saved-for-backward bytes, per method);
* ``diagnoses``: estimator diagnosis rows (``DIAGNOSIS_COLUMNS``: per stored
  diagnosis, layer, estimator, R and λ, the squared bias, variance and MSE of dW
  relative to ‖dW‖², ``engine.analysis.diagnostics``, and the number of sketch keys K
  behind them);
* ``step_times``: the mean train-step time per method (``STEP_TIME_COLUMNS``,
  ``engine.analysis.method_frames.step_time_frame``);

and, for the claims that name them in ``Claim.options``, ``timings`` (each run's own
step times, whether another stored run shared its machine meanwhile, and the host load it
recorded against the host's cores, ``engine.analysis.method_frames.run_time_frame``)
and ``margin`` (δ, the equivalence margin of a Δ val, ``engine.core.stats.MARGIN``).

A verdict also says what would decide it (``Verdict.power``): the seeds (or runs) that
reach 80 % power at the spread observed (a stated prior when nothing is observed); for (c),
only under a Table 3 row that is still "inconclusive", at that row's own Δ spread, both if it
truly matches and if its true Δ is the one observed (a decided row says "decided").

A verdict is ``supported``, ``inconclusive``, ``not supported`` or ``not measured``.
Where a claim is checked on several groups (each λ and setup, each estimator pair and
rank), it is supported when every measured group supports it, not supported when any
measured group contradicts it, inconclusive when neither (some group is within noise,
none contradicts), and not measured when no group could be measured. The thresholds
are data (``MATCH_RANK``, ``MATCH_DELTA``, ``MEMORY_FALL``, ``TIME_FALL``,
``CONFIDENCE``), named in the rules.

Claims (a) and (b) compare two estimators' dW variance V, MSE M and squared bias b²
(relative to ‖dW‖², ``engine.analysis.diagnostics``: V = 1/(K−1) Σ_k ‖e_k − ē‖²,
M = (1/K) Σ_k ‖e_k‖², b² = M − V over K sketch keys, e_k = d̂W_k − dW) on the same
states, batches and keys. A diagnosis stores every key's values
(``engine.analysis.keystats``), and estimators that differ in one component share their
keys, so each ratio V₁/V₂ and M₁/M₂ is a ratio of two paired per-key means, and its
95 % interval comes from the per-key values: by default the delta method with a t
quantile (``INTERVAL``, ``keystats.ratio_interval``; the BCa bootstrap over keys is the
other choice); the diagnoses j that hold both estimators at an (R, λ) are pooled, their
keys combined as independent strata. The bias half of (b) reads θ = (b₁² − b₂²)/M₂, the
bias² the scalars add as a share of the MSE without them, with its per-key delta-method
t interval (``keystats.bias_interval``). Each verdict names the interval it used.

Diagnoses stored before per-key values (``key_values`` None) keep the old intervals,
marked as bounds: if e_k ~ N(b, Σ) with tr Σ = V,

    Var V = 2 tr(Σ²)/(K−1) ≤ 2 V²/(K−1),
    Var M = (2 tr(Σ²) + 4 bᵀΣb)/K ≤ (2 V² + 4 max(b², 0) V)/K,

by tr(Σ²) ≤ (tr Σ)² and bᵀΣb ≤ ‖b‖² tr Σ (equality only when Σ has rank one, so these
are 5–8× too wide for errors that spread over many directions), pooled over diagnoses
as (``pooled_variance``, ``pooled_mse``)::

    V̄ = Σ_j (K_j−1) V_j / Σ_j (K_j−1),   Var V̄ / V̄² = 2/ν,   ν = (Σ_j (K_j−1) V_j)² / Σ_j (K_j−1) V_j²
    M̄ = Σ_j K_j M_j / Σ_j K_j,           Var M̄ = Σ_j K_j (2 V_j² + 4 max(b_j², 0) V_j) / (Σ_j K_j)²

and the ratio's interval x₁/x₂ · exp(± z √(Var x₁/x₁² + Var x₂/x₂²)), z = Φ⁻¹(0.975)
(``ratio``); the bias half uses the stored bias2_se, also a bound.

A ratio is "lower" when its interval lies below 1, "higher" when above, else "within
noise"; for (b)'s variance, "no effect" when the interval lies inside
[1 − NO_EFFECT_MARGIN, 1/(1 − NO_EFFECT_MARGIN)]. The added bias is "a little" when its
interval lies below BIAS_MARGIN, "not a little" when above. (a) leaves out every rank
where balanced and uniform hashing are the same distribution (R = 1,
``engine.sketch.basis.hashings_agree``) and ranks where both are exact. A claim
supported only when every group is significantly lower is an intersection–union test,
so it keeps the 95 % level however many groups there are; a contradiction is read per
group at 95 %, not corrected for the number of groups.

The modules: ``verdicts`` (the verdict words and how groups combine), ``ratios`` (the
intervals of the ratios), ``diagnoses`` ((a), (b)), ``matching`` ((c)), ``trends`` ((d),
(e)) and ``rules`` (``CLAIMS``, ``judge``); this package re-exports their public names.
"""

from engine.analysis.claims.diagnoses import (
    BIAS_MARGIN,
    BOUND_TEXT,
    DIAGNOSIS_COLUMNS,
    EXACT_VARIANCE,
    HASHING_PAIRS,
    KEY_VALUES,
    LITTLE,
    NO_EFFECT_MARGIN,
    NOT_LITTLE,
    POOLED_LAYER,
    SCALAR_PAIRS,
    Compared,
    compared,
)
from engine.analysis.claims.matching import MATCH_DELTA, MATCH_RANK
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
from engine.analysis.claims.rules import CLAIMS, STEP_TIME_COLUMNS, Claim, Verdict, judge, verdict_frame
from engine.analysis.claims.trends import MEMORY_FALL, TIME_FALL
from engine.analysis.claims.verdicts import (
    CLAIM_ESTIMATOR,
    HIGHER,
    INCONCLUSIVE,
    LOWER,
    LOWERING,
    NOT_MEASURED,
    NOT_SUPPORTED,
    SUPPORTED,
    VERDICTS,
)
