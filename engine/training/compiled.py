"""What XLA reports of a compiled train step: its temporary, argument and output
bytes and, on a GPU, the device peak (``compiled_stats``), for a run's step or one
compiled here (``compiled_memory``)."""

from __future__ import annotations

import jax
import optax

from engine.core.presets import GPTConfig
from engine.training.steps import init_state, make_train_step


def compiled_stats(compiled) -> dict[str, int]:
    """What XLA and the device report for a compiled function: ``temp_bytes`` (scratch
    buffers), ``argument_bytes``, ``output_bytes``, ``alias_bytes`` (outputs reusing
    donated inputs) and ``device_peak_bytes`` (the allocator's peak so far, on
    backends that report it; not on CPU)."""
    out = {}
    analysis = compiled.memory_analysis()
    if analysis is not None:
        out.update(
            temp_bytes=int(analysis.temp_size_in_bytes),
            argument_bytes=int(analysis.argument_size_in_bytes),
            output_bytes=int(analysis.output_size_in_bytes),
            alias_bytes=int(analysis.alias_size_in_bytes),
        )
    stats = jax.devices()[0].memory_stats()
    if stats and "peak_bytes_in_use" in stats:
        out["device_peak_bytes"] = int(stats["peak_bytes_in_use"])
    return out


def compiled_memory(
    cfg: GPTConfig, optimizer: optax.GradientTransformation, params, batch, key
) -> dict[str, int]:
    """``compiled_stats`` of the jitted train step (``engine.training.steps.make_train_step``)."""
    state = jax.eval_shape(lambda p: init_state(p, optimizer), params)
    return compiled_stats(make_train_step(cfg, optimizer).lower(state, batch, key).compile())
