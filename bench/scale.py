"""What one run on several devices moves between them, and a smoke figure of its speed.

Three methods: ``exact``; ``basis`` R = 32 (mlp+head) whose dW is all-reduced; and
``basis`` R = 32 with ``dw_comm="sketch"``, which all-gathers every device's R×d_in and
R×d_out sketches instead of the d_in×d_out dW.

1. Collective bytes per train step, read from the compiled HLO
   (``engine.training.collectives``: every all-reduce / all-gather / reduce-scatter and
   the shapes it carries), at the paper shape and GPT-2 small's (d 768, 12 layers, 12
   heads, T 1024, V 50257), on D = 4 and 8 devices. Compile only: the state is abstract
   (``jax.eval_shape``), so GPT-2 needs no memory. Global batch 8 sequences.
   ``payload MiB``: the arrays the collectives carry (an all-gather's gathered result);
   ``ring MiB/dev``: what each device sends under ring algorithms (all-reduce
   2(D−1)/D·S, all-gather (D−1)/D·S); ``÷ exact``: ring bytes against exact's.
   Also the prediction for the sketched layers alone: all-reduce 2(D−1)/D·4·Σ d_in·d_out,
   all-gather (D−1)/D·4·D·R·Σ(d_in + d_out).
2. ``--shard-params``: the compiled step's argument bytes per device (the state it
   holds between steps, plus the batch and key), replicated against sharded.
3. Step time on 1, 2 and 4 forced CPU devices, paper preset, global batch 4: a smoke
   figure (forced CPU devices share this machine's cores; it shows the overhead of the
   mesh path, not a speed-up), as the median of ``--steps`` steps, ÷ 1-device exact.

    python bench/scale.py [--steps 20] [--skip-gpt2] [--skip-time]

Forces ``XLA_FLAGS=--xla_force_host_platform_device_count=8`` when XLA_FLAGS is unset.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import argparse  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh  # noqa: E402
from tabulate import tabulate  # noqa: E402

from engine.core.presets import PRESETS, GPTConfig  # noqa: E402
from engine.model.gpt import init_params  # noqa: E402
from engine.training import collectives, parallel  # noqa: E402
from engine.training.steps import init_state, make_optimizer  # noqa: E402

MIB = 2**20
RANK = 32
BATCH = 8
GPT2 = GPTConfig(vocab_size=50257, seq_len=1024, d_model=768, n_heads=12, n_layers=12)
METHODS = (("exact", "exact", "all-reduce"), ("basis R=32 all-reduce", "basis", "all-reduce"),
           ("basis R=32 sketch all-gather", "basis", "sketch"))


def shapes() -> dict[str, GPTConfig]:
    return {"paper": PRESETS["paper"].model, "gpt2": PRESETS["gpt2"].model if "gpt2" in PRESETS else GPT2}


def model(base: GPTConfig, estimator: str, rows: int) -> GPTConfig:
    """``base`` as a CPU run of ``estimator`` trains it (fused head in chunks of 256 rows)."""
    return base.replace(estimator=estimator, rank=RANK, head_chunk=min(rows, 256))


def layout(devices: int, shard: bool = False) -> parallel.Layout:
    return parallel.Layout(Mesh(np.array(jax.devices()[:devices]), (parallel.DATA,)), shard_params=shard)


def compiled_step(cfg: GPTConfig, lay: parallel.Layout, comm: str, batch: int = BATCH):
    """The train step compiled for abstract state, batch and key on ``lay``'s mesh."""
    optimizer = make_optimizer("sgd", 0.01)
    state = jax.eval_shape(lambda: init_state(init_params(cfg, jax.random.key(0)), optimizer))
    shardings = lay.state_shardings(state)
    state = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), state, shardings)
    step = parallel.make_train_step(cfg, optimizer, lay, state, comm)
    tokens = jax.ShapeDtypeStruct((batch, cfg.seq_len + 1), np.int32, sharding=lay.rows())
    key = jax.ShapeDtypeStruct((2,), np.uint32, sharding=lay.replicated)
    return step.lower(state, tokens, key).compile()


def predicted(cfg: GPTConfig, devices: int) -> tuple[float, float]:
    """Ring bytes per device of the sketched layers' dW: (all-reduce, sketch all-gather)."""
    d, v, layers = cfg.d_model, cfg.vocab_size, cfg.n_layers
    dims = [(d, 4 * d), (4 * d, d)] * layers + [(d, v)]  # mlp fc, proj per block, head
    share = (devices - 1) / devices
    reduce = 2 * share * 4 * sum(i * o for i, o in dims)
    gather = share * 4 * devices * RANK * sum(i + o for i, o in dims)
    return reduce, gather


def collective_table(skip_gpt2: bool) -> None:
    rows = []
    for name, base in shapes().items():
        if skip_gpt2 and name == "gpt2":
            continue
        for devices in (4, 8):
            lay = layout(devices)
            exact_ring = None
            for label, estimator, comm in METHODS:
                t0 = time.perf_counter()
                text = compiled_step(model(base, estimator, BATCH * base.seq_len), lay, comm).as_text()
                table = collectives.bytes_by_op(text, devices)
                ring = sum(r["ring_bytes"] for r in table.values())
                exact_ring = exact_ring or ring
                reduce_p, gather_p = predicted(base, devices)
                rows.append([
                    name, devices, label,
                    *(f"{table.get(op, {}).get('bytes', 0) / MIB:.2f}" for op in ("all-reduce", "all-gather")),
                    f"{ring / MIB:.2f}", f"{ring / exact_ring:.3f}",
                    f"{(gather_p if comm == 'sketch' else reduce_p) / MIB:.2f}" if estimator != "exact" else "",
                    f"{time.perf_counter() - t0:.0f}",
                ])
                print(*rows[-1], flush=True)
    print()
    print(tabulate(rows, headers=["shape", "D", "method", "all-reduce MiB", "all-gather MiB", "ring MiB/dev",
                                  "÷ exact", "sketched dW ring MiB/dev (predicted)", "compile s"]))


def shard_table(skip_gpt2: bool) -> None:
    rows = []
    for name, base in shapes().items():
        if skip_gpt2 and name == "gpt2":
            continue
        cfg = model(base, "exact", BATCH * base.seq_len)
        for devices in (4, 8):
            sizes = {}
            for shard in (False, True):
                compiled = compiled_step(cfg, layout(devices, shard), "all-reduce")
                sizes[shard] = compiled.memory_analysis().argument_size_in_bytes
                text = compiled.as_text()
                if shard:
                    gathered = collectives.bytes_by_op(text, devices).get("all-gather", {}).get("bytes", 0)
            rows.append([name, devices, f"{sizes[False] / MIB:.1f}", f"{sizes[True] / MIB:.1f}",
                         f"{sizes[True] / sizes[False]:.3f}", f"{(sizes[False] - sizes[True]) / MIB:.1f}",
                         f"{gathered / MIB:.1f}"])
            print(*rows[-1], flush=True)
    print()
    print(tabulate(rows, headers=["shape", "D", "replicated MiB/dev", "sharded MiB/dev", "ratio", "saved MiB/dev",
                                  "params all-gathered MiB/step"]))


def time_table(steps: int) -> None:
    base = PRESETS["paper"].model
    batch = 4
    rng = np.random.default_rng(0)
    rows, baseline = [], None
    for label, estimator, comm in METHODS:
        for devices in (1, 2, 4):
            lay = layout(devices)
            cfg = model(base, estimator, batch * base.seq_len)
            optimizer = make_optimizer("sgd", 0.01)
            state = lay.put_state(init_state(init_params(cfg, jax.random.key(0)), optimizer))
            step = parallel.make_train_step(cfg, optimizer, lay, state, comm)
            tokens = [lay.put(rng.integers(0, base.vocab_size, (batch, base.seq_len + 1), dtype=np.int32), lay.rows())
                      for _ in range(4)]
            keys = [lay.put_key(jax.random.key(i)) for i in range(4)]
            state, loss = step(state, tokens[0], keys[0])  # compile
            jax.block_until_ready(loss)
            times = []
            for i in range(steps):
                t0 = time.perf_counter()
                state, loss = step(state, tokens[i % 4], keys[i % 4])
                jax.block_until_ready(loss)
                times.append(time.perf_counter() - t0)
            ms = statistics.median(times) * 1e3
            baseline = baseline or ms
            rows.append([label, devices, f"{ms:.1f}", f"{ms / baseline:.2f}"])
            print(*rows[-1], flush=True)
    print()
    print(tabulate(rows, headers=["method", "devices", "step ms (median)", "÷ exact on 1"]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20, help="timed steps per setting (default 20)")
    ap.add_argument("--skip-gpt2", action="store_true", help="leave out the GPT-2 shape (its compiles are slow)")
    ap.add_argument("--skip-time", action="store_true", help="leave out the step-time table")
    args = ap.parse_args()
    print(f"jax {jax.__version__}, {jax.device_count()} {jax.devices()[0].platform} devices; batch {BATCH} sequences, "
          f"R = {RANK}, mlp+head sketched\n")
    print("1. Collective bytes per train step (compiled HLO)")
    collective_table(args.skip_gpt2)
    print("\n2. --shard-params: compiled step arguments per device (exact, SGD with momentum)")
    shard_table(args.skip_gpt2)
    if not args.skip_time:
        print("\n3. Step time, paper preset, global batch 4, forced CPU devices (smoke figure)")
        time_table(args.steps)


if __name__ == "__main__":
    main()
