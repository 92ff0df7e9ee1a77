"""One run on several devices: each device sketches its own rows, dW summed over devices.

The checks that need several devices run in subprocesses whose CPU backend holds N devices
(``tests.support.xla.forced_devices``, ``tests.support.scale_checks``),
so this process, and the rest of the suite, keeps one device.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engine.config import ConfigError, RunConfig, Sweep
from engine.training.collectives import bytes_by_op, collectives
from tests.support import xla

ROOT = Path(__file__).resolve().parents[2]
Z = 5.5  # 12 entries × P(|N(0,1)| > 5.5) ≈ 5e-7: a false failure is that unlikely


def _forced_env(devices: int, **extra: str) -> dict:
    """The environment of a child process whose CPU backend holds ``devices`` devices."""
    return {**os.environ, **xla.forced_devices(devices), "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu", **extra}


def run_check(name: str, *args, devices: int = 4, timeout: float = 1500):
    """Run ``scale_checks.NAME(*args)`` in a process with ``devices`` forced CPU devices."""
    env = _forced_env(devices)
    proc = subprocess.run([sys.executable, "-m", "tests.support.scale_checks", name, *map(json.dumps, args)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT "):])


# --------------------------------------------------------------------------- the schema (no devices)


def test_rank_clips_to_the_rows_on_each_device():
    base = RunConfig(preset="tiny", batch_size=8, devices=4)  # B·T = 256 rows, 64 per device
    assert base.local_rows == 64
    assert base.replace(rank=1000).effective_rank == 64
    assert base.replace(rank=1000).method() == "basis R=64"
    grid = Sweep(base, ranks=(16, 64, 100, 1000))
    assert [c.rank for c in grid.expand()] == [16, 64]
    assert [str(c) for c in grid.clipped()] == [
        "R=100 clips to R=64 (the rows on each device: B·T / devices = 256 / 4)",
        "R=1000 clips to R=64 (the rows on each device: B·T / devices = 256 / 4)",
    ]
    one = base.replace(devices=1)
    assert one.effective_rank == 32 and one.replace(rank=1000).effective_rank == 256
    assert base.replace(devices=0, rank=1000).effective_rank == 256  # every device: clipped when it starts


def test_devices_must_divide_the_batch_and_be_there():
    with pytest.raises(ConfigError, match="fix by setting --batch-size to a multiple of 3"):
        RunConfig(preset="tiny", batch_size=8, devices=3)
    with pytest.raises(ConfigError, match="devices must be an integer >= 0"):
        RunConfig(devices=-1)
    with pytest.raises(ConfigError, match="dw_comm"):
        RunConfig(dw_comm="carrier-pigeon")
    from engine.training import parallel

    with pytest.raises(ConfigError, match="fix by setting --devices to at most 1"):
        parallel.device_count(RunConfig(preset="tiny", batch_size=4, devices=4))
    assert parallel.make_layout(RunConfig(preset="tiny")) is None  # one device: the plain step


def test_the_help_of_rank_and_the_cli_say_the_clip_is_per_device():
    from engine.cli.main import build_parser

    text = build_parser()._subparsers._group_actions[0].choices["run"].format_help()
    assert "clipped to the rows on each device" in " ".join(text.split())
    assert "--devices" in text and "--shard-params" in text and "--dw-comm" in text


def test_fsdp_spec_splits_the_largest_divisible_dimension():
    from jax.sharding import PartitionSpec as P

    from engine.training.parallel import DATA, fsdp_spec

    assert fsdp_spec((50257, 32), 4) == P(None, DATA)
    assert fsdp_spec((32, 128), 4) == P(None, DATA)
    assert fsdp_spec((96,), 4) == P(DATA)
    assert fsdp_spec((), 4) == P()
    assert fsdp_spec((3, 5), 4) == P()


def test_collectives_are_read_from_hlo_text():
    text = """
  %all-gather.1 = f32[16,32]{1,0} all-gather(f32[4,32]{1,0} %a), channel_id=1, replica_groups={{0,1,2,3}}, dimensions={0}
  %all-reduce = (f32[32]{0}, /*index=1*/bf16[8,4]{1,0}) all-reduce(%b, %c), channel_id=2, to_apply=%add
  %rs = f32[2,8]{1,0} reduce-scatter(f32[8,8]{1,0} %d), dimensions={0}
  %gte = f32[32]{0} get-tuple-element(%all-reduce), index=0
"""
    found = collectives(text, 4)
    assert [(c.op, c.bytes) for c in found] == [("all-gather", 16 * 32 * 4), ("all-reduce", 32 * 4 + 8 * 4 * 2),
                                               ("reduce-scatter", 8 * 8 * 4)]
    table = bytes_by_op(text, 4)
    assert table["all-reduce"]["ring_bytes"] == pytest.approx(2 * 3 / 4 * (128 + 64))
    assert table["all-gather"]["ring_bytes"] == pytest.approx(3 / 4 * 16 * 32 * 4)


# --------------------------------------------------------------------------- on 4 devices


UNBIASED = [("balanced", "all-reduce"), ("balanced", "sketch"), ("gaussian", "sketch"), ("crs", "sketch")]
ON_FOUR_DEVICES = [("grads",), ("training",), *(("unbiased", e, c) for e, c in UNBIASED)]


@pytest.fixture(scope="module")
def on_four_devices() -> dict:
    """What every 4-device check of one process returns, by check: one process runs them all
    (the resume needs processes of its own, with 4 devices and then 2)."""
    return dict(zip(ON_FOUR_DEVICES, run_check("several", *ON_FOUR_DEVICES), strict=True))


@pytest.fixture(scope="module")
def grads(on_four_devices):
    return on_four_devices[("grads",)]


def test_exact_on_four_devices_is_the_one_device_gradient(grads):
    assert grads["exact/loss_err"] < 1e-5
    assert grads["exact/grad_err"] < 1e-5


@pytest.mark.parametrize("name", ["basis_full_reduce", "basis_full_gather", "basis_full_gather_unfused"])
def test_basis_is_exact_when_rank_covers_the_rows_on_each_device(grads, name):
    """R = B/D·T: every device's sketch is a signed permutation of its own rows, so the
    summed dW (all-reduced, or formed from the all-gathered sketches) is exact."""
    assert grads[f"{name}/grad_err"] < 1e-5


def test_sketch_all_gather_is_the_all_reduce_estimator(grads):
    """Under the same keys the all-gather forms the very same Σ_d X̂_dᵀ dŶ_d."""
    assert grads["basis4_reduce/grad_err"] > 1e-2  # R = 4 < 32 rows per device: a genuine sketch
    assert grads["basis4_gather_vs_reduce"] < 1e-5
    assert grads["crs4_gather_vs_reduce"] < 1e-5


def test_no_rows_cross_devices(grads):
    """All-reduce mode holds no all-gather at all; the sketch all-gather moves only
    D·R = 16-row sketches (and the step's one combined all-reduce of the other grads)."""
    assert {op for op, _ in grads["collectives/all-reduce"]} == {"all-reduce"}
    gathered = [shapes for op, shapes in grads["collectives/sketch"] if op == "all-gather"]
    assert len(gathered) == 6  # X̂ and dŶ of fc, proj and the head
    assert all(shape[0][0] == 16 for shape in gathered)


@pytest.mark.parametrize("estimator,comm", UNBIASED)
def test_sketched_dw_on_four_devices_is_unbiased(on_four_devices, estimator, comm):
    """Monte Carlo over K keys, each device sketching its own 6 rows at R = 2: every
    entry of mean(dW) lies within Z·σ/√K of the exact Xᵀ dY."""
    r = on_four_devices[("unbiased", estimator, comm)]
    mean, std, exact = (np.asarray(r[k]) for k in ("mean", "std", "exact"))
    assert np.all(std > 0)
    assert np.all(np.abs(mean - exact) <= Z * std / np.sqrt(r["k"]))
    assert r["per_device_distinct"] == 4  # the same rows on every device, four different sketches
    for full in r["full_rank_basis"]:  # R = 6 rows per device: exact, whatever the key
        np.testing.assert_allclose(full, exact, rtol=1e-5, atol=1e-5)


def _assert_same_losses(a: dict, b: dict, rel: float = 1e-5) -> None:
    assert a.keys() == b.keys()
    for step in a:
        assert a[step].keys() == b[step].keys()
        for name, value in a[step].items():
            assert value == pytest.approx(b[step][name], rel=rel), (step, name)


@pytest.fixture(scope="module")
def training(on_four_devices):
    return on_four_devices[("training",)]


def test_exact_run_on_four_devices_equals_one_device_at_every_eval(training):
    assert set(training["one"]) == {"0", "2", "4"}
    _assert_same_losses(training["four"], training["one"])


def test_sharded_parameters_train_as_replicated_ones(training):
    _assert_same_losses(training["sharded"], training["four"])
    _assert_same_losses(training["all_sharded_adamw"], training["one_adamw"])  # devices 0: all four
    assert training["leaf_shards/False"] == [4]  # every array whole on 4 devices
    assert -4 in training["leaf_shards/True"]  # split over 4 devices


def test_sharded_parameters_hold_a_quarter_of_the_state_per_device(training):
    """The compiled step's arguments (state, batch, key) per device: the replicated state
    whole, the sharded one about a quarter (arrays D does not divide stay whole)."""
    whole, sharded, state = training["argument_bytes/False"], training["argument_bytes/True"], training["state_bytes"]
    assert whole >= state
    assert sharded < 0.26 * whole


def test_sharded_checkpoint_resumes_on_two_devices_as_the_uninterrupted_run(tmp_path):
    """4 devices with sharded state train 2 steps and stop (checkpointed); a process with
    2 devices restores that sharded checkpoint onto its own mesh and finishes; the result
    equals the run that was never interrupted (on 2 devices; exact, so the device count
    changes nothing but float rounding)."""
    first = run_check("resume", str(tmp_path), 4, 2)
    assert first["steps"] == [1, 2] and first["done"] == [1, 2]
    second = run_check("resume", str(tmp_path), 2, None, 2, devices=2)
    assert second["done"] == [3, 4]
    _assert_same_losses({**first["losses"], **second["losses"]}, second["twin"])


# --------------------------------------------------------------------------- several hosts


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


RUN_FLAGS = ["run", "--preset", "tiny", "--batch-size", "4", "--devices", "0", "--estimator", "exact", "--steps", "4",
             "--eval-interval", "2", "--probe-interval", "2", "--val-tokens", "4096", "--val-batches", "2", "--lr",
             "0.05", "--checkpoint-interval", "2"]


def _engine(args, devices: int, **env) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "engine", *args], cwd=ROOT, env=_forced_env(devices, **env),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _losses_of(db: Path) -> dict:
    from storage import RunStore

    store = RunStore(f"sqlite:///{db}", create=False)
    try:
        (run,) = store.runs.list_runs()
        assert run.status == "finished", run.error
        assert run.device == "cpu: cpu × 4"  # what trained it, for the Runs page
        frame = store.metrics([run.id], names=["val_loss", "train_loss"])
        out = {(int(r.step), r.name): float(r.value) for r in frame.itertuples()}
        batches = store.eval_losses([run.id])
        out.update({(int(s), "val batches"): losses.tolist() for s, losses in zip(batches["step"], batches["losses"])})
        return out
    finally:
        store.close()


def test_two_processes_joined_by_jax_distributed_train_as_one_with_four_devices(tmp_path):
    """Two processes on localhost with 2 CPU devices each, joined through the
    BASIS_LAB_* variables, train one run; process 0 alone writes the database (process
    1 is pointed at another file, which must never appear). Its losses equal those of
    one process with 4 devices."""
    hosts = {"BASIS_LAB_COORDINATOR": f"127.0.0.1:{_free_port()}", "BASIS_LAB_NUM_PROCESSES": "2",
             "BASIS_LAB_CHECKPOINTS": str(tmp_path / "ck")}
    follower = _engine([*RUN_FLAGS, "--db", str(tmp_path / "follower.db")], 2, BASIS_LAB_PROCESS_ID="1", **hosts)
    leader = _engine([*RUN_FLAGS, "--db", str(tmp_path / "leader.db")], 2, BASIS_LAB_PROCESS_ID="0", **hosts)
    try:
        out = leader.communicate(timeout=1200)[0]
        assert leader.returncode == 0, out[-3000:]
        follower_out = follower.communicate(timeout=120)[0]
        assert follower.returncode == 0, follower_out[-3000:]
    finally:
        for p in (leader, follower):
            if p.poll() is None:
                p.kill()
    assert not (tmp_path / "follower.db").exists()
    assert sorted(p.name for p in (tmp_path / "ck").glob("run-*/epoch-*/*") if p.name.isdigit()) == ["2", "4"]
    single = _engine([*RUN_FLAGS, "--db", str(tmp_path / "single.db")], 4,
                     BASIS_LAB_CHECKPOINTS=str(tmp_path / "ck-single"))
    out = single.communicate(timeout=1200)[0]
    assert single.returncode == 0, out[-3000:]
    multi, one = _losses_of(tmp_path / "leader.db"), _losses_of(tmp_path / "single.db")
    assert multi.keys() == one.keys() and (4, "val_loss") in multi
    for key, value in one.items():
        assert multi[key] == pytest.approx(value, rel=1e-5), key


def test_host_variables_all_or_none_with_a_fix():
    from engine.runner import hosts

    assert hosts.settings({}) is None
    with pytest.raises(hosts.HostsError, match="BASIS_LAB_PROCESS_ID not set"):
        hosts.settings({"BASIS_LAB_COORDINATOR": "a:1", "BASIS_LAB_NUM_PROCESSES": "2"})
    with pytest.raises(hosts.HostsError, match="not host:port"):
        hosts.settings({"BASIS_LAB_COORDINATOR": "a", "BASIS_LAB_NUM_PROCESSES": "2", "BASIS_LAB_PROCESS_ID": "0"})
    with pytest.raises(hosts.HostsError, match="fix the two variables"):
        hosts.settings({"BASIS_LAB_COORDINATOR": "a:1", "BASIS_LAB_NUM_PROCESSES": "2", "BASIS_LAB_PROCESS_ID": "2"})
    assert hosts.settings({"BASIS_LAB_COORDINATOR": "10.0.0.1:123", "BASIS_LAB_NUM_PROCESSES": "2",
                           "BASIS_LAB_PROCESS_ID": "1"}) == ("10.0.0.1:123", 2, 1)


def test_cli_reports_bad_host_variables_in_one_line(monkeypatch, capsys):
    from engine.cli.main import main

    monkeypatch.setenv("BASIS_LAB_COORDINATOR", "127.0.0.1:1")
    assert main(RUN_FLAGS[:1] + ["--preset", "tiny", "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "BASIS_LAB_NUM_PROCESSES, BASIS_LAB_PROCESS_ID not set" in err
