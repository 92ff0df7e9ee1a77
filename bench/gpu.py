"""Step time, device peak memory and the largest batch of exact backprop and BASIS, for a GPU.

Runs anywhere (``--tiny`` for small shapes on a CPU); its figures count on a GPU.
Shapes (random token batches, SGD + momentum):

- ``paper``: B 1, T 64, d 64, 2 heads, 2 layers, vocab 50257 (the paper's run),
- ``bt16k``: B 16, T 1024, d 256, 4 heads, 4 layers (B·T = 16384),
- ``gpt2``: B 8, T 1024, d 768, 12 heads, 12 layers (the ``gpt2`` preset).

Methods: ``exact`` (plain backprop: logits then cross-entropy, XLA attention, nothing
recomputed), ``exact+opts`` (the run defaults on this backend: fused head in
``FUSED_CHUNK`` rows, recompute attention, LayerNorm/GELU keeping their inputs), and
``basis`` R ∈ {1, 8, 32} on ``mlp+head`` and ``all`` with the same options.

Each method runs in a fresh process (``--one``), so the allocator's
``peak_bytes_in_use`` is that method's alone: ms/step is the median over ``--blocks``
blocks of ``--steps`` steps with one ``block_until_ready`` per block, taken after
warm-up steps; the peak is read after those real steps. Ratios are to plain ``exact``
of the same shape, measured in the same run.

Every method runs in each of ``--dtypes`` (float32 and bfloat16), and every ratio is
given twice: ``×exact`` against plain exact and ``×opts`` against ``exact+opts``, the
exact step with the same memory options as BASIS (like with like).

``--fit`` finds, at gpt2 T 1024, the largest batch of ``exact``, ``exact+opts`` and
``basis R=32 mlp+head``; ``--long-t`` the longest T at gpt2, B 1, of ``exact`` and
``basis R=32 mlp+head``. Both by real steps, each in a fresh process: doubling until a
step fails, then bisection; the table shows the n that ran and n + 1 that did not. On a
CPU (``--tiny``), which never runs out of memory, a step "fails" when its compiled need
(XLA's memory analysis: arguments + outputs − aliased + temporaries) exceeds ``--limit``.

``--explore`` times, in one process, what the defaults are chosen by: the three ways of
applying S to the head's dZ (16384 × 50257), the fused head at several chunk sizes
against logits then cross-entropy, and attention ``xla`` against ``recompute``.

    python bench/gpu.py [--shapes paper,bt16k,gpt2] [--fit] [--long-t] [--explore] [--tiny] [--json out.json]
    python bench/gpu.py --shapes gpt2 --fit --long-t     # one call per shape group on a GPU
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

SHAPES = {  # name → (B, T, d, heads, layers, vocab)
    "paper": (1, 64, 64, 2, 2, 50257),
    "bt16k": (16, 1024, 256, 4, 4, 50257),
    "gpt2": (8, 1024, 768, 12, 12, 50257),
}
TINY = {  # --tiny: the same roles at CPU sizes
    "paper": (1, 64, 64, 2, 2, 2048),
    "bt16k": (4, 128, 64, 2, 2, 2048),
    "gpt2": (2, 128, 96, 4, 3, 2048),
}
METHODS = ["exact", "exact+opts"] + [f"basis R={r} {layers}" for layers in ("mlp+head", "all") for r in (1, 8, 32)]
FIT_METHODS = ["exact", "exact+opts", "basis R=32 mlp+head"]
LONG_T_METHODS = ["exact", "basis R=32 mlp+head"]
TINY_LIMIT = 192 << 20  # --tiny's stand-in for device memory (bytes of the compiled step)
PLAIN = dict(head_chunk=0, attention="xla", recompute_activations=False, remat="none")


def model_for(shape, method: str, backend: str, dtype: str = "float32"):
    """The ``GPTConfig`` of ``method`` at ``shape`` in ``dtype``: options are the run
    defaults (``RunConfig``) on ``backend`` except for plain ``exact``."""
    from engine.config import RunConfig
    from engine.core.presets import GPTConfig

    b, t, d, heads, layers, vocab = shape
    base = GPTConfig(vocab_size=vocab, seq_len=t, d_model=d, n_heads=heads, n_layers=layers, dtype=dtype)
    if method == "exact":
        return base.replace(**PLAIN)
    run = RunConfig(preset="tiny", batch_size=b, seq_len=t)
    opts = dict(head_chunk=run.effective_head_chunk(backend), attention=run.attention,
                recompute_activations=run.recompute_activations, remat=run.remat)
    if method == "exact+opts":
        return base.replace(**opts)
    _, rank, layers_ = method.split()
    return base.replace(**opts, estimator="basis", rank=int(rank[2:]), sketched_layers=layers_)


def _setup(cfg, batch_size: int):
    import jax
    import jax.numpy as jnp

    from engine.model.gpt import init_params
    from engine.training.steps import init_state, make_optimizer

    opt = make_optimizer("sgd", 0.01)
    state = init_state(init_params(cfg, jax.random.key(0)), opt)
    batch = jax.random.randint(jax.random.key(2), (batch_size, cfg.seq_len + 1), 0, cfg.vocab_size, jnp.int32)
    return opt, state, batch


def one(spec: dict) -> dict:
    """Time and peak memory of one method at one shape (``--one``), or, with ``batch``,
    one real step at that batch size (the fit's confirmation)."""
    import jax

    from engine.training.steps import make_train_step

    backend = jax.default_backend()
    shape = tuple(spec["shape"])
    b = spec.get("batch") or shape[0]
    if spec.get("seq_len"):  # the long-context search: this T
        shape = (shape[0], spec["seq_len"], *shape[2:])
    cfg = model_for(shape, spec["method"], backend, spec.get("dtype", "float32"))
    opt, state, batch = _setup(cfg, b)
    root = jax.random.key(1)
    t0 = time.perf_counter()
    step = make_train_step(cfg, opt).lower(state, batch, root).compile()
    compile_s = time.perf_counter() - t0
    out = dict(spec, compile_s=compile_s, device=f"jax {jax.__version__} on {jax.devices()[0].device_kind}")
    if spec.get("limit"):  # --tiny: a stand-in for device memory, which a CPU does not run out of
        m = step.memory_analysis()
        need = m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes + m.temp_size_in_bytes
        if need > spec["limit"]:
            return dict(out, ok=False, error=f"needs {need} compiled bytes > limit {spec['limit']}")
    try:
        state, loss = step(state, batch, jax.random.fold_in(root, 0))
        jax.block_until_ready(loss)
    except RuntimeError as e:  # XlaRuntimeError RESOURCE_EXHAUSTED, out of device memory: the batch does not fit
        return dict(out, ok=False, error=str(e).splitlines()[0][:200])
    out.update(ok=True, loss=float(loss))
    if spec.get("batch"):
        stats = jax.devices()[0].memory_stats() or {}
        return dict(out, peak_bytes=stats.get("peak_bytes_in_use"))
    for i in range(spec["warmup"]):
        state, loss = step(state, batch, jax.random.fold_in(root, i + 1))
    jax.block_until_ready(state)
    times, n = [], spec["steps"]
    for blk in range(spec["blocks"]):
        t0 = time.perf_counter()
        for i in range(n):
            state, loss = step(state, batch, jax.random.fold_in(root, 1000 + blk * n + i))
        jax.block_until_ready(state)
        times.append((time.perf_counter() - t0) / n)
    stats = jax.devices()[0].memory_stats() or {}
    return dict(out, ms=1e3 * statistics.median(times), ms_blocks=[1e3 * t for t in times],
                peak_bytes=stats.get("peak_bytes_in_use"), final_loss=float(loss))


def run_one(spec: dict, timeout: float) -> dict:
    """``one(spec)`` in a fresh Python process."""
    cmd = [sys.executable, __file__, "--one", json.dumps(spec)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return dict(spec, ok=False, error=f"timed out after {timeout:.0f} s")
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
    return dict(spec, ok=False, error=tail[:200])


def largest(spec: dict, key: str, start: int, timeout: float, cap: int = 1 << 16) -> dict:
    """The largest ``spec[key]`` (a batch size or a T) at which one real train step runs,
    each try in a fresh process (``run_one``): doubling from ``start`` until a step
    fails, then bisection between the last success and the first failure. Returns the
    largest n that ran and n + 1, which did not (``fits``/``fails``, with their results)."""
    tried: dict[int, dict] = {}

    def ok(n: int) -> bool:
        tried[n] = run_one(dict(spec, **{key: n}), timeout)
        return bool(tried[n].get("ok"))

    if not ok(start):
        return dict(spec, search=key, fits=None, fails=start, error=tried[start].get("error"), tries=len(tried))
    lo, hi = start, None
    while hi is None and lo < cap:
        n = min(2 * lo, cap)
        if ok(n):
            lo = n
        else:
            hi = n
    if hi is None:
        return dict(spec, search=key, fits=lo, fails=None, error=f"still fits at the cap {cap}", tries=len(tried))
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return dict(spec, search=key, fits=lo, fails=hi, fail_error=tried[hi].get("error"), tries=len(tried),
                peak_bytes=tried[lo].get("peak_bytes"))


# ----------------------------------------------------------------------------- explore


def _bench(fn, *args, reps=20):
    import jax

    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(reps):
            out = fn(*args)
        jax.block_until_ready(out)
        times.append((time.perf_counter() - t0) / reps)
    return 1e3 * statistics.median(times)


def explore(tiny: bool) -> list[dict]:
    """What the defaults are chosen by, timed in this process."""
    import jax

    from engine.sketch.attention import causal_attention
    from engine.sketch.basis import SKETCH_METHODS, apply_sketch, draw_sketch
    from engine.sketch.head import head_loss

    rows, n, v = (2048, 64, 2048) if tiny else (16384, 256, 50257)
    rows_out = []
    a = jax.random.normal(jax.random.key(0), (rows, v))
    print(f"\nS·a for a of {rows} × {v} (ms)")
    for rank in (1, 8, 32):
        sk = draw_sketch(jax.random.key(rank), "balanced", rows, rank)
        cells = {}
        for method in SKETCH_METHODS:
            f = jax.jit(lambda a, sk=sk, method=method: apply_sketch(sk, a, method))
            cells[method] = _bench(f, a)
        rows_out.append(dict(kind="sketch", rank=rank, **cells))
        print(f"  R={rank:<3}" + "".join(f" {m} {t:7.3f}" for m, t in cells.items()))
    del a
    kx, kw, kt = jax.random.split(jax.random.key(1), 3)
    x = jax.random.normal(kx, (rows, n))
    w = jax.random.normal(kw, (n, v)) * 0.02
    t = jax.random.randint(kt, (rows,), 0, v)
    import optax

    def unfused(x, w):
        return optax.softmax_cross_entropy_with_integer_labels(x @ w, t).mean()

    def peak_of(f):
        m = f.lower(x, w).compile().memory_analysis()
        return m.temp_size_in_bytes if m is not None else 0

    print(f"\nLM head value+grad, {rows} rows, d {n}, V {v} (ms, temp MiB)")
    g = jax.jit(jax.value_and_grad(unfused, argnums=(0, 1)))
    base = _bench(g, x, w, reps=5)
    rows_out.append(dict(kind="head", method="exact unfused", chunk=0, ms=base, temp=peak_of(g)))
    print(f"  exact unfused          {base:8.3f} {peak_of(g) / 2**20:8.0f}")
    for estimator, rank in (("exact", 1), ("basis", 32), ("basis", 1)):
        key = jax.random.key(5)
        for chunk in ((256, 512, 1024) if tiny else (1024, 2048, 4096, 8192)):
            f = jax.jit(jax.value_and_grad(
                lambda x, w, c=chunk, e=estimator, r=rank: head_loss(x, w, t, key, chunk=c, estimator=e, rank=r),
                argnums=(0, 1)))
            ms = _bench(f, x, w, reps=5)
            label = estimator if estimator == "exact" else f"{estimator} R={rank}"
            rows_out.append(dict(kind="head", method=label, chunk=chunk, ms=ms, temp=peak_of(f)))
            print(f"  {label:<12} chunk {chunk:<5} {ms:8.3f} {peak_of(f) / 2**20:8.0f}  ×unfused {ms / base:.3f}")
    b, tt, h, dh = (2, 128, 2, 32) if tiny else (16, 1024, 4, 64)
    q, k, vv, do = jax.random.normal(jax.random.key(3), (4, b, tt, h, dh))
    print(f"\nattention value+grad B {b} T {tt} H {h} D {dh} (ms)")
    for impl in ("xla", "recompute"):
        f = jax.jit(lambda q, k, vv, impl=impl: jax.vjp(lambda q, k, vv: causal_attention(q, k, vv, impl), q, k, vv)[1](do))
        ms = _bench(f, q, k, vv)
        rows_out.append(dict(kind="attention", method=impl, ms=ms))
        print(f"  {impl:<10} {ms:8.3f}")
    return rows_out


# ----------------------------------------------------------------------------- main


def print_table(results: list[dict]) -> None:
    gib = 2**30
    print("\n" + next((r["device"] for r in results if r.get("device")), "no device"))
    for shape, dtype in dict.fromkeys((r["shape_name"], r.get("dtype", "float32")) for r in results):
        rows = [r for r in results if r["shape_name"] == shape and r.get("dtype", "float32") == dtype]
        base = next((r for r in rows if r["method"] == "exact" and r.get("ok")), None)
        opts = next((r for r in rows if r["method"] == "exact+opts" and r.get("ok")), None)
        b, t, d, h, layers, v = rows[0]["shape"]
        print(f"\n{shape} {dtype}: B {b}, T {t}, d {d}, {h} heads, {layers} layers, V {v}; "
              "×exact: plain exact, ×opts: exact with the same options as BASIS")
        print(f"  {'method':<22}{'ms/step':>9}{'×exact':>8}{'×opts':>8}{'peak GiB':>10}{'×exact':>8}{'×opts':>8}")

        def ratio(r, ref, key):
            return f"{r[key] / ref[key]:.3f}" if ref and r.get(key) and ref.get(key) else "-"

        for r in rows:
            if not r.get("ok"):
                print(f"  {r['method']:<22}  failed: {r.get('error')}")
                continue
            print(f"  {r['method']:<22}{r['ms']:>9.2f}{ratio(r, base, 'ms'):>8}{ratio(r, opts, 'ms'):>8}"
                  f"{(r.get('peak_bytes') or 0) / gib:>10.2f}{ratio(r, base, 'peak_bytes'):>8}{ratio(r, opts, 'peak_bytes'):>8}")


def print_fit(fits: list[dict], title: str, key: str) -> None:
    base = next((f for f in fits if f["method"] == "exact" and f.get("fits")), None)
    print(f"\n{title} (real steps, each in a fresh process; doubling then bisection)")
    print(f"  {'method':<22}{'fits':>8}{'fails':>8}{'×exact':>8}{'tries':>7}  why n+1 failed")
    for f in fits:
        ratio = f"{f['fits'] / base['fits']:.2f}" if base and f.get("fits") else "-"
        why = (f.get("fail_error") or f.get("error") or "")[:70]
        print(f"  {f['method']:<22}{f.get('fits') or '-':>8}{f.get('fails') or '-':>8}{ratio:>8}{f.get('tries', 0):>7}  {why}")


def main(argv=None):  # noqa: C901, PLR0915 — still to be split (issue 28)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="paper,bt16k,gpt2")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--steps", type=int, default=20, help="steps per timed block (one sync per block)")
    ap.add_argument("--blocks", type=int, default=5, help="timed blocks; the median counts")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--fit", action="store_true", help="largest batch at gpt2 T 1024")
    ap.add_argument("--long-t", action="store_true", help="longest T at gpt2, B 1, exact and basis R=32")
    ap.add_argument("--dtypes", default="float32,bfloat16", help="the table's dtypes, side by side")
    ap.add_argument("--limit", type=int, default=0,
                    help="bytes: a step whose compiled need exceeds it fails (default: the device's own memory; "
                         f"--tiny: {TINY_LIMIT >> 20} MiB, a CPU never runs out)")
    ap.add_argument("--fit-methods", default=",".join(FIT_METHODS))
    ap.add_argument("--no-table", action="store_true", help="skip the step-time table")
    ap.add_argument("--explore", action="store_true", help="time sketch methods, head chunks, attention")
    ap.add_argument("--tiny", action="store_true", help="small shapes (for a CPU)")
    ap.add_argument("--timeout", type=float, default=300, help="seconds per method's process")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--explore-one", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(one(json.loads(args.one))))
        return
    if args.explore_one:
        print(json.dumps(explore(args.tiny)))
        return
    # this process never starts a JAX backend: the device memory is each child's alone
    shapes = TINY if args.tiny else SHAPES
    print(f"one process per method; ms/step: median of {args.blocks} blocks of {args.steps} steps", flush=True)
    out: dict = {}
    if args.explore:
        done = subprocess.run([sys.executable, __file__, "--explore-one"] + (["--tiny"] if args.tiny else []),
                              capture_output=True, text=True, timeout=args.timeout * 2)
        print("\n".join(line for line in done.stdout.splitlines() if not line.startswith("[")))
        if done.returncode:
            print(done.stderr[-2000:])
        out["explore"] = next((json.loads(x) for x in done.stdout.splitlines() if x.startswith("[")), None)
    limit = TINY_LIMIT if args.tiny and not args.limit else args.limit
    fits, longs = [], []
    if args.fit:  # one at a time: compiling autotunes on the device, which takes memory
        for method in args.fit_methods.split(","):
            spec = dict(shape=shapes["gpt2"], method=method, limit=limit)
            fits.append(largest(spec, "batch", shapes["gpt2"][0], args.timeout))
            print(f"  fit {method}: B {fits[-1].get('fits')} fits, {fits[-1].get('fails')} does not", flush=True)
        out["fit"] = fits
    if args.long_t:  # gpt2, B 1: the longest sequence (positions table grows with T)
        for method in LONG_T_METHODS:
            spec = dict(shape=shapes["gpt2"], method=method, batch=1, limit=limit)
            longs.append(largest(spec, "seq_len", shapes["gpt2"][1], args.timeout))
            print(f"  long T {method}: T {longs[-1].get('fits')} fits, {longs[-1].get('fails')} does not", flush=True)
        out["long_t"] = longs
    results = []
    if not args.no_table:
        for name in args.shapes.split(","):
            for method, dtype in [(m, d) for m in args.methods.split(",") for d in args.dtypes.split(",")]:
                spec = dict(shape_name=name, shape=shapes[name], method=method, dtype=dtype, steps=args.steps,
                            blocks=args.blocks, warmup=args.warmup)
                r = run_one(spec, args.timeout)
                results.append(r)
                print(f"  {name} {method} {dtype}: " + (f"{r['ms']:.2f} ms, peak {(r.get('peak_bytes') or 0) / 2**30:.2f} GiB, "
                                                f"compile {r['compile_s']:.0f} s" if r.get("ok") else f"failed: {r.get('error')}"),
                      flush=True)
        out["table"] = results
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    if results:
        print_table(results)
    if fits:
        print_fit(fits, f"largest batch at gpt2 T {shapes['gpt2'][1]}", "batch")
    if longs:
        print_fit(longs, "longest T at gpt2, B 1", "seq_len")


if __name__ == "__main__":
    os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.95")
    main()
