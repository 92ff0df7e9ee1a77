"""Train-step throughput of our GPT against a plain Flax GPT, measured in one process.

For each preset (``tiny``, ``paper``, ``small`` by default) this times one SGD
(momentum 0.9, lr 0.01) train step on random token batches of the preset's shape for

* ``plain``: a GPT of the same shape written the usual way in Flax (``nn.Embed``,
  learned positions, ``nn.LayerNorm``, ``nn.MultiHeadDotProductAttention`` with a
  causal mask, a GELU MLP of ``nn.Dense``, an untied bias-free head, optax softmax
  cross-entropy): the reference row;
* our ``exact`` and ``basis`` R ∈ {1, 8, 32}, built as a run builds them
  (``RunConfig.model_config()``, ``optimizer_for``, ``make_train_step(...).lower().compile()``),
  with the unfused head (``head_chunk`` 0) and the fused head at several chunk sizes;
* per-step sync (``float(loss)`` after every step, what the training loop does
  today) against none (losses stay on the device; one wait at the end of the block),
  for plain, exact and basis R=32.

Timing: each case runs blocks of ``--block`` steps; one round runs one block of every
case in a shuffled order (seeded), ``--reps`` rounds after ``--warmup`` warm-up
steps. A block's time / its steps is one sample. The table gives the median
ms/step and steps/s, and speed ratios (reference time ÷ case time, > 1 = faster
than the reference) as the median over rounds of the per-round ratio, so drift in
the machine's speed hits both sides alike. ``won`` is the share of rounds in which
the case was faster than the reference.

    python bench/throughput.py [--presets tiny,paper,small] [--reps 30] [--block 4]
    JAX_PLATFORMS=cpu taskset -c 0,1 python bench/throughput.py   # as on a 2-core CPU
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from engine.training.allocator import reuse_freed_memory
from engine.training.build import initial_params, model_config, optimizer_for
from engine.training.loop import RunConfig
from engine.training.steps import init_state, make_train_step

RANKS = (1, 8, 32)
SYNC_CASES = ("plain", "exact h0", "basis R=32 h0")


# ----------------------------------------------------------------------------- the plain reference


class PlainBlock(nn.Module):
    d_model: int
    n_heads: int

    @nn.compact
    def __call__(self, x, mask):
        h = nn.LayerNorm()(x)
        x = x + nn.MultiHeadDotProductAttention(num_heads=self.n_heads, qkv_features=self.d_model,
                                                out_features=self.d_model, deterministic=True)(h, h, mask=mask)
        h = nn.LayerNorm()(x)
        h = nn.Dense(self.d_model)(nn.gelu(nn.Dense(4 * self.d_model)(h)))
        return x + h


class PlainGPT(nn.Module):
    vocab_size: int
    seq_len: int
    d_model: int
    n_heads: int
    n_layers: int

    @nn.compact
    def __call__(self, idx):
        init = nn.initializers.normal(0.02)
        x = nn.Embed(self.vocab_size, self.d_model, embedding_init=init)(idx)
        x = x + self.param("wpe", init, (self.seq_len, self.d_model))[: idx.shape[1]]
        mask = nn.make_causal_mask(idx)
        for _ in range(self.n_layers):
            x = PlainBlock(self.d_model, self.n_heads)(x, mask)
        return nn.Dense(self.vocab_size, use_bias=False)(nn.LayerNorm()(x))


def plain_case(config: RunConfig, batch) -> Callable:
    m = model_config(config)
    model = PlainGPT(m.vocab_size, m.seq_len, m.d_model, m.n_heads, m.n_layers)
    params = model.init(jax.random.key(0), batch[:, :-1])["params"]
    optimizer = optax.sgd(0.01, momentum=0.9)
    state = (params, optimizer.init(params))

    def step(state, batch):
        params, opt_state = state

        def loss_fn(p):
            logits = model.apply({"params": p}, batch[:, :-1])
            return optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 1:]).mean()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), loss

    compiled = jax.jit(step, donate_argnums=0).lower(state, batch).compile()
    box = [state]

    def run(batch, key):
        box[0], loss = compiled(box[0], batch)
        return loss

    return run


def our_case(config: RunConfig, batch) -> Callable:
    optimizer = optimizer_for(config)
    state = init_state(initial_params(config), optimizer)
    key0 = jax.random.key(1)
    compiled = make_train_step(model_config(config), optimizer).lower(state, batch, key0).compile()
    box = [state]

    def run(batch, key):
        box[0], loss = compiled(box[0], batch, key)
        return loss

    return run


# ----------------------------------------------------------------------------- timing


@dataclass
class Case:
    name: str
    method: str
    head: int | None  # None: the plain reference
    sync: bool
    run: Callable
    samples: list


def run_block(case: Case, batches, keys, n: int) -> float:
    losses = []
    t0 = time.perf_counter()
    for i in range(n):
        loss = case.run(batches[i % len(batches)], keys[i % len(keys)])
        if case.sync:
            float(loss)
        else:
            losses.append(loss)
    if losses:
        jax.block_until_ready(losses)
    return (time.perf_counter() - t0) / n


def chunk_sizes(rows: int) -> list[int]:
    return sorted({c for c in (rows // 4, rows // 2, 128, 256, rows) if 0 < c <= rows})


def build_cases(preset: str, batch, heads: list[int]) -> list[Case]:
    """The plain reference, exact and basis R ∈ ``RANKS`` at each head chunk in ``heads``
    (0: unfused), and a per-step-sync twin of each of ``SYNC_CASES``, all compiled."""
    base = RunConfig(preset=preset, lr=0.01, momentum=0.9)
    cases = [Case("plain", "plain", None, False, plain_case(base, batch), [])]
    for estimator, rank in [("exact", 32), *[("basis", r) for r in RANKS]]:
        method = "exact" if estimator == "exact" else f"basis R={rank}"
        for h in heads:
            cfg = RunConfig(preset=preset, estimator=estimator, rank=rank, head_chunk=h, lr=0.01, momentum=0.9)
            cases.append(Case(f"{method} h{h}", method, h, False, our_case(cfg, batch), []))
    for c in list(cases):
        if c.name in SYNC_CASES:
            cases.append(Case(c.name + " sync", c.method, c.head, True, c.run, []))
    return cases


def time_cases(cases: list[Case], batches, keys, reps: int, block: int, warmup: int, seed: int) -> None:
    """``warmup`` steps of each case, then ``reps`` rounds of one block of every case in a
    shuffled (seeded) order; each block's time per step goes to its case's samples."""
    for c in cases:
        run_block(c, batches, keys, warmup)
    order = np.random.default_rng(seed + 1)
    for _ in range(reps):
        for i in order.permutation(len(cases)):
            c = cases[i]
            c.samples.append(run_block(c, batches, keys, block))


def ratio(ref_samples, samples) -> float:
    """The median over rounds of reference time ÷ case time (> 1: the case is faster)."""
    return statistics.median(r / s for r, s in zip(ref_samples, samples))


def won(ref_samples, samples) -> float:
    """The share of rounds in which the case was faster than the reference."""
    return sum(s < r for r, s in zip(ref_samples, samples)) / len(samples)


def case_table(cases: list[Case]) -> list[str]:
    """One line per case: ms/step, steps/s, and its ratio and wins against plain and exact h0."""
    by_name = {c.name: c for c in cases}
    ref, exact0 = by_name["plain"].samples, by_name["exact h0"].samples
    lines = [f"{'case':<24}{'head':>6}{'sync':>6}{'ms/step':>10}{'steps/s':>10}{'×plain':>9}{'won':>6}{'×exact h0':>11}{'won':>6}"]
    for c in cases:
        med = statistics.median(c.samples)
        head = "—" if c.head is None else ("off" if c.head == 0 else str(c.head))
        lines.append(f"{c.name:<24}{head:>6}{'yes' if c.sync else 'no':>6}{med * 1e3:>10.3f}{1 / med:>10.1f}"
                     f"{ratio(ref, c.samples):>9.3f}{won(ref, c.samples):>6.0%}{ratio(exact0, c.samples):>11.3f}{won(exact0, c.samples):>6.0%}")
    return lines


def head_and_sync_lines(cases: list[Case], heads: list[int]) -> list[str]:
    """The fused head against the unfused one per method, and per-step sync against none."""
    by_name = {c.name: c for c in cases}
    lines = ["fused head against unfused (same method; ratio = unfused time ÷ fused time, > 1 = fused faster):"]
    for method in ["exact", *[f"basis R={r}" for r in RANKS]]:
        unfused = by_name[f"{method} h0"].samples
        fused = {h: by_name[f"{method} h{h}"].samples for h in heads if h}
        best = max(fused, key=lambda h: ratio(unfused, fused[h]))
        parts = ", ".join(f"h{h} {ratio(unfused, s):.3f} (won {won(unfused, s):.0%})" for h, s in fused.items())
        verdict = "fused wins" if ratio(unfused, fused[best]) > 1 and won(unfused, fused[best]) > 0.5 else "unfused wins or tie"
        lines.append(f"  {method:<12} {parts}; best h{best}: {verdict}")
    lines.append("per-step sync against none (ratio = no-sync time ÷ sync time, < 1 = sync slower):")
    for name in SYNC_CASES:
        lines.append(f"  {name:<16} {ratio(by_name[name].samples, by_name[name + ' sync'].samples):.3f}")
    return lines


def bench_preset(preset: str, reps: int, block: int, warmup: int, seed: int) -> list[str]:
    """Every case of ``preset`` timed in one process; the report's lines."""
    base = RunConfig(preset=preset, lr=0.01, momentum=0.9)
    b, t = base.effective_batch_size, base.effective_seq_len
    vocab = model_config(base).vocab_size
    rng = np.random.default_rng(seed)
    batches = [jnp.asarray(rng.integers(0, vocab, (b, t + 1)), jnp.int32) for _ in range(4)]
    keys = list(jax.random.split(jax.random.key(seed), block))
    heads = [0, *chunk_sizes(b * t)]
    cases = build_cases(preset, batches[0], heads)
    time_cases(cases, batches, keys, reps, block, warmup, seed)
    head = (f"## preset {preset}: B={b} T={t} (B·T={b * t}) d={model_config(base).d_model} "
            f"layers={model_config(base).n_layers} V={vocab}; {reps} rounds × {block} steps, device {jax.devices()[0].platform}")
    return [head, *case_table(cases), *head_and_sync_lines(cases, heads)]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--presets", default="tiny,paper,small")
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--block", type=int, default=4, help="steps per timed block")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.reps < 30:
        print(f"note: {args.reps} rounds (< 30): medians are rough", file=sys.stderr)
    reuse_freed_memory()  # as in a run's process, before JAX's threads start
    print(f"jax {jax.__version__} on {jax.devices()[0].device_kind}")
    for preset in args.presets.split(","):
        start = time.perf_counter()
        for line in bench_preset(preset.strip(), args.reps, args.block, args.warmup, args.seed):
            print(line, flush=True)
        print(f"({time.perf_counter() - start:.0f} s)\n", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
