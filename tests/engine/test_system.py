"""System metrics (``engine.training.system``): names, units, what each figure measures,
and that a machine without a GPU, NVML or device memory statistics leaves figures out."""

import os
import sys
import time
import types

import jax
import pytest

from engine.config import RunConfig
from engine.training import loop
from engine.training.schedule import Schedule
from engine.training.system import MIB, PREFIX, SYSTEM_METRICS, SystemSampler, axis_title, chart_title, is_system

HOST = {"sys/cpu_percent", "sys/rss_mib", "sys/load1", "sys/cores"}


def test_every_name_is_a_system_metric_with_a_title_and_a_unit():
    assert all(name.startswith(PREFIX) and is_system(name) for name in SYSTEM_METRICS)
    assert all(m.title and m.unit and m.name == name for name, m in SYSTEM_METRICS.items())
    assert axis_title("sys/rss_mib") == "MiB" and chart_title("sys/rss_mib") == "Process resident memory"
    assert axis_title("val_loss") == "val_loss" and not is_system("val_loss")


def test_a_cpu_run_samples_the_process_and_the_host_and_no_device_figures():
    sampler = SystemSampler(jax.local_devices())  # the CPU backend has no memory_stats
    values = sampler.sample()
    assert set(values) == HOST
    assert values["sys/load1"] >= 0 and values["sys/cpu_percent"] >= 0 and values["sys/cores"] == os.cpu_count()
    import psutil

    rss = psutil.Process().memory_info().rss / MIB
    assert 10 < values["sys/rss_mib"] and values["sys/rss_mib"] == pytest.approx(rss, rel=0.1)


def test_cpu_percent_is_process_cpu_time_over_wall_time():
    sampler = SystemSampler()
    cpu0, wall0 = sum(os.times()[:2]), time.monotonic()
    while time.process_time() - cpu0 < 0.3:  # busy: CPU time accrues on this thread
        pass
    value = sampler.sample()["sys/cpu_percent"]
    expected = 100 * (sum(os.times()[:2]) - cpu0) / (time.monotonic() - wall0)
    assert value > 0 and value == pytest.approx(expected, rel=0.25, abs=3)


class _Device:
    def __init__(self, stats, platform="gpu", ident=0):
        self.stats, self.platform, self.id = stats, platform, ident

    def memory_stats(self):
        if isinstance(self.stats, Exception):
            raise self.stats
        return self.stats


def test_device_memory_is_the_largest_over_the_run_devices_in_mib(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # no NVML: an ImportError
    devices = [_Device({"bytes_in_use": 3 * MIB, "peak_bytes_in_use": 10 * MIB}),
               _Device({"bytes_in_use": 5 * MIB, "peak_bytes_in_use": 7 * MIB}, ident=1),
               _Device(None, platform="cpu"), _Device(RuntimeError("no stats"), ident=2)]
    values = SystemSampler(devices).sample()
    assert values["sys/device_mem_mib"] == 5.0 and values["sys/device_peak_mib"] == 10.0
    assert "sys/gpu_util" not in values and "sys/gpu_power_w" not in values


def _fake_nvml(monkeypatch, *, fails=False):
    """An NVML of three GPUs: util 10·(i+1) %, power (i+1)·100 W (reported in mW)."""
    nvml = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    def init():
        if fails:
            raise NVMLError("driver not loaded")

    nvml.NVMLError, nvml.nvmlInit = NVMLError, init
    nvml.nvmlDeviceGetHandleByIndex = lambda i: i
    nvml.nvmlDeviceGetHandleByUUID = lambda u: {"GPU-b": 1, "GPU-c": 2}[u]
    nvml.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=10 * (h + 1), memory=0)
    nvml.nvmlDeviceGetPowerUsage = lambda h: (h + 1) * 100_000
    monkeypatch.setitem(sys.modules, "pynvml", nvml)


@pytest.mark.parametrize("visible,util,power", [(None, 15.0, 300.0), ("2,1", 25.0, 500.0), ("GPU-c,GPU-b", 25.0, 500.0)])
def test_nvml_figures_follow_the_visible_devices(monkeypatch, visible, util, power):
    """Two JAX GPUs (CUDA ordinals 0 and 1): NVML's indices are those CUDA_VISIBLE_DEVICES
    names (or its UUIDs); utilisation is their mean, power their sum in W."""
    _fake_nvml(monkeypatch)
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    values = SystemSampler([_Device({}, ident=0), _Device({}, ident=1)]).sample()
    assert values["sys/gpu_util"] == util and values["sys/gpu_power_w"] == power


def test_nvml_that_does_not_start_leaves_gpu_figures_out(monkeypatch):
    _fake_nvml(monkeypatch, fails=True)
    assert set(SystemSampler([_Device({})]).sample()) == HOST


def test_a_run_without_probes_still_ends_blocks_at_every_probe_interval():
    """An exact run (nothing to probe) samples its system metrics at multiples of the
    probe interval: its blocks end there."""
    config = RunConfig(preset="tiny", steps=13, eval_interval=6, probe_interval=4, estimator="exact",
                       sketched_layers="none")
    ends, first = [], 1
    while first <= config.steps:
        ends.append(Schedule.of(config, 8).block_end(first))
        first = ends[-1] + 1
    assert ends == [4, 6, 8, 12, 13]


def test_a_run_with_nothing_to_probe_records_its_system_metrics_at_every_probe_interval():
    config = RunConfig(preset="tiny", steps=4, eval_interval=4, probe_interval=2, val_batches=1,
                            estimator="exact", sketched_layers="none")
    records = list(loop.train(config))
    assert [r.step for r in records] == [0, 2, 4]
    assert set(records[1].values) == HOST  # step 2: no eval, no probe, the system metrics alone
