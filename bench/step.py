"""Train-step time of every method at the run defaults of the backend, ÷ exact, in one process.

For each preset (``paper`` and ``small`` by default, any by ``--presets``) this builds
the train step exactly as a run does (``RunConfig(...).model_config`` on the running
backend: its default head chunk, attention, recomputation; ``optimizer_for``;
``make_train_step(...).lower().compile()``) for

* ``exact``;
* ``basis`` R ∈ {1, 8, 32} with ``sketched_layers`` ``mlp+head`` (the default) and ``all``;
* ``crs`` and ``proj`` R ∈ {1, 8, 32} on ``mlp+head``;
* ``floor`` on ``mlp+head`` and ``all``: the R = 1 step whose optimizer ignores the
  sketched kernels' gradients (``floor_optimizer``), so XLA drops their dW. No
  estimator of those dW can step faster at these shapes and options,

all from the same parameters and on the same random token batches. One round runs one
block of ``--block`` steps of every case, in a shuffled (seeded) order, each step
synced (``block_until_ready`` on the loss, as the step-by-step loop waits for it);
``--reps`` rounds follow ``--warmup`` warm-up steps. A block's time ÷ its steps is one
sample. The table gives the median ms/step and ``÷ exact`` as the median over rounds of
(case time ÷ exact time) in that round, so a drift in the machine's speed (other
processes on a shared CPU) hits both sides alike; ``IQR`` is the interquartile range of
that per-round ratio, ``won`` the share of rounds in which the case beat exact. The
header gives the 1-minute load average seen at the start of each round: on a shared
machine the ratios hold up under drift, the milliseconds do not. The process's malloc is set
as a run's (``engine.training.allocator``), so ``faults``, the mean number of minor page
faults per step, is about 0 once the heap has grown; thousands would mean the buffers
are mapped and zeroed afresh each step, a cost of the allocator that can fall on one
case and not another. ``flops ÷``
and ``bytes ÷`` are XLA's cost analysis of the compiled step (floating-point operations
and bytes read and written) ÷ exact's: where the time follows bytes rather than
flops, the step is bound by memory traffic, which a sketch of dW barely reduces.

Run it before and after any change to the sketch, the head, the model or the defaults:

    PYTHONPATH=$PWD python bench/step.py [--presets paper,small] [--reps 15] [--block 4]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from engine.training.allocator import reuse_freed_memory
from engine.training.build import initial_params, model_config, optimizer_for
from engine.training.loop import RunConfig
from engine.training.steps import floor_optimizer, init_state, make_train_step

RANKS = (1, 8, 32)


@dataclass
class Case:
    name: str
    config: RunConfig
    floor: bool = False
    run: Callable = None
    cost: dict = field(default_factory=dict)  # XLA's cost analysis of the compiled step
    samples: list = field(default_factory=list)
    faults: list = field(default_factory=list)


def cases_for(preset: str, ranks=RANKS) -> list[Case]:
    base = dict(preset=preset, lr=0.01, momentum=0.9)
    cases = [Case("exact", RunConfig(estimator="exact", **base))]
    for layers in ("mlp+head", "all"):
        cases += [Case(f"basis R={r} {layers}", RunConfig(estimator="basis", rank=r, sketched_layers=layers, **base))
                  for r in ranks]
    for estimator in ("crs", "proj"):
        cases += [Case(f"{estimator} R={r} mlp+head", RunConfig(estimator=estimator, rank=r, **base)) for r in ranks]
    cases += [Case(f"floor {layers}", RunConfig(estimator="basis", rank=1, sketched_layers=layers, **base), floor=True)
              for layers in ("mlp+head", "all")]
    return cases


def compile_case(config: RunConfig, batch: jax.Array, floor: bool = False) -> tuple[Callable, dict]:
    """The step of ``config`` compiled as a run compiles it, and XLA's cost analysis of it."""
    optimizer = optimizer_for(config)
    if floor:
        optimizer = floor_optimizer(model_config(config), optimizer)
    state = init_state(initial_params(config), optimizer)
    compiled = make_train_step(model_config(config), optimizer).lower(state, batch, jax.random.key(1)).compile()
    box = [state]

    def run(batch, key):
        box[0], loss = compiled(box[0], batch, key)
        return loss

    cost = compiled.cost_analysis()
    return run, (cost[0] if isinstance(cost, list) else cost) or {}


def run_block(case: Case, batches, keys, n: int) -> tuple[float, float]:
    """(seconds, minor page faults) per step over ``n`` steps of ``case``."""
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    t0 = time.perf_counter()
    for i in range(n):
        jax.block_until_ready(case.run(batches[i % len(batches)], keys[i % len(keys)]))
    seconds = time.perf_counter() - t0
    return seconds / n, (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / n


def bench_preset(preset: str, reps: int, block: int, warmup: int, seed: int, only: str | None) -> list[str]:
    cases = cases_for(preset)
    if only:
        keep = [s.strip() for s in only.split(",")]
        cases = [c for c in cases if c.name == "exact" or any(k in c.name for k in keep)]
    base = cases[0].config
    b, t = base.effective_batch_size, base.effective_seq_len
    m = model_config(base)
    rng = np.random.default_rng(seed)
    batches = [jnp.asarray(rng.integers(0, m.vocab_size, (b, t + 1)), jnp.int32) for _ in range(4)]
    keys = list(jax.random.split(jax.random.key(seed), max(block, warmup, 1)))
    start = time.perf_counter()
    for c in cases:
        c.run, c.cost = compile_case(c.config, batches[0], c.floor)
    compiled = time.perf_counter() - start
    for c in cases:
        run_block(c, batches, keys, warmup)
    order = np.random.default_rng(seed + 1)
    loads = []
    for _ in range(reps):
        loads.append(os.getloadavg()[0])
        for i in order.permutation(len(cases)):
            seconds, faults = run_block(cases[i], batches, keys, block)
            cases[i].samples.append(seconds)
            cases[i].faults.append(faults)

    exact = cases[0].samples
    lines = [
        f"## preset {preset}: B={b} T={t} (B·T={b * t}) d={m.d_model} layers={m.n_layers} V={m.vocab_size}; "
        f"defaults on {jax.default_backend()}: head_chunk={m.head_chunk} attention={m.attention} "
        f"recompute_activations={m.recompute_activations} dtype={m.dtype}; "
        f"{reps} rounds × {block} steps (compiled in {compiled:.0f} s); 1-minute load average "
        f"{min(loads):.1f}–{max(loads):.1f} over the rounds on {os.cpu_count()} CPUs",
        f"{'case':<24}{'ms/step':>10}{'÷ exact':>10}{'IQR':>16}{'won':>6}{'faults':>9}{'flops ÷':>9}{'bytes ÷':>9}",
    ]
    share = lambda c, what: c.cost.get(what, float("nan")) / cases[0].cost.get(what, float("nan"))
    for c in cases:
        ratios = [s / e for s, e in zip(c.samples, exact)]
        q1, _, q3 = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else (ratios[0],) * 3
        won = sum(r < 1 for r in ratios) / len(ratios)
        lines.append(f"{c.name:<24}{statistics.median(c.samples) * 1e3:>10.2f}{statistics.median(ratios):>10.3f}"
                     f"{f'{q1:.3f}–{q3:.3f}':>16}{won:>6.0%}{statistics.mean(c.faults):>9.0f}"
                     f"{share(c, 'flops'):>9.3f}{share(c, 'bytes accessed'):>9.3f}")
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--presets", default="paper,small")
    p.add_argument("--reps", type=int, default=15, help="rounds (each runs every case once)")
    p.add_argument("--block", type=int, default=4, help="steps per timed block")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--only", default=None, help="comma-separated substrings of case names to keep (exact always runs)")
    args = p.parse_args(argv)
    if args.reps < 2:
        p.error("--reps must be at least 2 (the table gives medians and quartiles over rounds)")
    reuse_freed_memory()  # as in a run's process, before JAX's threads start
    print(f"jax {jax.__version__} on {jax.devices()[0].device_kind}", flush=True)
    for preset in args.presets.split(","):
        start = time.perf_counter()
        for line in bench_preset(preset.strip(), args.reps, args.block, args.warmup, args.seed, args.only):
            print(line, flush=True)
        print(f"({time.perf_counter() - start:.0f} s)\n", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
