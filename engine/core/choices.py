"""Names of every choice a run (or its report) makes, as plain data: the one list each
widget, flag and check reads. What each name does lives with its implementation (``engine.sketch``,
``engine.model``, ``engine.training``, ``engine.data``)."""

from engine.core.estimators import ESTIMATORS as ESTIMATORS  # the registry's names (engine.core.estimators)

SKETCHED_LAYER_CHOICES = ("mlp+head", "mlp", "all", "none")
SKETCHED_GROUPS = {  # sketched_layers → the dense-layer groups it sketches
    "mlp+head": frozenset({"mlp", "head"}),
    "mlp": frozenset({"mlp"}),
    "all": frozenset({"mlp", "head", "attn"}),
    "none": frozenset(),
}
DTYPES = ("float32", "bfloat16")
REMAT_POLICIES = ("none", "dots_saveable", "full")
ATTENTION_CHOICES = ("xla", "recompute")
OPTIMIZERS = ("sgd", "adamw")
SOURCES = ("classics", "fineweb-edu", "files")
COHORT_SETTINGS = ("auto", "on", "off")  # whether workers train a sweep's seeds as one program (engine.runner.cohorts)
DW_COMMS = ("all-reduce", "sketch")  # how the devices of one run combine a sketched layer's dW
SUMMARY_FORMATS = ("table", "csv", "markdown", "latex")  # of Table 3: engine.reads.queries.table3_text
# δ, nats/token: the default equivalence margin of a Δ val loss vs exact (engine.core.stats, where it is argued)
EQUIVALENCE_MARGIN = 0.02
# How a diverged run's error begins (engine.training.loop.TrainingDiverged): what Table 3 counts as a diverged seed
DIVERGED_ERROR = "training loss became"
