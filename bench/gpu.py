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

``--fit`` finds, at gpt2 T 1024, the largest batch of ``exact``, ``exact+opts`` and
``basis R=32 mlp+head`` that fits the device: compiled memory (XLA's memory analysis:
arguments + outputs − aliased + temporaries) at two batch sizes gives a line, the
predicted largest batch is checked by compiling at it and at one more, and one real
step at it confirms (in a fresh process).

``--explore`` times, in one process, what the defaults are chosen by: the three ways of
applying S to the head's dZ (16384 × 50257), the fused head at several chunk sizes
against logits then cross-entropy, and attention ``xla`` against ``recompute``.

    python bench/gpu.py [--shapes paper,bt16k,gpt2] [--fit] [--explore] [--tiny] [--json out.json]
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
PLAIN = dict(head_chunk=0, attention="xla", recompute_activations=False, remat="none")


def model_for(shape, method: str, backend: str):
    """The ``GPTConfig`` of ``method`` at ``shape``: options are the run defaults
    (``RunConfig``) on ``backend`` except for plain ``exact``."""
    from engine.config import RunConfig
    from engine.core.presets import GPTConfig

    b, t, d, heads, layers, vocab = shape
    base = GPTConfig(vocab_size=vocab, seq_len=t, d_model=d, n_heads=heads, n_layers=layers)
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
    cfg = model_for(shape, spec["method"], backend)
    opt, state, batch = _setup(cfg, b)
    root = jax.random.key(1)
    t0 = time.perf_counter()
    step = make_train_step(cfg, opt).lower(state, batch, root).compile()
    compile_s = time.perf_counter() - t0
    out = dict(spec, compile_s=compile_s, device=f"jax {jax.__version__} on {jax.devices()[0].device_kind}")
    try:
        state, loss = step(state, batch, jax.random.fold_in(root, 0))
        jax.block_until_ready(loss)
    except Exception as e:  # an out-of-memory error on the device: the batch does not fit
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


def compiled_need(cfg, batch_size: int) -> int:
    """Bytes XLA's memory analysis says the compiled train step needs at ``batch_size``."""
    import jax
    import jax.numpy as jnp

    from engine.model.gpt import init_params
    from engine.training.steps import init_state, make_optimizer, make_train_step

    opt = make_optimizer("sgd", 0.01)
    params = jax.eval_shape(lambda: init_params(cfg, jax.random.key(0)))
    state = jax.eval_shape(lambda p: init_state(p, opt), params)
    batch = jax.ShapeDtypeStruct((batch_size, cfg.seq_len + 1), jnp.int32)
    m = make_train_step(cfg, opt).lower(state, batch, jax.random.key(1)).compile().memory_analysis()
    return int(m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes + m.temp_size_in_bytes)


def fit(spec: dict) -> dict:
    """Largest batch whose compiled step fits ``bytes_limit`` (``--fit-one``)."""
    import jax

    shape = tuple(spec["shape"])
    cfg = model_for(shape, spec["method"], jax.default_backend())
    limit = (jax.devices()[0].memory_stats() or {}).get("bytes_limit") or spec.get("limit") or 16 << 30
    b0 = shape[0]
    n0, n1 = compiled_need(cfg, b0), compiled_need(cfg, 2 * b0)
    per_seq = (n1 - n0) / b0
    guess = max(1, int((limit - (n0 - per_seq * b0)) // per_seq))
    # compiled memory is linear in B (every activation has a batch axis): the line
    # through two compiles predicts the largest B; one real step confirms it
    return dict(spec, limit=limit, per_seq_bytes=per_seq, largest=guess,
                needs={str(b0): n0, str(2 * b0): n1})


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
    for shape in dict.fromkeys(r["shape_name"] for r in results):
        rows = [r for r in results if r["shape_name"] == shape]
        base = next((r for r in rows if r["method"] == "exact" and r.get("ok")), None)
        b, t, d, h, layers, v = rows[0]["shape"]
        print(f"\n{shape}: B {b}, T {t}, d {d}, {h} heads, {layers} layers, V {v}")
        print(f"  {'method':<22}{'ms/step':>9}{'×exact':>8}{'peak GiB':>10}{'×exact':>8}")
        for r in rows:
            if not r.get("ok"):
                print(f"  {r['method']:<22}  failed: {r.get('error')}")
                continue
            tr = f"{r['ms'] / base['ms']:.3f}" if base else "-"
            peak = r.get("peak_bytes")
            pr = f"{peak / base['peak_bytes']:.3f}" if base and peak and base.get("peak_bytes") else "-"
            print(f"  {r['method']:<22}{r['ms']:>9.2f}{tr:>8}{(peak or 0) / gib:>10.2f}{pr:>8}")


def print_fit(fits: list[dict]) -> None:
    base = next((f for f in fits if f["method"] == "exact" and f.get("largest")), None)
    print("\nlargest batch at gpt2 T 1024 (compiled memory analysis, confirmed by one real step)")
    print(f"  {'method':<22}{'largest B':>10}{'×exact':>8}{'GiB/seq':>9}  confirmed")
    for f in fits:
        if not f.get("largest"):
            print(f"  {f['method']:<22}  failed: {f.get('error')}")
            continue
        ratio = f"{f['largest'] / base['largest']:.2f}" if base else "-"
        conf = f.get("confirm", {})
        ok = "yes" if conf.get("ok") else f"no ({conf.get('error', '')[:60]})"
        print(f"  {f['method']:<22}{f['largest']:>10}{ratio:>8}{f['per_seq_bytes'] / 2**30:>9.3f}  {ok}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="paper,bt16k,gpt2")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--steps", type=int, default=20, help="steps per timed block (one sync per block)")
    ap.add_argument("--blocks", type=int, default=5, help="timed blocks; the median counts")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--fit", action="store_true", help="largest batch at gpt2 T 1024")
    ap.add_argument("--fit-methods", default=",".join(FIT_METHODS))
    ap.add_argument("--no-table", action="store_true", help="skip the step-time table")
    ap.add_argument("--explore", action="store_true", help="time sketch methods, head chunks, attention")
    ap.add_argument("--tiny", action="store_true", help="small shapes (for a CPU)")
    ap.add_argument("--timeout", type=float, default=300, help="seconds per method's process")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--fit-one", help=argparse.SUPPRESS)
    ap.add_argument("--explore-one", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(one(json.loads(args.one))))
        return
    if args.fit_one:
        print(json.dumps(fit(json.loads(args.fit_one))))
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
    fits = []
    if args.fit:  # one at a time: compiling autotunes on the device, which takes memory
        for method in args.fit_methods.split(","):
            try:
                done = subprocess.run([sys.executable, __file__, "--fit-one", json.dumps(dict(shape=shapes["gpt2"], method=method))],
                                      capture_output=True, text=True, timeout=args.timeout * 2)
                line = next((x for x in reversed(done.stdout.splitlines()) if x.startswith("{")), None)
                f = json.loads(line) if line else dict(method=method, largest=None, error=done.stderr.strip()[-200:])
            except subprocess.TimeoutExpired:
                f = dict(method=method, largest=None, error="timed out")
            while f.get("largest"):  # step down until one real step runs (at most 3 tries)
                f["confirm"] = run_one(dict(shape=shapes["gpt2"], method=method, batch=f["largest"]), args.timeout)
                if f["confirm"].get("ok") or f.setdefault("tries", 0) >= 2:
                    break
                f["tries"] += 1
                f["largest"] = int(f["largest"] * 0.95)
            fits.append(f)
            print(f"  fit {method}: {f.get('largest')} {f.get('confirm', {}).get('ok')} {f.get('error', '')}", flush=True)
        out["fit"] = fits
    results = []
    if not args.no_table:
        for name in args.shapes.split(","):
            for method in args.methods.split(","):
                spec = dict(shape_name=name, shape=shapes[name], method=method, steps=args.steps,
                            blocks=args.blocks, warmup=args.warmup)
                r = run_one(spec, args.timeout)
                results.append(r)
                print(f"  {name} {method}: " + (f"{r['ms']:.2f} ms, peak {(r.get('peak_bytes') or 0) / 2**30:.2f} GiB, "
                                                f"compile {r['compile_s']:.0f} s" if r.get("ok") else f"failed: {r.get('error')}"),
                      flush=True)
        out["table"] = results
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    if results:
        print_table(results)
    if fits:
        print_fit(fits)


if __name__ == "__main__":
    os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.95")
    main()
