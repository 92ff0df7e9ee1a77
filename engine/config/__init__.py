"""The run schema: what defines a run (``RunConfig`` and its field metadata), sweeps
over it, identity and labels. Plain Python: no JAX, no Flax (choices and presets come
from ``engine.core``), so ``--help``, the Launch form and every frame builder load fast.

Every field of a run is declared once, in ``engine.config.run``, with a ``FieldSpec``
(``engine.config.fields``: how a field is declared and checked); validation, the CLI's
flags (``engine.cli``) and the Launch widgets (``app.form``) derive from it.
``engine.config.identities.identity`` keys stored configs: which runs compare, which differ by seed.
``engine.config.sweep`` expands a base run over estimators × ranks × λs × seeds;
``engine.config.reproduce`` holds the paper's grid; ``engine.config.tuning`` a tuning campaign's
protocol. A new run field, sweep axis or rule between fields goes here, and every surface
follows. May import ``engine.core`` only.
"""

from engine.config.fields import (
    AFFECTS,
    BOOKKEEPING,
    DATA_OPTIONS,
    GROUPS,
    MEASUREMENT,
    TRAJECTORY,
    ConfigError,
    DataOption,
    FieldSpec,
    FrozenMap,
    spec,
)
from engine.config.identity import comparable_key, differing_fields, seed_group_key, shape_columns, stored
from engine.config.reproduce import (
    PAPER_LAM,
    PAPER_RANKS,
    PAPER_STEPS,
    REPRODUCE_SEEDS,
    REPRODUCE_TAG,
    eval_interval_for,
    reproduction_sweep,
)
from engine.config.run import (
    BOOKKEEPING_NAMES,
    CHECKPOINT_SECONDS,
    EVALS_PER_RUN,
    FUSED_CHUNK,
    MIN_EVAL_TOKENS,
    SEED_END,
    TIME_CHECKPOINT_SLACK,
    RunConfig,
    affects,
    base_type,
    default_of,
    kinds,
    method_label,
    schema,
)
from engine.config.sweep import (
    LARGE_LAUNCH,
    SWEEP_AXES,
    Clip,
    LaunchWarning,
    Sweep,
    from_flat,
    launch_warnings,
    needs_confirmation,
    parse_estimators,
    parse_lams,
    parse_ranks,
    parse_seeds,
    sweep_from_flat,
    to_flat,
)
