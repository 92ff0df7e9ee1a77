"""The training loop: config validation, seeds, records, divergence."""

import dataclasses

import jax
import numpy as np
import pytest

import engine.training.loop as train_mod
from engine import data
from engine.config import ConfigError, RunConfig
from engine.training.loop import TrainingDiverged, train
from engine.training.schedule import Schedule
from engine.training.steps import floor_optimizer, make_optimizer
from engine.training.system import is_system

TINY = RunConfig(preset="tiny", steps=6, eval_interval=3, probe_interval=2, val_batches=2, rank=4)


@pytest.mark.parametrize(
    "changes,field,allowed",
    [
        (dict(rank=0), "rank", ">= 1"),
        (dict(lam=1.0), "lam", "[0, 1)"),
        (dict(lam=-0.5), "lam", "[0, 1)"),
        (dict(lr=0.0), "lr", "(0, inf)"),
        (dict(lr=float("nan")), "lr", "(0, inf)"),
        (dict(momentum=1.5), "momentum", "[0, 1)"),
        (dict(steps=0), "steps", ">= 1"),
        (dict(estimator="sketchy"), "estimator", "exact, basis"),
        (dict(preset="huge"), "preset", "paper"),
        (dict(optimizer="sgdx"), "optimizer", "sgd, adamw"),
        (dict(dataset="web"), "dataset", "classics"),
        (dict(sketched_layers="head"), "sketched_layers", "mlp+head"),
        (dict(probe_interval=-1), "probe_interval", ">= 0"),
        (dict(batch_size=0), "batch_size", ">= 1"),
        (dict(dtype="float64"), "dtype", "float32"),
        (dict(seed=-1), "seed", ">= 0"),
        (dict(head_chunk=-8), "head_chunk", ">= 0"),
    ],
)
def test_bad_config_names_the_field_and_the_range(changes, field, allowed):
    with pytest.raises(ConfigError) as e:
        dataclasses.replace(TINY, **changes)
    assert field in str(e.value) and allowed in str(e.value)


def test_config_round_trips_through_a_dict():
    c = dataclasses.replace(TINY, dataset_options={"max_documents": 5}, lam=0.01)
    assert RunConfig.from_dict(c.to_dict()) == c
    with pytest.raises(ConfigError, match="unknown run config field"):
        RunConfig.from_dict({**c.to_dict(), "rnak": 3})


def _recording(monkeypatch):
    """Record the initial parameters and every batch the loop draws."""
    seen = {"params": [], "batches": []}
    real_init, real_next = train_mod.init_params, data.BatchSampler.next

    def init(cfg, key):
        p = real_init(cfg, key)
        seen["params"].append(jax.tree_util.tree_map(np.asarray, p))
        return p

    def nxt(self):
        b = real_next(self)
        seen["batches"].append(b.copy())
        return b

    monkeypatch.setattr(train_mod, "init_params", init)
    monkeypatch.setattr(data.BatchSampler, "next", nxt)
    return seen


def test_same_seed_same_parameters_and_batches_for_every_estimator(monkeypatch):
    seen = _recording(monkeypatch)
    runs = {}
    for estimator in ("exact", "basis", "gaussian"):
        seen["params"].clear(), seen["batches"].clear()
        list(train(dataclasses.replace(TINY, estimator=estimator)))
        runs[estimator] = (seen["params"][0], list(seen["batches"]))
    ref_params, ref_batches = runs["exact"]
    assert len(ref_batches) == TINY.steps
    for params, batches in list(runs.values())[1:]:
        jax.tree_util.tree_map(np.testing.assert_array_equal, ref_params, params)
        for a, b in zip(ref_batches, batches, strict=True):
            np.testing.assert_array_equal(a, b)
    seen["params"].clear(), seen["batches"].clear()
    list(train(dataclasses.replace(TINY, seed=1)))
    assert not np.array_equal(seen["batches"][0], ref_batches[0])
    assert not np.array_equal(seen["params"][0]["head"]["kernel"], ref_params["head"]["kernel"])


def test_records_carry_losses_probes_and_memory():
    records = list(train(TINY))
    assert [r.step for r in records] == [0, 2, 3, 4, 6]
    first = records[0].values
    assert first["val_loss"] == pytest.approx(np.log(50257), rel=0.05)
    assert first["mem_saved_bytes"] < first["mem_saved_bytes_exact"]
    assert first["mem_saved_ratio"] == pytest.approx(first["mem_saved_bytes"] / first["mem_saved_bytes_exact"])
    assert first["mem_temp_bytes"] > 0
    from engine.model.memory import CATEGORIES
    for prefix, total in (("mem_bytes/", "mem_saved_bytes"), ("mem_bytes_exact/", "mem_saved_bytes_exact")):
        assert sum(first[f"{prefix}{c}"] for c in CATEGORIES) == first[total]
    assert first[f"mem_bytes/{CATEGORIES[0]}"] < first[f"mem_bytes_exact/{CATEGORIES[0]}"]
    by_step = {r.step: r.values for r in records}
    assert {"train_loss", "val_loss", "tokens_per_s"} <= set(by_step[3]) and "cos_mean" not in by_step[3]
    probe = by_step[2]
    layers = ["block_0/mlp/fc", "block_0/mlp/proj", "head"]
    assert {f"cos/{n}" for n in layers} <= set(probe)
    assert probe["cos_mean"] == pytest.approx(np.mean([probe[f"cos/{n}"] for n in layers]))
    assert 0 < probe["cos_mean"] < 1 and probe["rel_err_mean"] > 0
    assert by_step[6]["train_loss"] < first["val_loss"]
    times = [r.wall_time for r in records]
    assert times == sorted(times)
    for r in records:  # every record carries the system metrics of its moment (no GPU here: no device figures)
        assert {"sys/cpu_percent", "sys/rss_mib", "sys/load1"} <= set(r.values) and r.values["sys/rss_mib"] > 0


def test_full_rank_probe_is_one():
    rows = 2 * 32  # tiny preset: batch 2 × T 32
    records = list(train(dataclasses.replace(TINY, rank=rows, steps=2)))
    assert records[1].values["cos_mean"] == pytest.approx(1.0, abs=1e-5)


@pytest.mark.parametrize("layers", ["mlp+head", "all"])
def test_floor_optimizer_zeroes_exactly_the_sketched_kernels_updates(layers):
    """The benchmarks' floor: the sketched kernels' updates are 0 (so their dW is never
    read), every other parameter (their biases included) gets SGD's own update."""
    cfg = TINY.replace(sketched_layers=layers).model_config("cpu")
    sketched = {"/".join(p) for p in cfg.sketched_kernel_paths()}
    params = {"head": {"kernel": np.ones((2, 3))}, "wpe": np.ones(4), "ln_f": {"scale": np.ones(2)}}
    for block in ("attn/qkv", "attn/out", "mlp/fc", "mlp/proj"):
        group, name = block.split("/")
        params.setdefault("block_0", {}).setdefault(group, {})[name] = {"kernel": np.ones((2, 2)), "bias": np.ones(2)}
    grads = jax.tree.map(lambda a: 2 * a, params)
    sgd = make_optimizer("sgd", 0.5, momentum=0.0)
    floor = floor_optimizer(cfg, sgd)
    updates, _ = floor.update(grads, floor.init(params), params)
    plain, _ = sgd.update(grads, sgd.init(params), params)
    zeroed = set()
    for (path, got), (_, want) in zip(jax.tree_util.tree_leaves_with_path(updates), jax.tree_util.tree_leaves_with_path(plain)):
        name = "/".join(k.key for k in path)
        if name.endswith("/kernel") and name[: -len("/kernel")] in sketched:
            zeroed.add(name[: -len("/kernel")])
            np.testing.assert_array_equal(got, 0.0)
        else:
            np.testing.assert_array_equal(got, want)
            assert np.all(want != 0.0)
    assert zeroed == sketched and len(sketched) == {"mlp+head": 3, "all": 5}[layers]


def test_memory_figures_drop_by_inputs_minus_sketches():
    """mlp+head on the tiny preset (d 32, 1 block, B·T = 64 rows, R = 4): the fc,
    proj and head inputs (64×32, 64×128, 64×32 floats) become 4-row sketches; the
    sketch keys and dtype markers add a few bytes. (Unfused head: with the fused one the
    head keeps dW or its sketch instead of its input.)"""
    rec = next(iter(train(dataclasses.replace(TINY, head_chunk=0))))
    removed = 4 * ((64 - 4) * 32 + (64 - 4) * 128 + (64 - 4) * 32)
    diff = rec.values["mem_saved_bytes_exact"] - rec.values["mem_saved_bytes"]
    assert removed - 64 <= diff <= removed


def test_fused_head_run_drops_the_logits_and_trains_identically():
    """head_chunk fuses the LM head with the loss: the same losses (exact), and the
    B·T×V logits (64 × 50257 floats on the tiny preset) are no longer kept."""
    exact = dataclasses.replace(TINY, estimator="exact", head_chunk=0)
    plain, fused = list(train(exact)), list(train(dataclasses.replace(exact, head_chunk=24)))
    for a, b in zip(plain, fused, strict=True):
        for name in ("train_loss", "val_loss"):
            if name in a.values:
                assert b.values[name] == pytest.approx(a.values[name], rel=1e-5)
    logits = 64 * 50257 * 4
    assert plain[0].values["mem_bytes/loss_logits"] >= logits > fused[0].values["mem_bytes/loss_logits"]


def test_stop_flag_is_checked_before_every_step():
    calls = []
    records = list(train(TINY, should_stop=lambda: len(calls) >= 4, on_step=lambda s, l: calls.append(s)))
    assert calls == [1, 2, 3, 4]
    assert records[-1].step == 4


def test_nan_loss_ends_the_run_with_a_reason():
    diverging = dataclasses.replace(TINY, lr=1e12, estimator="exact", steps=50, eval_interval=1)
    seen = []
    with pytest.raises(TrainingDiverged, match=r"became (nan|inf) at step \d+; lower lr"):
        for r in train(diverging):
            seen.append(r.step)
    assert seen[0] == 0 and len(seen) >= 2  # what was measured before is yielded first


BLOCKED = dataclasses.replace(TINY, steps=13, eval_interval=6, probe_interval=4)


@pytest.fixture(scope="module")
def step_by_step():
    return list(train(BLOCKED, max_block=1))


def _assert_same_records(a, b):
    assert [r.step for r in a] == [r.step for r in b]
    for x, y in zip(a, b):
        assert x.values.keys() == y.values.keys() and x.batch_losses.keys() == y.batch_losses.keys()
        for split in x.batch_losses:
            np.testing.assert_allclose(y.batch_losses[split], x.batch_losses[split], rtol=1e-5, atol=1e-6)
        for name in x.values:
            if name in ("tokens_per_s",) or name.startswith("mem_") or is_system(name):
                continue
            # the block is lax.scan over the step's own computation: XLA may fuse it
            # differently, so float32 round-off (a few ulp per step) is all that may differ
            assert y.values[name] == pytest.approx(x.values[name], rel=1e-5, abs=1e-6), name


def test_compiled_blocks_compute_what_the_steps_compute(step_by_step):
    """Blocks of up to 4 steps (probes at 4, 8, 12 alone, evals after 6, 12, 13) give
    the records of the step-by-step loop: same losses, probes, evals."""
    calls = []
    blocked = list(train(BLOCKED, max_block=4, on_step=lambda s, l: calls.append(s)))
    assert calls == list(range(1, 14))
    _assert_same_records(step_by_step, blocked)


def test_block_ends_stop_at_probes_evals_and_the_last_step():
    ends, first = [], 1
    while first <= BLOCKED.steps:
        last = Schedule.of(BLOCKED, 4).block_end(first, 0)
        ends.append((first, last))
        first = last + 1
    # probes (steps 4, 8, 12) are blocks of their own; evals follow 6, 12, 13; sizes are powers of two
    assert ends == [(1, 2), (3, 3), (4, 4), (5, 6), (7, 7), (8, 8), (9, 10), (11, 11), (12, 12), (13, 13)]
    assert all((b - a + 1) in (1, 2, 4) for a, b in ends)


def test_a_checkpoint_interval_without_checkpoints_does_not_end_blocks():
    """A run given ``checkpoint_interval`` but no checkpointer never saves, so its blocks
    are not cut at last_saved + interval (which would end a block before it starts)."""
    every = BLOCKED.replace(checkpoint_interval=1, probe_interval=0)
    assert Schedule.of(every, 4).block_end(2, None) == 5
    assert Schedule.of(every, 4).block_end(2, 1) == 2  # with checkpoints: one step past the last save


def test_a_resumed_blocked_run_equals_its_uninterrupted_twin(tmp_path, step_by_step):
    from engine.training.checkpoints import RunCheckpoints

    calls = []
    with RunCheckpoints(tmp_path / "run", keep=2) as ckpt:
        first = list(train(BLOCKED, max_block=4, checkpoints=ckpt, should_stop=lambda: len(calls) >= 7,
                           on_step=lambda s, l: calls.append(s)))
    assert calls[-1] == 7 and first[-1].step == 6
    with RunCheckpoints(tmp_path / "run", keep=2) as ckpt:
        rest = list(train(BLOCKED, max_block=4, checkpoints=ckpt, resume=True))
    _assert_same_records([r for r in step_by_step if r.step > 7], rest)


class _Killed(Exception):
    """Stands for a kill -9 right after a periodic checkpoint: nothing else is saved."""


def test_a_run_killed_after_a_periodic_checkpoint_resumes_every_metric_of_its_twin(tmp_path):
    """Checkpoints every 2 steps, evals every 6: the checkpoint at step 4 holds the losses
    of steps 1-4 though none was read back yet, so ``train_loss`` at 6 (the mean of steps
    1-6) and every other metric after the resume equal the uninterrupted twin's."""
    from engine.training.checkpoints import RunCheckpoints

    config = dataclasses.replace(TINY, steps=8, eval_interval=6, probe_interval=0, checkpoint_interval=2)
    twin = list(train(config))

    class KilledAfter4:
        def __init__(self, inner):
            self.inner = inner

        def latest_step(self):
            return self.inner.latest_step()

        def restore_latest_valid(self, target):
            return self.inner.restore_latest_valid(target)

        def save(self, step, state, extra, *, final=False):
            self.inner.save(step, state, extra, final=final)
            if step == 4:
                raise _Killed

    with RunCheckpoints(tmp_path / "run", keep=2) as ckpt, pytest.raises(_Killed):
        for _ in train(config, checkpoints=KilledAfter4(ckpt)):
            pass
    with RunCheckpoints(tmp_path / "run", keep=2) as ckpt:
        assert ckpt.steps() == [2, 4]
        rest = list(train(config, checkpoints=ckpt, resume=True))
    assert [r.step for r in rest] == [6, 8] and "train_loss" in rest[0].values
    _assert_same_records([r for r in twin if r.step > 4], rest)


def test_one_device_is_a_layout_that_does_nothing():
    """On one device the loop's layout hands every array, key, flag and block size back as
    it came (``Sharded`` does the work on several: ``test_scale``)."""
    from engine.training.devices import SingleDevice, device_layout

    layout = device_layout(TINY)
    assert isinstance(layout, SingleDevice)
    batch, key, state = np.arange(12, dtype=np.int32).reshape(3, 4), jax.random.key(3), {"w": np.ones(2)}
    assert layout.put_key(key) is key and layout.put_state(state) is state and layout.local_rows(batch) is batch
    np.testing.assert_array_equal(np.asarray(layout.put_batch(batch)), batch)
    np.testing.assert_array_equal(np.asarray(layout.put_val(batch)), batch)
    assert layout.agree(True) is True and layout.agree(False) is False and layout.block_limit(64) == 64
    rows, probe_key = layout.probe_inputs(batch, key)
    assert probe_key is key
    np.testing.assert_array_equal(np.asarray(rows), batch)
