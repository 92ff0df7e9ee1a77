"""Where a run's time goes: seconds per phase of one training, kept by the loop as it trains.

``Phases`` splits the wall time of one ``engine.training.loop.train`` (from its start to its
end, in the thread that trains) into

- ``compile``: JAX tracing, lowering and compiling (or loading from the persistent cache,
  ``engine.training.compile_cache``) programs in that thread, wherever it happens: the union
  of the spans JAX reports (``jax.monitoring`` time spans of its trace, lowering and backend
  compile events, nested ones counted once), plus the memory figures' listing of the saved
  residuals (a trace of two programs, mine and exact's);
- ``setup``: loading the tokens, the initial parameters and optimizer state, placing them
  (and, as the runner counts it, opening the run's checkpoints);
- ``train``: the train steps, as the loop's own step time counts them (wall time between
  syncs, the batches and per-step callbacks included, less everything else here);
- ``eval``: the validation (and test) passes; ``probe``: the dW probes;
- ``checkpoint``: saving checkpoints and reading the one a resume starts from;
- ``write``: the time the loop waits while its caller handles a record (the runner queues
  its metrics for the database: ``engine.runner.writer``);
- ``other``: the rest of the wall time (system metrics, the loss checks, bookkeeping).

Every phase but ``compile`` has the compile time inside it taken out, so the phases add up
to the wall time. Each costs two ``perf_counter`` reads and a thread-local sum per boundary;
nothing is synced for it. ``metrics()`` gives them as ``time/<phase>_s`` (and ``time/wall_s``),
the names a finished run stores at its last step (``engine.runner.execution``).
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Iterator

PHASES = ("setup", "compile", "train", "eval", "probe", "checkpoint", "write")
PREFIX = "time/"
WALL = f"{PREFIX}wall_s"
OTHER = f"{PREFIX}other_s"
_EVENTS = frozenset({
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    "/jax/core/compile/backend_compile_duration",
})
_KEPT_SPANS = 256  # newest disjoint spans kept per thread (an older one is never nested in a new one)


def metric(phase: str) -> str:
    """The stored name of ``phase``'s seconds: ``time/<phase>_s``."""
    return f"{PREFIX}{phase}_s"


class _Spans(threading.local):
    """One thread's compile spans so far: their union's length (``total``) and the newest
    disjoint spans, so that a span enclosing earlier ones (an outer trace) adds only its rest."""

    def __init__(self) -> None:
        self.total = 0.0
        self.spans: list[tuple[float, float]] = []

    def add(self, start: float, end: float) -> None:
        while self.spans and self.spans[-1][1] > start:
            s, e = self.spans.pop()
            self.total -= e - s
            start, end = min(start, s), max(end, e)
        self.spans.append((start, end))
        self.total += end - start
        if len(self.spans) > _KEPT_SPANS:
            del self.spans[: len(self.spans) - _KEPT_SPANS]


_SPANS = _Spans()
_LISTENING = threading.Lock()
_listening = False


def _on_span(event: str, start_time: float, end_time: float, **kwargs: str | int) -> None:
    if event in _EVENTS:
        _SPANS.add(start_time, end_time)


def compile_seconds() -> float:
    """Seconds this thread has spent tracing, lowering and compiling JAX programs since the
    process first asked (the listener is registered then)."""
    global _listening
    if not _listening:
        with _LISTENING:
            if not _listening:
                import jax.monitoring

                jax.monitoring.register_event_time_span_listener(_on_span)
                _listening = True
    return _SPANS.total


class Phases:
    """The seconds of each of ``PHASES`` since it was made. ``timed(phase)`` counts a block;
    ``close(phase)`` counts everything since the last boundary (the end of a timed block or a
    ``close``) as ``phase``, as the loop does with step time. Compiling is counted wherever it
    happens in this thread, and taken out of the phase it happened in."""

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(PHASES, 0.0)  # compile: only what ``timed("compile")`` adds beyond JAX's spans
        self._compiled0 = compile_seconds()
        self.started = time.perf_counter()
        self._mark, self._mark_compiled = self.started, self._compiled0

    def _count(self, phase: str, t0: float, c0: float) -> None:
        now, compiled = time.perf_counter(), compile_seconds()
        self.seconds[phase] += now - t0 - (compiled - c0)
        self._mark, self._mark_compiled = now, compiled

    def close(self, phase: str) -> None:
        """Count the time since the last boundary, less its compiling, as ``phase``."""
        self._count(phase, self._mark, self._mark_compiled)

    @contextmanager
    def timed(self, phase: str) -> Iterator[None]:
        """Count the block, less the compiling in it, as ``phase``; what lay between the last
        boundary and the block stays unclaimed (``other``)."""
        t0, c0 = time.perf_counter(), compile_seconds()
        try:
            yield
        finally:
            self._count(phase, t0, c0)

    def metrics(self) -> dict[str, float]:
        """``time/<phase>_s`` of every phase, ``time/other_s`` (the wall time no phase claims)
        and ``time/wall_s`` (since it was made)."""
        wall = time.perf_counter() - self.started
        out = {metric(p): float(v) for p, v in self.seconds.items()}
        out[metric("compile")] += compile_seconds() - self._compiled0
        out[OTHER] = max(0.0, wall - sum(out.values()))
        out[WALL] = wall
        return out
