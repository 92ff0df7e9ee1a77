"""Time of an estimator diagnosis (``engine.analysis.diagnostics.diagnose``) at a preset.

Random-init parameters and uniformly random token batches of the preset's real shape
(no data download). Two timings: every sketched estimator at one rank, and the whole
table over several ranks; each is printed in seconds, per estimator × rank × batch,
and as a ratio to one exact forward/backward pass of the same model measured in this
process (the floor: a diagnosis runs one per batch). The first pass of each shape
compiles; ``--warm`` times a second run of the one-rank diagnosis after compilation.
``--grid`` also times the diagnosis the claims need: basis, countsketch, balanced and
scalars × ranks 1, 2, 8, 16, 32, 64 (24 settings) at ``--grid-keys`` keys (128) over
``engine.runner.diagnosis.DEFAULT_BATCHES`` batches. Timings on a shared machine move with
its load: compare the ratios to the backprop measured in the same process.

    PYTHONPATH=. python bench/diagnose.py [--preset paper] [--keys 256] [--rank 16] [--ranks 1,4,16,64]
                             [--batches 1] [--chunk 256] [--warm] [--grid] [--grid-keys 128]
"""

from __future__ import annotations

import argparse
import time

import jax

from engine.analysis.diagnostics import diagnose
from engine.core.choices import ESTIMATORS
from engine.core.presets import PRESETS
from engine.model.gpt import init_params, loss_fn
from engine.runner.diagnosis import DEFAULT_BATCHES, DEFAULT_CHUNK

GRID_ESTIMATORS = ("basis", "countsketch", "balanced", "scalars")
GRID_RANKS = (1, 2, 8, 16, 32, 64)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="paper", choices=sorted(PRESETS))
    parser.add_argument("--keys", type=int, default=256)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--ranks", default="1,4,16,64")
    parser.add_argument("--batches", type=int, default=1)
    parser.add_argument("--chunk", type=int, default=DEFAULT_CHUNK)
    parser.add_argument("--warm", action="store_true")
    parser.add_argument("--grid", action="store_true")
    parser.add_argument("--grid-keys", type=int, default=128)
    args = parser.parse_args()

    preset = PRESETS[args.preset]
    cfg = preset.model
    params = init_params(cfg, jax.random.key(0))
    batches = [
        jax.random.randint(jax.random.key(1 + i), (preset.batch_size, cfg.seq_len + 1), 0, cfg.vocab_size)
        for i in range(args.batches)
    ]
    estimators = [e for e in ESTIMATORS if e != "exact"]
    ranks = [int(r) for r in args.ranks.split(",")]

    grad = jax.jit(jax.grad(lambda p, b: loss_fn(cfg, p, b, None)))
    jax.block_until_ready(grad(params, batches[0]))
    start = time.perf_counter()
    for _ in range(5):
        jax.block_until_ready(grad(params, batches[0]))
    backprop = (time.perf_counter() - start) / 5

    def timed(ranks):
        start = time.perf_counter()
        df = diagnose(cfg, params, batches, estimators=estimators, ranks=ranks, lams=[0.0],
                      keys=args.keys, key=jax.random.key(2), chunk=args.chunk)
        return time.perf_counter() - start, df

    rows = preset.batch_size * cfg.seq_len
    print(f"preset {args.preset}: B·T = {rows} rows, d {cfg.d_model}, vocab {cfg.vocab_size}, "
          f"layers {cfg.sketched_layers}; K = {args.keys} keys in chunks of {args.chunk}, "
          f"{args.batches} batch(es), backend {jax.default_backend()}")
    print(f"exact forward/backward: {backprop * 1e3:.1f} ms")
    runs = [("one rank", [args.rank])] + ([("one rank, compiled", [args.rank])] if args.warm else [])
    runs.append((f"ranks {args.ranks}", ranks))
    df = None
    for label, rs in runs:
        seconds, df = timed(rs)
        cells = len(estimators) * len(rs) * args.batches
        print(f"{label}: {len(estimators)} estimators × {len(rs)} rank(s): {seconds:.1f} s, "
              f"{seconds / cells:.2f} s per estimator·rank·batch, {seconds / backprop:.0f}× one backprop")
    if args.grid:
        grid_batches = [jax.random.randint(jax.random.key(100 + i), (preset.batch_size, cfg.seq_len + 1), 0,
                                           cfg.vocab_size) for i in range(DEFAULT_BATCHES)]
        start = time.perf_counter()
        diagnose(cfg, params, grid_batches, estimators=GRID_ESTIMATORS, ranks=GRID_RANKS, lams=[0.0],
                 keys=args.grid_keys, key=jax.random.key(3), chunk=args.chunk)
        seconds = time.perf_counter() - start
        print(f"claims grid: {len(GRID_ESTIMATORS)} estimators × {len(GRID_RANKS)} ranks, K = {args.grid_keys}, "
              f"{DEFAULT_BATCHES} batches: {seconds:.1f} s, {seconds / backprop:.0f}× one backprop")
    pooled = df[df.layer == "all"][["estimator", "rank", "bias2", "bias2_se", "variance", "mse", "cos_mean"]]
    print(pooled.to_string(index=False, float_format=lambda v: f"{v:.4g}"))


if __name__ == "__main__":
    main()
