"""What checkpointing costs a run, measured in one process, per preset.

For the ``paper`` and ``small`` presets (``basis`` R=32 on mlp+head, SGD with
momentum, random token batches of the preset's shape; no data is read):

- ``step ms``: median time of one train step without checkpointing;
- ``save ms`` / ``MiB``: median time of ``RunCheckpoints.save`` of the full state
  (params, momentum, step) plus the sampler state, loss window and config, and the
  size of one checkpoint on disk;
- ``sha256 ms`` / ``sha256/save``: median time of the SHA-256 of every saved array
  (``checkpoints.array_checksums``, what a save writes into its metadata and a restore
  computes again to verify it), and its share of ``save ms`` (which includes it);
- ``in-loop ms``: the extra time per checkpoint inside a training loop, from
  blocks of at least ``--block`` steps and ``--block-seconds`` run alternately
  with and without a save at the end
  (so a save's effect on the steps after it counts too);
- ``interval``: the recommended ``checkpoint_interval``: the steps in
  ``--target`` seconds (default 90 s, so at most ~2 minutes of work is lost),
  rounded down to a multiple of ``eval_interval`` (100), or to a divisor of it
  when a whole eval window takes longer, so checkpoints fall on eval boundaries;
  ``lost s`` the work between two checkpoints; ``overhead``: the cost of one
  checkpoint (the larger of ``save ms`` and ``in-loop ms``) / (interval x step);
- ``cold s``: a fresh run's time to its first trained step in this process
  (init params and optimizer, compile the step, one step), and ``resume s``: the
  time from the restore call to the first trained step (fresh target state,
  restore, sampler state, compile the step, one step), and their ratio.

    python bench/checkpoint.py [--presets paper small] [--block 10] [--block-seconds 5] [--pairs 3]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from tabulate import tabulate

from engine.data import BatchSampler
from engine.training.build import initial_params, model_config, optimizer_for, run_keys, sketch_key
from engine.training.checkpoints import RunCheckpoints, array_checksums
from engine.training.loop import RunConfig
from engine.training.steps import init_state, make_train_step

TOKENS = np.random.default_rng(0).integers(0, 50257, size=2_000_000).astype(np.uint16)


def start(config: RunConfig):
    """Fresh state, sampler, compiled step and sketch root of ``config``, and the
    seconds to its first trained step."""
    t0 = time.perf_counter()
    optimizer = optimizer_for(config)
    state = init_state(initial_params(config), optimizer)
    sampler = BatchSampler(TOKENS, config.effective_batch_size, config.effective_seq_len, config.seed)
    step_fn = make_train_step(model_config(config), optimizer)
    root = run_keys(config.seed)[1]
    state, loss = step_fn(state, jnp.asarray(sampler.next()), sketch_key(root, 1))
    jax.block_until_ready(loss)
    return state, sampler, step_fn, root, time.perf_counter() - t0


def resume(config: RunConfig, ckpt: RunCheckpoints):
    """Seconds from the restore call to the first trained step after it."""
    t0 = time.perf_counter()
    optimizer = optimizer_for(config)
    target = init_state(initial_params(config), optimizer)
    state, extra = ckpt.restore(target)
    sampler = BatchSampler(TOKENS, config.effective_batch_size, config.effective_seq_len, config.seed)
    sampler.set_state(extra["sampler"])
    step_fn = make_train_step(model_config(config), optimizer)
    step = int(state.step) + 1
    state, loss = step_fn(state, jnp.asarray(sampler.next()), sketch_key(run_keys(config.seed)[1], step))
    jax.block_until_ready(loss)
    return time.perf_counter() - t0


def recommended_interval(steps_in_target: int, eval_interval: int) -> int:
    """The steps in the target time rounded down to a multiple of
    ``eval_interval``, or, when that is 0, to the largest divisor of it: either
    way every checkpoint falls on an eval boundary or divides the eval window."""
    if steps_in_target >= eval_interval:
        return steps_in_target // eval_interval * eval_interval
    return max(d for d in range(1, eval_interval + 1) if eval_interval % d == 0 and d <= max(steps_in_target, 1))


def dir_mib(path: Path) -> float:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 2**20


def bench(preset: str, block: int, block_s: float, pairs: int, target_s: float, workdir: Path) -> dict:
    config = RunConfig(preset=preset, estimator="basis", rank=32, optimizer="sgd", lr=0.01)
    state, sampler, step_fn, root, cold_first = start(config)
    step = 1
    losses: list[float] = []

    def run_steps(n: int):
        nonlocal state, step
        for _ in range(n):
            step += 1
            state, loss = step_fn(state, jnp.asarray(sampler.next()), sketch_key(root, step))
            losses.append(float(loss))  # the loop reads every loss, as train() does

    def extra():
        window = losses[-(step % config.effective_eval_interval) :] if step % config.effective_eval_interval else []
        return {"sampler": sampler.state(), "train_losses": window, "config": config.to_dict(), "wall_time": 0.0}

    t0 = time.perf_counter()
    run_steps(block)  # warm up, and size the blocks to at least block_s seconds
    block = max(block, round(block_s * block / (time.perf_counter() - t0)))
    ckpt = RunCheckpoints(workdir / preset, keep=2)
    plain, with_save, saves = [], [], []
    for _ in range(pairs):
        t0 = time.perf_counter()
        run_steps(block)
        plain.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        run_steps(block)
        s0 = time.perf_counter()
        ckpt.save(step, state, extra())
        saves.append(time.perf_counter() - s0)
        with_save.append(time.perf_counter() - t0)
    mib = dir_mib(workdir / preset / str(ckpt.latest_step()))
    hashing = []
    for _ in range(max(5, pairs)):
        h0 = time.perf_counter()
        array_checksums(state)
        hashing.append(time.perf_counter() - h0)

    step_s = statistics.median(plain) / block
    per_save = max(statistics.median(with_save) - statistics.median(plain), 0.0)
    interval = recommended_interval(int(target_s / step_s), config.effective_eval_interval)
    cost = max(per_save, statistics.median(saves))  # the in-loop difference is noisy; never below a save

    colds, resumes = [cold_first], []
    for _ in range(2):
        resumes.append(resume(config, ckpt))
        colds.append(start(config)[-1])
    ckpt.close()
    cold, res = statistics.median(colds[1:]), statistics.median(resumes)
    return {
        "preset": preset,
        "block": block,
        "step ms": 1e3 * step_s,
        "save ms": 1e3 * statistics.median(saves),
        "MiB": mib,
        "sha256 ms": 1e3 * statistics.median(hashing),
        "sha256/save": statistics.median(hashing) / statistics.median(saves),
        "in-loop ms": 1e3 * per_save,
        "interval": interval,
        "lost s": interval * step_s,
        "overhead %": 100 * cost / (interval * step_s),
        "cold s": cold,
        "resume s": res,
        "resume/cold": res / cold,
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", nargs="+", default=["paper", "small"])
    ap.add_argument("--block", type=int, default=10, help="least steps per timed block")
    ap.add_argument("--block-seconds", type=float, default=5.0, help="least seconds per timed block")
    ap.add_argument("--pairs", type=int, default=3, help="blocks with and without a save, alternated")
    ap.add_argument("--target", type=float, default=90.0, help="seconds of work between checkpoints")
    args = ap.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="basis-ckpt-bench-"))
    try:
        rows = [bench(p, args.block, args.block_seconds, args.pairs, args.target, workdir) for p in args.presets]
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(
        f"jax {jax.__version__} on {jax.devices()[0].platform}; {args.pairs} pairs of blocks (column block: steps each); "
        f"interval = steps in {args.target:g} s on eval boundaries"
    )
    print(tabulate(rows, headers="keys", floatfmt=".3g"))
    if len(rows) > 1:
        common = min(r["interval"] for r in rows)
        for r in rows:
            cost = max(r["in-loop ms"], r["save ms"])
            print(f"one default of {common} steps at {r['preset']}: {common * r['step ms'] / 1e3:.3g} s of work "
                  f"between checkpoints, overhead {100 * cost / (common * r['step ms']):.3g} %")


if __name__ == "__main__":
    main()
