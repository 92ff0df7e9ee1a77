"""What XLA reports of a compiled train step: its temporary, argument and output
bytes and, on a GPU, the device peak (``compiled_stats``)."""

from __future__ import annotations

from typing import Any

import jax


def compiled_stats(compiled: Any) -> dict[str, int]:
    """What XLA and the device report for a compiled function: ``temp_bytes`` (scratch
    buffers), ``argument_bytes``, ``output_bytes``, ``alias_bytes`` (outputs reusing
    donated inputs) and ``device_peak_bytes`` (the allocator's peak so far, on
    backends that report it; not on CPU)."""
    out: dict[str, int] = {}
    analysis = compiled.memory_analysis()
    if analysis is not None:
        out.update(
            temp_bytes=int(analysis.temp_size_in_bytes),
            argument_bytes=int(analysis.argument_size_in_bytes),
            output_bytes=int(analysis.output_size_in_bytes),
            alias_bytes=int(analysis.alias_size_in_bytes),
        )
    stats = jax.local_devices()[0].memory_stats()  # this process's first device: memory is per device
    if stats and "peak_bytes_in_use" in stats:
        out["device_peak_bytes"] = int(stats["peak_bytes_in_use"])
    return out
