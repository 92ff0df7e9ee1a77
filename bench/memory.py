"""Activation memory and step time: exact backprop, checkpointing and BASIS, measured together.

A GPT of d 256, 4 layers, 4 heads, vocab 50257 at each T with B = rows / T sequences
(B·T = 4096 rows by default). Rows of the table:

- ``exact``: plain backprop (unfused head, XLA attention, nothing recomputed),
- ``exact+dots``: plain, ``jax.checkpoint`` per block with policy ``dots_saveable``,
- ``exact+full``: plain, ``jax.checkpoint`` per block saving only the block input,
- ``exact+opts``: the exact-preserving options: fused chunked head, recompute
  attention, LayerNorm/GELU keeping only their inputs,
- ``basis``: R ∈ {1, 8, 32}, layers ``mlp+head`` and ``all``, with the same options.

Columns: bytes saved for the backward pass (JAX's saved-residual listing, parameters
excluded) and their breakdown, the compiled train step's temp bytes (XLA memory
analysis), the median train-step time (SGD + momentum; methods interleaved round-robin
so drift in the machine's speed hits all alike); ratios are to plain ``exact`` at the
same T, measured in this process.

    python bench/memory.py [--T 64,256,1024] [--rows 4096] [--reps 3] [--head-chunk 1024] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp

from engine.core.presets import GPTConfig
from engine.model.gpt import init_params
from engine.model.memory import CATEGORIES, memory_breakdown
from engine.training.compiled import compiled_stats
from engine.training.steps import init_state, make_optimizer, make_train_step

MODEL = dict(vocab_size=50257, d_model=256, n_heads=4, n_layers=4)
PLAIN = dict(head_chunk=0, attention="xla", recompute_activations=False, remat="none")
SHORT = {"sketched_inputs": "dense-in", "nonlinearity": "nonlin", "attention": "attn",
         "loss_logits": "loss", "other": "other"}


def methods(head_chunk: int) -> list[dict]:
    """(method, layers, rank, config changes) of every row, plain ``exact`` first."""
    opts = dict(head_chunk=head_chunk, attention="recompute", recompute_activations=True, remat="none")
    rows = [
        dict(method="exact", layers="none", rank=None, changes=PLAIN),
        dict(method="exact+dots", layers="none", rank=None, changes=dict(PLAIN, remat="dots_saveable")),
        dict(method="exact+full", layers="none", rank=None, changes=dict(PLAIN, remat="full")),
        dict(method="exact+opts", layers="none", rank=None, changes=opts),
    ]
    for layers in ("mlp+head", "all"):
        for rank in (1, 8, 32):
            changes = dict(opts, estimator="basis", rank=rank, sketched_layers=layers)
            rows.append(dict(method="basis", layers=layers, rank=rank, changes=changes))
    return rows


def prepare(cfg: GPTConfig, params, batch):
    """Memory figures and a ``run()`` that does one train step with a fresh sketch key."""
    opt = make_optimizer("sgd", 0.01)
    keys = iter(jax.random.split(jax.random.key(1), 10_000))
    key = next(keys)
    breakdown = memory_breakdown(cfg, params, batch, key)
    holder = {"state": init_state(jax.tree_util.tree_map(jnp.copy, params), opt)}  # donated
    step = make_train_step(cfg, opt).lower(holder["state"], batch, key).compile()

    def run():
        holder["state"], loss = step(holder["state"], batch, next(keys))
        jax.block_until_ready(loss)

    return breakdown, compiled_stats(step), run


def measure_T(t: int, rows: int, reps: int, head_chunk: int) -> list[dict]:
    base = GPTConfig(seq_len=t, **MODEL)
    b = max(1, rows // t)
    params = init_params(base, jax.random.key(0))
    batch = jax.random.randint(jax.random.key(2), (b, t + 1), 0, base.vocab_size)
    table = methods(head_chunk)
    runs = []
    for row in table:
        breakdown, stats, run = prepare(base.replace(**row["changes"]), params, batch)
        row.update(T=t, batch=b, saved_bytes=sum(breakdown.values()), breakdown=breakdown,
                   temp_bytes=stats.get("temp_bytes"), times=[])
        runs.append(run)
        run()  # warm up
    for _ in range(reps):
        for row, run in zip(table, runs):
            t0 = time.perf_counter()
            run()
            row["times"].append(time.perf_counter() - t0)
    for row in table:
        row["step_s"] = statistics.median(row.pop("times"))
    exact = table[0]
    for row in table:
        row["saved_ratio"] = row["saved_bytes"] / exact["saved_bytes"]
        row["temp_ratio"] = row["temp_bytes"] / exact["temp_bytes"] if exact["temp_bytes"] else None
        row["time_ratio"] = row["step_s"] / exact["step_s"]
        row["options"] = row.pop("changes")
    return table


def print_table(table: list[dict]) -> None:
    mb = 1 << 20
    head = (f"{'method':<11}{'layers':<9}{'R':>3} {'T':>5} {'B':>3}  {'saved MB':>9}{'×ex':>7}  "
            + "".join(f"{SHORT[c]:>9}" for c in CATEGORIES)
            + f"  {'temp MB':>8}{'×ex':>7}  {'step s':>7}{'×ex':>7}")
    print(head)
    for r in table:
        rank = "-" if r["rank"] is None else r["rank"]
        temp_ratio = "-" if r["temp_ratio"] is None else f"{r['temp_ratio']:.3f}"
        print(f"{r['method']:<11}{r['layers']:<9}{rank:>3} {r['T']:>5} {r['batch']:>3}  "
              f"{r['saved_bytes'] / mb:>9.1f}{r['saved_ratio']:>7.3f}  "
              + "".join(f"{r['breakdown'][c] / mb:>9.1f}" for c in CATEGORIES)
              + f"  {r['temp_bytes'] / mb:>8.0f}{temp_ratio:>7}  {r['step_s']:>7.3f}{r['time_ratio']:>7.3f}")


def defaults(seq_lens=(64, 1024)) -> None:
    """What BASIS saves under a run's defaults (``RunConfig``: the preset's model, the
    default memory options) at the paper preset and longer contexts: saved-for-backward
    bytes of exact and basis R ∈ {1, 8, 32} (mlp+head) and basis ÷ exact, same options."""
    from engine.config import RunConfig
    from engine.training.build import initial_params, model_config

    print(f"RunConfig defaults at the paper preset (d 64, 2 layers, batch 1), head chunk "
          f"{RunConfig(preset='paper').effective_head_chunk(jax.default_backend())} on {jax.default_backend()}; MB = 2^20 bytes")
    print(f"{'T':>5} {'method':<12}{'saved MB':>10}{'÷ exact':>9}  " + "".join(f"{SHORT[c]:>9}" for c in CATEGORIES))
    for t in seq_lens:
        exact_bytes = None
        for estimator, rank in (("exact", 32), ("basis", 1), ("basis", 8), ("basis", 32)):
            config = RunConfig(preset="paper", seq_len=t, estimator=estimator, rank=rank)
            cfg = model_config(config)
            params = initial_params(config)
            batch = jax.random.randint(jax.random.key(2), (config.effective_batch_size, t + 1), 0, cfg.vocab_size)
            breakdown = memory_breakdown(cfg, params, batch, jax.random.key(1))
            saved = sum(breakdown.values())
            exact_bytes = exact_bytes or saved
            label = "exact" if estimator == "exact" else f"basis R={rank}"
            print(f"{t:>5} {label:<12}{saved / 2**20:>10.2f}{saved / exact_bytes:>9.3f}  "
                  + "".join(f"{breakdown[c] / 2**20:>9.2f}" for c in CATEGORIES))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--T", default="64,256,1024", help="comma-separated sequence lengths")
    ap.add_argument("--rows", type=int, default=4096, help="B·T rows per step (B = rows // T)")
    ap.add_argument("--reps", type=int, default=3, help="timed steps per method")
    ap.add_argument("--head-chunk", type=int, default=1024, help="rows per chunk of the fused head")
    ap.add_argument("--json", type=Path, help="write the table as a JSON list of rows")
    ap.add_argument("--defaults", action="store_true",
                    help="only the saved bytes of exact and basis under RunConfig defaults at the paper preset, T 64 and 1024")
    args = ap.parse_args(argv)
    if args.defaults:
        defaults()
        return
    print(f"jax {jax.__version__} on {jax.devices()[0].device_kind} ({jax.default_backend()}); "
          f"d {MODEL['d_model']}, {MODEL['n_layers']} layers, {MODEL['n_heads']} heads, "
          f"V {MODEL['vocab_size']}, B·T {args.rows}, head chunk {args.head_chunk}, "
          f"median of {args.reps} interleaved steps; MB = 2^20 bytes", flush=True)
    rows = []
    for t in (int(v) for v in args.T.split(",")):
        table = measure_T(t, args.rows, args.reps, args.head_chunk)
        print()
        print_table(table)
        sys.stdout.flush()
        rows += table
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
