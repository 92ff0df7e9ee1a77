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
``basis R=32 mlp+head``. Both by real steps, each in a fresh process. The search starts
from an estimate: XLA's memory analysis of the compiled step (arguments + outputs −
aliased + temporaries) at two batch sizes (three T, whose cost grows as T²), fitted by a
polynomial and solved for the device's allocator limit. From there it steps by 1, 2, 4 …
until one step runs and one fails, then bisects between them; the table shows the n that
ran and n + 1 that did not, and the estimate beside them. On a CPU (``--tiny``), which
never runs out of memory, a step "fails" when its compiled need exceeds ``--limit``.

Compiling dominates on a GPU (a gpt2 step compiles for tens of seconds), so every program
a phase will run is first compiled in parallel (``--workers`` processes, compile only)
into one persistent XLA compilation cache (``--cache``, autotuning results included);
the timed and the searching processes then load their executables from it. Nothing is
timed while another process runs.

``--explore`` times, in one process, what the defaults are chosen by: the three ways of
applying S to the head's dZ (16384 × 50257), the fused head at several chunk sizes
against logits then cross-entropy, and attention ``xla`` against ``recompute``.

    python bench/gpu.py [--shapes paper,bt16k,gpt2] [--fit] [--long-t] [--explore] [--tiny] [--json out.json]
    python bench/gpu.py --shapes gpt2 --fit --long-t     # one call per shape group on a GPU
    python bench/gpu.py --tiny --fit --long-t --explore  # every path, on a CPU
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
START = time.perf_counter()
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


def _need(compiled) -> int | None:
    """Bytes the compiled step needs on the device: arguments + outputs − aliased + temporaries."""
    m = compiled.memory_analysis()
    if m is None:
        return None
    return m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes + m.temp_size_in_bytes


def _device_limit(jax) -> int | None:
    stats = jax.devices()[0].memory_stats() or {}
    return stats.get("bytes_limit")


def one(spec: dict) -> dict:
    """Time and peak memory of one method at one shape (``--one``); with ``batch``, one
    real step at that batch size (the search's try); with ``compile_only``, the compile
    alone (filling the cache) and the step's compiled need against the device's limit."""
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
    need = _need(step)
    out = dict(spec, compile_s=compile_s, need_bytes=need, limit_bytes=spec.get("limit") or _device_limit(jax),
               device=f"jax {jax.__version__} on {jax.devices()[0].device_kind}")
    if spec.get("compile_only"):
        return dict(out, ok=True)
    if spec.get("limit") and need is not None and need > spec["limit"]:  # --tiny: a CPU never runs out
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
    return dict(out, **_timed(step, state, batch, root, spec))


def _timed(step, state, batch, root, spec: dict) -> dict:
    """ms/step: the median over ``blocks`` blocks of ``steps`` steps, one sync per block,
    after ``warmup`` steps; the allocator's peak read after them."""
    import jax

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
    return dict(ms=1e3 * statistics.median(times), ms_blocks=[1e3 * t for t in times],
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


def compile_all(specs: list[dict], workers: int, timeout: float) -> list[dict]:
    """Compile every spec's step, ``workers`` fresh processes at a time, into the
    persistent cache the later runs load from; returns each compile's result, and
    prints each as it ends (a lease's log shows where the time went)."""
    from concurrent.futures import ThreadPoolExecutor

    def compiled(spec: dict) -> dict:
        done = run_one(dict(spec, compile_only=True), timeout)
        what = " ".join(str(spec.get(k)) for k in ("shape_name", "method", "dtype", "batch", "seq_len") if spec.get(k))
        print(f"    compiled {what}: " + (f"{done['compile_s']:.0f} s" if done.get("ok") else f"failed: {done.get('error')}"),
              flush=True)
        return done

    if not specs:
        return []
    with ThreadPoolExecutor(max(1, workers)) as pool:
        return list(pool.map(compiled, specs))


BRACKET = 2  # the compiled neighbours of an estimate: n − 2 … n + 2, compiled at once


def _fitted_n(points: list[int], needs: list[int], limit: int) -> int:
    """The largest n whose need, by the polynomial through (points, needs) of degree
    len(points) − 1, stays under ``limit`` (need grows with n)."""
    import numpy as np

    poly = np.polynomial.Polynomial.fit(points, needs, deg=len(points) - 1)
    lo, hi = 1, max(points)
    while poly(hi) <= limit and hi < 1 << 20:
        lo, hi = hi, 2 * hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if poly(mid) <= limit else (lo, mid)
    return lo


def estimates(specs: list[dict], key: str, points: list[int], workers: int, timeout: float) -> list[int | None]:
    """Where each spec's real search starts. All specs compile at ``points`` at once;
    need(n) fitted through them is solved for the device's limit (n₀); then n₀ − 2 … n₀ + 2
    compile at once, filling the cache the tries load from, and the largest of them whose
    compiled need fits the limit is the start (n₀ − 2 when none fits; None without a
    memory analysis)."""
    wide = compile_all([dict(s, **{key: n}) for s in specs for n in points], workers, timeout)
    first = []
    for k in range(len(specs)):
        done = wide[k * len(points):(k + 1) * len(points)]
        needs = [d.get("need_bytes") for d in done]
        limit = next((d.get("limit_bytes") for d in done if d.get("limit_bytes")), None)
        first.append(_fitted_n(points, needs, limit) if limit and None not in needs else None)
    near = [(k, n) for k, n0 in enumerate(first) if n0 for n in range(max(1, n0 - BRACKET), n0 + BRACKET + 1)]
    done = compile_all([dict(specs[k], **{key: n}) for k, n in near], workers, timeout)
    fitting: dict[int, int] = {}
    for (k, n), d in zip(near, done):
        if d.get("need_bytes") is not None and d.get("limit_bytes") and d["need_bytes"] <= d["limit_bytes"]:
            fitting[k] = max(fitting.get(k, 0), n)
    return [fitting.get(k, n0 and max(1, n0 - BRACKET)) for k, n0 in enumerate(first)]


def largest(spec: dict, key: str, start: int, timeout: float, guess: int | None = None) -> dict:
    """The largest ``spec[key]`` (a batch size or a T) at which one real train step runs,
    each try in a fresh process (``run_one``): from ``start``, steps of 1, 2, 4 … up
    while steps run (down while they fail) until one runs and one fails, then bisection
    between them. Returns ``fits`` (the largest n that ran) and ``fails`` (n + 1, which
    did not), with the estimate it started from and the number of tries."""
    tried: dict[int, dict] = {}

    def ok(n: int) -> bool:
        if n not in tried:
            tried[n] = run_one(dict(spec, **{key: n}), timeout)
        return bool(tried[n].get("ok"))

    lo, hi = _bracket(ok, start)
    if lo is None or hi is None:
        why = tried[min(tried)].get("error") if lo is None else f"still fits at {lo}"
        return dict(spec, search=key, fits=lo, fails=hi, estimate=guess, error=why, tries=len(tried))
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return dict(spec, search=key, fits=lo, fails=hi, estimate=guess, fail_error=tried[hi].get("error"),
                tries=len(tried), peak_bytes=tried[lo].get("peak_bytes"), need_bytes=tried[lo].get("need_bytes"))


def search(specs: list[dict], key: str, points: list[int], workers: int, timeout: float, label: str) -> list[dict]:
    """``largest`` of every spec, from its compiled estimate, one spec at a time."""
    found = []
    for spec, start in zip(specs, estimates(specs, key, points, workers, timeout)):
        found.append(largest(spec, key, start or points[0], timeout, guess=start))
        f = found[-1]
        print(f"  {label} {spec['method']}: {f.get('fits')} fits, {f.get('fails')} does not "
              f"(estimate {f.get('estimate')}, {f.get('tries')} tries)", flush=True)
    return found


def _bracket(ok, start: int, cap: int = 1 << 16) -> tuple[int | None, int | None]:
    """(lo, hi) with ``ok(lo)`` and not ``ok(hi)``, galloping from ``start`` by 1, 2, 4 …;
    lo None when even 1 fails, hi None when ``cap`` still runs."""
    step = 1
    if ok(start):
        lo = start
        while lo < cap:
            n = min(lo + step, cap)
            if not ok(n):
                return lo, n
            lo, step = n, 2 * step
        return lo, None
    hi = start
    while hi > 1:
        n = max(hi - step, 1)
        if ok(n):
            return n, hi
        hi, step = n, 2 * step
    return None, hi


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
    a32 = jax.random.normal(jax.random.key(0), (rows, v))
    print(f"\nS·a for a of {rows} × {v} (ms); bfloat16: a in bfloat16, the one-hot S exact in it")
    for dtype in ("float32", "bfloat16"):
        a = a32.astype(dtype)
        for rank in (1, 8, 32):
            sk = draw_sketch(jax.random.key(rank), "balanced", rows, rank)
            cells = {}
            for method in SKETCH_METHODS:
                f = jax.jit(lambda a, sk=sk, method=method: apply_sketch(sk, a, method))
                cells[method] = _bench(f, a)
            rows_out.append(dict(kind="sketch", dtype=dtype, rank=rank, **cells))
            print(f"  {dtype:<9} R={rank:<3}" + "".join(f" {m} {t:7.3f}" for m, t in cells.items()))
        del a
    del a32
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
    print(f"\n{title} (real steps, each in a fresh process; from the compiled estimate, then bisection)")
    print(f"  {'method':<22}{'fits':>8}{'fails':>8}{'×exact':>8}{'estimate':>10}{'tries':>7}  why n+1 failed")
    for f in fits:
        ratio = f"{f['fits'] / base['fits']:.2f}" if base and f.get("fits") else "-"
        why = (f.get("fail_error") or f.get("error") or "")[:70]
        print(f"  {f['method']:<22}{f.get('fits') or '-':>8}{f.get('fails') or '-':>8}{ratio:>8}"
              f"{f.get('estimate') or '-':>10}{f.get('tries', 0):>7}  {why}")


def parse_args(argv=None) -> argparse.Namespace:
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
    ap.add_argument("--workers", type=int, default=min(8, os.cpu_count() or 1),
                    help="processes that compile at once into the cache (nothing is timed meanwhile)")
    ap.add_argument("--cache", type=Path, default=None,
                    help="the persistent XLA compilation cache (default: a fresh temporary folder)")
    ap.add_argument("--timeout", type=float, default=300, help="seconds per method's process")
    ap.add_argument("--deadline", type=float, default=0,
                    help="seconds: start no timed run after this long (a lease's end), print what ran")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--explore-one", action="store_true", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def use_cache(path: Path | None) -> Path:
    """Every child compiles into, and loads from, one persistent cache (inherited environment)."""
    import tempfile

    path = path or Path(tempfile.mkdtemp(prefix="basis-lab-gpu-cache-"))
    os.environ["JAX_COMPILATION_CACHE_DIR"] = str(path)
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"
    return path


def run_explore(args) -> list | None:
    done = subprocess.run([sys.executable, __file__, "--explore-one"] + (["--tiny"] if args.tiny else []),
                          capture_output=True, text=True, timeout=args.timeout * 2)
    print("\n".join(line for line in done.stdout.splitlines() if not line.startswith("[")))
    if done.returncode:
        print(done.stderr[-2000:])
    return next((json.loads(x) for x in done.stdout.splitlines() if x.startswith("[")), None)


def run_searches(args, shapes: dict, limit: int) -> tuple[list[dict], list[dict]]:
    """--fit (batch at gpt2 T 1024) and --long-t (T at gpt2, B 1: positions grow with T, attention as T²)."""
    gpt2 = shapes["gpt2"]
    fits = longs = []
    if args.fit:
        specs = [dict(shape=gpt2, method=m, limit=limit) for m in args.fit_methods.split(",")]
        fits = search(specs, "batch", [gpt2[0], 2 * gpt2[0]], args.workers, args.timeout, "fit B")
    if args.long_t:
        specs = [dict(shape=gpt2, method=m, batch=1, limit=limit) for m in LONG_T_METHODS]
        longs = search(specs, "seq_len", [gpt2[1], 2 * gpt2[1], 4 * gpt2[1]], args.workers, args.timeout, "long T")
    return fits, longs


def run_table(args, shapes: dict) -> list[dict]:
    """Every method × dtype × shape: compiled in parallel first, then timed one at a time."""
    specs = [dict(shape_name=name, shape=shapes[name], method=m, dtype=d, steps=args.steps,
                  blocks=args.blocks, warmup=args.warmup)
             for name in args.shapes.split(",") for m in args.methods.split(",") for d in args.dtypes.split(",")]
    t0 = time.perf_counter()
    compile_all(specs, args.workers, args.timeout)
    print(f"  compiled {len(specs)} steps in {time.perf_counter() - t0:.0f} s ({args.workers} at a time)", flush=True)
    results = []
    for spec in specs:
        if args.deadline and time.perf_counter() - START > args.deadline:
            print(f"  {spec['shape_name']} {spec['method']} {spec['dtype']}: not run (past --deadline)", flush=True)
            continue
        r = run_one(spec, args.timeout)
        results.append(r)
        print(f"  {spec['shape_name']} {spec['method']} {spec['dtype']}: "
              + (f"{r['ms']:.2f} ms, peak {(r.get('peak_bytes') or 0) / 2**30:.2f} GiB, load {r['compile_s']:.1f} s"
                 if r.get("ok") else f"failed: {r.get('error')}"), flush=True)
    return results


def main(argv=None):
    args = parse_args(argv)
    if args.one:
        print(json.dumps(one(json.loads(args.one))))
        return
    if args.explore_one:
        print(json.dumps(explore(args.tiny)))
        return
    # this process never starts a JAX backend: the device memory is each child's alone
    cache = use_cache(args.cache)
    shapes = TINY if args.tiny else SHAPES
    print(f"one process per method; ms/step: median of {args.blocks} blocks of {args.steps} steps; "
          f"cache {cache}", flush=True)
    out: dict = {}
    if args.explore:
        out["explore"] = run_explore(args)
    limit = TINY_LIMIT if args.tiny and not args.limit else args.limit
    out["fit"], out["long_t"] = run_searches(args, shapes, limit)
    out["table"] = [] if args.no_table else run_table(args, shapes)
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    if out["table"]:
        print_table(out["table"])
    if out["fit"]:
        print_fit(out["fit"], f"largest batch at gpt2 T {shapes['gpt2'][1]}", "batch")
    if out["long_t"]:
        print_fit(out["long_t"], "longest T at gpt2, B 1", "seq_len")


if __name__ == "__main__":
    os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.95")
    main()
