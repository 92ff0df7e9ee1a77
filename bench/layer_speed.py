"""Time of sketched backprop against exact backprop, measured in one process.

Prints, for ``exact`` and ``basis`` R ∈ {1, 8, 32}, the median time of
(1) one jitted value-and-grad (dX and dW) of a dense layer B=4096, N=M=1024
    with a loss linear in y, and
(2) one GPT train step (SGD + momentum) at the ``paper`` preset,
each as a ratio to exact. Methods are interleaved round-robin so drift in the
machine's speed hits all of them alike.

Each bench also times its floor, the cost of a sketched method whose dW were
free: the layer's value-and-grad with w under ``stop_gradient`` (forward and dX
only), and the train step whose sketched kernels get a zero gradient (forward, dX
everywhere, exact dW elsewhere, the full optimizer update). Sketching can only
approach it: at the layer two of the three matmuls remain, so the floor is ≈ 2/3.

``faults`` is the mean number of minor page faults per call. The process's malloc is
set as a run's (``engine.training.allocator``); without that, a step whose XLA buffers
exceed glibc's 32 MB mmap threshold has its pages mapped and zeroed afresh at every
call (about 10,000 faults, several ms): a cost of the allocator that falls on whichever
method crosses it, not of its math.

    python bench/layer_speed.py [--reps 30] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp

from engine.core.presets import PRESETS
from engine.model.gpt import init_params
from engine.sketch.basis import sketched_matmul
from engine.training.allocator import reuse_freed_memory
from engine.training.steps import floor_optimizer, init_state, make_optimizer, make_train_step

METHODS = [("exact", 1), ("basis", 1), ("basis", 8), ("basis", 32)]
FLOOR = ("floor", 0)  # dW of the sketched weights not computed


def layer_case(estimator: str, rank: int, b=4096, n=1024, m=1024):
    kx, kw, kg = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(kx, (b, n))
    w = jax.random.normal(kw, (n, m)) / n**0.5
    g = jax.random.normal(kg, (b, m))
    if estimator == "floor":
        loss = lambda x, w, k: jnp.vdot(g, x @ jax.lax.stop_gradient(w))
    else:
        loss = lambda x, w, k: jnp.vdot(g, sketched_matmul(x, w, k, rank=rank, estimator=estimator))
    fn = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
    keys = iter(jax.random.split(jax.random.key(1), 10_000))
    return lambda: jax.block_until_ready(fn(x, w, next(keys)))


def step_case(estimator: str, rank: int, preset: str = "paper"):
    p = PRESETS[preset]
    opt = make_optimizer("sgd", 0.01)
    if estimator == "floor":  # the R = 1 model whose sketched kernels' dW are never read
        cfg = p.model.replace(estimator="basis", rank=1)
        opt = floor_optimizer(cfg, opt)
    else:
        cfg = p.model.replace(estimator=estimator, rank=rank)
    step = make_train_step(cfg, opt)
    state = init_state(init_params(cfg, jax.random.key(0)), opt)
    batch = jax.random.randint(jax.random.key(2), (p.batch_size, cfg.seq_len + 1), 0, cfg.vocab_size)
    keys = iter(jax.random.split(jax.random.key(1), 10_000))
    holder = {"state": state}

    def run():
        holder["state"], loss = step(holder["state"], batch, next(keys))
        jax.block_until_ready(loss)

    return run


def measure(cases: dict, reps: int) -> dict[str, tuple[float, float]]:
    """Median seconds and mean minor page faults of one call, per case."""
    for fn in cases.values():  # compile and warm up
        fn(); fn()
    times = {name: [] for name in cases}
    faults = dict.fromkeys(cases, 0)
    for _ in range(reps):
        for name, fn in cases.items():
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
            faults[name] += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    return {name: (statistics.median(ts), faults[name] / reps) for name, ts in times.items()}


def label(estimator, rank):
    return estimator if estimator in ("exact", "floor") else f"{estimator} R={rank}"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    reuse_freed_memory()  # as in a run's process, before JAX's threads start
    print(f"jax {jax.__version__} on {jax.devices()[0].device_kind} ({jax.default_backend()}), median of {args.reps} interleaved reps")
    rows = []
    for bench, make in (("layer 4096x1024->1024 value+grad", layer_case), ("paper train step", step_case)):
        measured = measure({label(e, r): make(e, r) for e, r in METHODS + [FLOOR]}, args.reps)
        base = measured["exact"][0]
        print(f"\n{bench}")
        print(f"  {'method':<12} {'median ms':>10} {'ratio':>7} {'faults':>8}")
        for name, (t, faults) in measured.items():
            print(f"  {name:<12} {t * 1e3:>10.2f} {t / base:>7.3f} {faults:>8.0f}")
            rows.append({"bench": bench, "method": name, "median_s": t, "ratio": t / base,
                         "page_faults": faults})
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
