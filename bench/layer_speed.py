"""Time of sketched backprop against exact backprop, measured in one process.

Prints, for ``exact`` and ``basis`` R ∈ {1, 8, 32}, the median time of
(1) one jitted value-and-grad (dX and dW) of a dense layer B=4096, N=M=1024
    with a loss linear in y, and
(2) one GPT train step (SGD + momentum) at the ``paper`` preset,
each as a ratio to exact. Methods are interleaved round-robin so drift in the
machine's speed hits all of them alike.

    python bench/layer_speed.py [--reps 30] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax
import jax.numpy as jnp

from engine.basis import sketched_matmul
from engine.model import PRESETS, init_params
from engine.steps import init_state, make_optimizer, make_train_step

METHODS = [("exact", 1), ("basis", 1), ("basis", 8), ("basis", 32)]


def layer_case(estimator: str, rank: int, b=4096, n=1024, m=1024):
    kx, kw, kg = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(kx, (b, n))
    w = jax.random.normal(kw, (n, m)) / n**0.5
    g = jax.random.normal(kg, (b, m))
    fn = jax.jit(jax.value_and_grad(
        lambda x, w, k: jnp.vdot(g, sketched_matmul(x, w, k, rank=rank, estimator=estimator)),
        argnums=(0, 1),
    ))
    keys = iter(jax.random.split(jax.random.key(1), 10_000))
    return lambda: jax.block_until_ready(fn(x, w, next(keys)))


def step_case(estimator: str, rank: int, preset: str = "paper"):
    p = PRESETS[preset]
    cfg = p.model.replace(estimator=estimator, rank=rank)
    opt = make_optimizer("sgd", 0.01)
    step = make_train_step(cfg, opt)
    state = init_state(init_params(cfg, jax.random.key(0)), opt)
    batch = jax.random.randint(jax.random.key(2), (p.batch_size, cfg.seq_len + 1), 0, cfg.vocab_size)
    keys = iter(jax.random.split(jax.random.key(1), 10_000))
    holder = {"state": state}

    def run():
        holder["state"], loss = step(holder["state"], batch, next(keys))
        jax.block_until_ready(loss)

    return run


def measure(cases: dict, reps: int) -> dict[str, float]:
    for fn in cases.values():  # compile and warm up
        fn(); fn()
    times = {name: [] for name in cases}
    for _ in range(reps):
        for name, fn in cases.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def label(estimator, rank):
    return "exact" if estimator == "exact" else f"{estimator} R={rank}"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    print(f"jax {jax.__version__} on {jax.devices()[0].device_kind} ({jax.default_backend()}), median of {args.reps} interleaved reps")
    rows = []
    for bench, make in (("layer 4096x1024->1024 value+grad", layer_case), ("paper train step", step_case)):
        medians = measure({label(e, r): make(e, r) for e, r in METHODS}, args.reps)
        base = medians["exact"]
        print(f"\n{bench}")
        print(f"  {'method':<12} {'median ms':>10} {'ratio':>7}")
        for name, t in medians.items():
            print(f"  {name:<12} {t * 1e3:>10.2f} {t / base:>7.3f}")
            rows.append({"bench": bench, "method": name, "median_s": t, "ratio": t / base})
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
