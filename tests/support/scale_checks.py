"""Checks of one run on several devices, run in a subprocess that forces N CPU devices.

``python -m tests.support.scale_checks NAME [ARGS]`` with the environment of
``tests.support.xla.forced_devices(N)`` prints one JSON object: what
``tests/engine/test_scale.py`` asserts on. The rest of the suite keeps one device; these
checks need several, and XLA fixes the device count when it starts.
"""

from __future__ import annotations

import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from engine.config import RunConfig
from engine.model.gpt import init_params, loss_fn
from engine.sketch.basis import sketched_matmul
from engine.training import collectives, parallel
from engine.training.build import model_config, optimizer_for, run_keys, sketch_key
from engine.training.loop import train
from engine.training.steps import init_state
from tests.support import collector, xla

TINY = RunConfig(preset="tiny", batch_size=4, steps=4, eval_interval=2, probe_interval=0, lr=0.05, val_tokens=4096,
                 val_batches=2, rank=4, lam=0.0)


def _rel(a, b) -> float:
    """max over leaves of ‖a − b‖ / ‖b‖."""
    errs = jax.tree.map(lambda x, y: float(jnp.linalg.norm(x - y) / (jnp.linalg.norm(y) + 1e-30)), a, b)
    return max(jax.tree.leaves(errs))


def grads() -> dict:
    """The whole model's gradient on 4 devices against the 1-device exact gradient of the
    same global batch: exact; BASIS at R = the rows on each device (exact then), with the
    dW all-reduced or its sketches all-gathered; and, at R = 4, the all-gather against
    the all-reduce under the same keys (the same estimator, other communication). Also
    which collectives each compiled step holds."""
    out = {}
    rng = np.random.default_rng(0)
    batch = jnp.asarray(rng.integers(0, 50257, size=(4, 33)), jnp.int32)
    root = run_keys(0)[1]
    key = sketch_key(root, 7)
    base = TINY.replace(devices=4)
    layout = parallel.make_layout(base)
    params = init_params(model_config(base), run_keys(0)[0])
    local_rows = base.local_rows
    results, exact = {}, {}
    for name, estimator, rank, comm, head_chunk in (
        ("exact", "exact", 4, "all-reduce", None),
        ("basis_full_reduce", "basis", local_rows, "all-reduce", None),
        ("basis_full_gather", "basis", local_rows, "sketch", None),
        ("basis_full_gather_unfused", "basis", local_rows, "sketch", 0),  # the head as a SketchedDense
        ("basis4_reduce", "basis", 4, "all-reduce", None),
        ("basis4_gather", "basis", 4, "sketch", None),
        ("crs4_reduce", "crs", 4, "all-reduce", 0),
        ("crs4_gather", "crs", 4, "sketch", 0),
    ):
        cfg = model_config(base.replace(head_chunk=head_chunk))
        if head_chunk not in exact:  # the 1-device reference, once per head
            exact_cfg = cfg.replace(estimator="exact")
            loss_and_grad = jax.jit(jax.value_and_grad(lambda p: loss_fn(exact_cfg, p, batch, None)))
            exact[head_chunk] = loss_and_grad(params)
        want_loss, want = float(exact[head_chunk][0]), exact[head_chunk][1]
        c = cfg.replace(estimator=estimator, rank=rank, gather_axis=parallel.DATA if comm == "sketch" else None)
        fn = jax.jit(jax.shard_map(parallel.local_loss_and_grads(c, 4), mesh=layout.mesh,
                                   in_specs=(P(), P(parallel.DATA), P()), out_specs=(P(), P()), check_vma=False))
        loss, g = fn(params, batch, jax.random.key_data(key))
        results[name] = g
        out[f"{name}/loss_err"] = abs(float(loss) - want_loss)
        out[f"{name}/grad_err"] = _rel(g, want)
    for pair in ("basis4", "crs4"):
        out[f"{pair}_gather_vs_reduce"] = _rel(results[f"{pair}_gather"], results[f"{pair}_reduce"])
    # collectives of the compiled train step, each mode
    for comm in ("all-reduce", "sketch"):
        run = TINY.replace(devices=4, estimator="basis", rank=4, dw_comm=comm)
        cfg, opt = model_config(run), optimizer_for(run)
        layout = parallel.make_layout(run)
        state = layout.put_state(init_state(init_params(cfg, run_keys(0)[0]), opt))
        step = parallel.make_train_step(cfg, opt, layout, state, comm)
        text = step.lower(state, layout.put(np.asarray(batch), layout.rows()),
                          layout.put_key(key)).compile().as_text()
        out[f"collectives/{comm}"] = [[c.op, [list(d) for _, d in c.shapes]] for c in collectives.collectives(text, 4)]
    return out


def unbiased(estimator: str, comm: str) -> dict:
    """Monte Carlo over K keys of one sketched layer on 4 devices (6 rows each, R = 2):
    mean and std of every dW entry, the exact dW, and one dW at R = 6 (full local rank)."""
    devices, k = 4, 20_000
    layout = parallel.Layout(jax.sharding.Mesh(np.array(jax.devices()[:devices]), (parallel.DATA,)))
    kx, kw, kg = jax.random.split(jax.random.key(3), 3)
    x, w, g = jax.random.normal(kx, (24, 4)), jax.random.normal(kw, (4, 3)), jax.random.normal(kg, (24, 3))
    axis = parallel.DATA if comm == "sketch" else None

    def dws(rank, est):
        def local(x, g, keys):
            def one(key_data):
                key = parallel.device_key(key_data)
                loss = lambda w: jnp.sum(g * sketched_matmul(x, w, key, rank=rank, estimator=est, gather_axis=axis))
                return jax.grad(loss)(w)

            d = jax.vmap(one)(keys)
            return d if axis else jax.lax.psum(d, parallel.DATA)

        return jax.jit(jax.shard_map(local, mesh=layout.mesh, in_specs=(P(parallel.DATA), P(parallel.DATA), P()),
                                     out_specs=P(), check_vma=False))

    keys = jax.random.key_data(jax.random.split(jax.random.key(11), k))
    samples = np.asarray(dws(2, estimator)(x, g, keys), np.float64)
    full = np.asarray(dws(6, "basis")(x, g, keys[:3]), np.float64)

    def per_device(x, g, key_data):  # each device's own dW, no sum
        key = parallel.device_key(key_data)
        return jax.grad(lambda w: jnp.sum(g * sketched_matmul(x, w, key, rank=2, estimator=estimator)))(w)[None]

    same = jnp.tile(x[:6], (4, 1)), jnp.tile(g[:6], (4, 1))  # every device holds the same 6 rows
    own = jax.jit(jax.shard_map(per_device, mesh=layout.mesh, in_specs=(P(parallel.DATA), P(parallel.DATA), P()),
                                out_specs=P(parallel.DATA), check_vma=False))(*same, keys[0])
    return {
        "per_device_distinct": len({np.asarray(d).tobytes() for d in own}),
        "mean": samples.mean(axis=0).tolist(),
        "std": samples.std(axis=0, ddof=1).tolist(),
        "k": k,
        "exact": np.asarray(x.T @ g, np.float64).tolist(),
        "full_rank_basis": full.tolist(),
    }


def _losses(records) -> dict:
    """Each record's train and validation loss by step, and its per-batch validation losses as ``val_batch/<b>``."""
    out = {}
    for r in records:
        out[str(r.step)] = {k: v for k, v in r.values.items() if k in ("val_loss", "train_loss")}
        out[str(r.step)].update({f"val_batch/{b}": float(x) for b, x in enumerate(r.batch_losses.get("val", ()))})
    return out


def training() -> dict:
    """Exact runs on 1, 4 and 4 devices with sharded parameters: their losses at every
    eval; the compiled step's per-device argument bytes, replicated and sharded."""
    out = {}
    for name, changes in (("one", dict(devices=1)), ("four", dict(devices=4)),
                          ("sharded", dict(devices=4, shard_params=True)),
                          ("one_adamw", dict(devices=1, optimizer="adamw", lr=0.003)),
                          ("all_sharded_adamw", dict(devices=0, shard_params=True, optimizer="adamw", lr=0.003))):
        out[name] = _losses(train(TINY.replace(estimator="exact", **changes)))
    for shard in (False, True):
        run = TINY.replace(devices=4, shard_params=shard)
        cfg, opt = model_config(run), optimizer_for(run)
        layout = parallel.make_layout(run)
        state = layout.put_state(init_state(init_params(cfg, run_keys(0)[0]), opt))
        step = parallel.make_train_step(cfg, opt, layout, state, run.dw_comm)
        batch = layout.put(np.zeros((4, 33), np.int32), layout.rows())
        compiled = step.lower(state, batch, layout.put_key(jax.random.key(0))).compile()
        out[f"argument_bytes/{shard}"] = compiled.memory_analysis().argument_size_in_bytes
        out[f"leaf_shards/{shard}"] = sorted({len(a.sharding.device_set) if a.sharding.is_fully_replicated else
                                              -len(a.sharding.device_set) for a in jax.tree.leaves(state)})
    out["state_bytes"] = int(sum(a.nbytes for a in jax.tree.leaves(state)))
    return out


def resume(directory: str, devices: int, stop_after: int | None, twin: int | None = None) -> dict:
    """Train TINY (exact, sharded parameters) on ``devices`` with checkpoints in
    ``directory``, resuming from what is there and stopping after ``stop_after`` steps
    (None: to the end); with ``twin``, also the uninterrupted run on that many devices."""
    from engine.training.checkpoints import RunCheckpoints

    run = TINY.replace(estimator="exact", shard_params=True, checkpoint_interval=1)
    done = []
    with RunCheckpoints(directory, keep=3) as ck:
        records = list(train(run.replace(devices=devices), checkpoints=ck, resume=True, should_stop=lambda: bool(
            stop_after is not None and len(done) >= stop_after), on_step=lambda s, _: done.append(s)))
        steps = ck.steps()
    out = {"losses": _losses(records), "steps": steps, "done": done}
    if twin:
        out["twin"] = _losses(train(run.replace(devices=twin)))
    return out


def several(*checks: list) -> list:
    """Several checks in this one process, each ``[NAME, *ARGS]``: their results, in order.
    One start of JAX, the engine and the forced devices serves them all."""
    return [CHECKS[name](*args) for name, *args in checks]


CHECKS = {"grads": grads, "unbiased": unbiased, "training": training, "resume": resume, "several": several}

if __name__ == "__main__":
    xla.compile_bound()
    collector.tune()
    name, *args = sys.argv[1:]
    parsed = [json.loads(a) for a in args]
    print("RESULT " + json.dumps(CHECKS[name](*parsed)))
