"""The model's shape and options as plain data (``GPTConfig``), and the named presets.

No JAX here: the run schema (``engine.config``), the CLI's ``--help`` and the Launch
form read these without loading a framework. ``engine.model.gpt`` builds the network
from a ``GPTConfig``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from engine.core import checks
from engine.core.choices import (
    ATTENTION_CHOICES,
    DTYPES,
    ESTIMATORS,
    REMAT_POLICIES,
    SKETCHED_GROUPS,
    SKETCHED_LAYER_CHOICES,
)


def validate_method(estimator: str, rank: int, lam: float) -> None:
    """Raise ``ValueError`` naming the fix for an unknown estimator, rank < 1 or λ ∉ [0, 1)."""
    if estimator not in ESTIMATORS:
        raise ValueError(
            f"unknown estimator {estimator!r}; choose one of {', '.join(ESTIMATORS)}"
        )
    checks.whole("rank", rank, 1, fix="use rank=1 or more")
    if not (isinstance(lam, (int, float)) and 0.0 <= lam < 1.0):
        raise ValueError(f"lam (λ) must be in [0, 1) (got {lam!r}); use 0.0 for no shrink")


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 50257
    seq_len: int = 64
    d_model: int = 64
    n_heads: int = 2
    n_layers: int = 2
    sketched_layers: str = "mlp+head"
    estimator: str = "exact"
    rank: int = 32
    lam: float = 0.0
    dtype: str = "float32"
    head_chunk: int = 0
    attention: str = "recompute"
    recompute_activations: bool = True
    remat: str = "none"
    # the mesh axis over which sketched layers all-gather their sketches to form dW
    # (a run's ``dw_comm="sketch"`` on several devices; set by engine.training.parallel);
    # None: every device keeps its own dW, summed by the caller
    gather_axis: str | None = None

    def __post_init__(self):
        for name in ("vocab_size", "seq_len", "d_model", "n_heads", "n_layers"):
            value = getattr(self, name)
            checks.whole(name, value, 1)
        checks.whole("head_chunk", self.head_chunk, 0, fix="0 = unfused head, C > 0 = fused head in chunks of C rows")
        if self.attention not in ATTENTION_CHOICES:
            raise ValueError(
                f"attention must be one of {', '.join(ATTENTION_CHOICES)} (got {self.attention!r})"
            )
        if not isinstance(self.recompute_activations, bool):
            raise ValueError(
                f"recompute_activations must be True or False (got {self.recompute_activations!r})"
            )
        if self.remat not in REMAT_POLICIES:
            raise ValueError(
                f"remat must be one of {', '.join(REMAT_POLICIES)} (got {self.remat!r})"
            )
        if self.d_model % self.n_heads:
            raise ValueError(
                f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})"
            )
        if self.sketched_layers not in SKETCHED_LAYER_CHOICES:
            raise ValueError(
                f"sketched_layers must be one of {', '.join(SKETCHED_LAYER_CHOICES)} "
                f"(got {self.sketched_layers!r})"
            )
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)} (got {self.dtype!r})")
        validate_method(self.estimator, self.rank, self.lam)

    def replace(self, **changes) -> "GPTConfig":
        return dataclasses.replace(self, **changes)

    def estimator_for(self, group: str) -> str:
        """The estimator of a dense layer in ``group`` (``mlp``, ``head`` or ``attn``)."""
        return self.estimator if group in SKETCHED_GROUPS[self.sketched_layers] else "exact"

    def sketched_kernel_paths(self) -> list[tuple[str, ...]]:
        """Param-tree paths of the kernels in the ``sketched_layers`` groups: the
        layers whose dW this config sketches (for ``exact``, the layers a sketched
        run of the same config would sketch, so its dW probe is the reference 1.0)."""
        groups = SKETCHED_GROUPS[self.sketched_layers]
        paths: list[tuple[str, ...]] = []
        for i in range(self.n_layers):
            if "attn" in groups:
                paths += [(f"block_{i}", "attn", "qkv"), (f"block_{i}", "attn", "out")]
            if "mlp" in groups:
                paths += [(f"block_{i}", "mlp", "fc"), (f"block_{i}", "mlp", "proj")]
        if "head" in groups:
            paths.append(("head",))
        return paths


@dataclass(frozen=True)
class Preset:
    """A named model shape plus the batch size it was run with."""

    model: GPTConfig
    batch_size: int
    description: str


PRESETS: dict[str, Preset] = {
    "paper": Preset(
        GPTConfig(vocab_size=50257, seq_len=64, d_model=64, n_heads=2, n_layers=2),
        batch_size=1,
        description="the paper's run: T 64, d 64, 2 heads, 2 layers, batch 1",
    ),
    "small": Preset(
        GPTConfig(vocab_size=50257, seq_len=256, d_model=256, n_heads=4, n_layers=4),
        batch_size=4,
        description="T 256, d 256, 4 heads, 4 layers, batch 4",
    ),
    "tiny": Preset(
        GPTConfig(vocab_size=50257, seq_len=32, d_model=32, n_heads=2, n_layers=1),
        batch_size=2,
        description="a smoke-test model: T 32, d 32, 2 heads, 1 layer, batch 2",
    ),
    "gpt2": Preset(
        GPTConfig(vocab_size=50257, seq_len=1024, d_model=768, n_heads=12, n_layers=12),
        batch_size=8,
        description="GPT-2 small: T 1024, d 768, 12 heads, 12 layers, batch 8",
    ),
}
