"""System metrics of a run: what the machine was doing while it trained.

The training loop samples them with each record it yields (step 0, every probe
interval and every eval; ``engine.training.loop``), outside the timed steps, and stores
them as ordinary metrics named ``sys/<what>`` (``SYSTEM_METRICS`` holds every name, its
title and its unit: the one definition the pages and the export read):

- ``sys/cpu_percent``: CPU time of the training process (all its threads: XLA's pool,
  and every run the worker trains at the same time) over the wall time since the last
  sample, × 100, so 200 means two cores busy (``psutil.Process.cpu_percent``);
- ``sys/rss_mib``: resident set size of that process, MiB;
- ``sys/load1``: the host's load average over one minute (``os.getloadavg``): runnable
  processes, to compare with its cores (more than cores: runs wait for a CPU);
- ``sys/cores``: the host's logical CPUs (``os.cpu_count``), what that load is read against
  (claim (e), ``engine.analysis.method_frames.run_time_frame``);
- ``sys/device_mem_mib`` and ``sys/device_peak_mib``: bytes in use on the run's device and
  the most ever in use by this process (JAX's ``Device.memory_stats()`` ``bytes_in_use``
  and ``peak_bytes_in_use``), MiB, the largest over the run's devices: per device, like the
  other memory figures. A CPU backend reports none: left out;
- ``sys/gpu_util`` and ``sys/gpu_power_w``: on NVIDIA GPUs, through NVML (``pynvml`` from
  the ``nvidia-ml-py`` package, loaded only when a run has a GPU): the percentage of the
  driver's last sample period in which a kernel ran (every process on the GPU counts), the
  mean over the run's GPUs, and the boards' power draw in watts, summed. Without NVML,
  left out.

No JAX here: the loop hands over its devices (anything with ``memory_stats()``,
``platform`` and ``id``), so the pages may read the names without loading JAX.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Sequence

import psutil

MIB = 2**20
PREFIX = "sys/"


@dataclass(frozen=True)
class SystemMetric:
    """One system metric: its stored name, a chart title and its unit (the y axis)."""

    name: str
    title: str
    unit: str


SYSTEM_METRICS = {m.name: m for m in (
    SystemMetric("sys/cpu_percent", "Process CPU", "% of one core"),
    SystemMetric("sys/rss_mib", "Process resident memory", "MiB"),
    SystemMetric("sys/load1", "Host load (1 min)", "runnable processes"),
    SystemMetric("sys/cores", "Host cores", "logical CPUs"),
    SystemMetric("sys/device_mem_mib", "Device memory in use", "MiB"),
    SystemMetric("sys/device_peak_mib", "Device memory, peak so far", "MiB"),
    SystemMetric("sys/gpu_util", "GPU utilisation", "% of time a kernel ran"),
    SystemMetric("sys/gpu_power_w", "GPU power draw", "W"),
)}


def is_system(name: str) -> bool:
    """Whether metric ``name`` is a system metric (it measures the machine, not the run:
    two runs of one config differ in it, and a resumed run need not repeat it)."""
    return name.startswith(PREFIX)


def axis_title(name: str) -> str:
    """The y-axis title of metric ``name`` under a chart titled by ``chart_title``: a system
    metric's unit (``MiB``), else the name."""
    metric = SYSTEM_METRICS.get(name)
    return metric.unit if metric else name


def chart_title(name: str) -> str:
    """A chart title for metric ``name``: a system metric's title, else the name."""
    metric = SYSTEM_METRICS.get(name)
    return metric.title if metric else name


class SystemSampler:
    """Samples ``SYSTEM_METRICS`` for a run on ``devices`` (JAX devices; none: the process
    and host figures only). Made when the run starts: the first ``cpu_percent`` covers
    the time since then. Cheap (a few system calls); never raises for a figure the
    machine cannot give, it leaves the figure out."""

    def __init__(self, devices: Sequence = ()):
        self._process = psutil.Process()
        self._process.cpu_percent(None)  # the first call starts the interval the next one measures
        self._devices = [d for d in devices if _memory_stats(d)]
        self._nvml, self._gpus = _nvml_handles([d for d in devices if getattr(d, "platform", "") == "gpu"])

    def sample(self) -> dict[str, float]:
        """The figures of now, by name (a subset of ``SYSTEM_METRICS``)."""
        out = {"sys/cpu_percent": float(self._process.cpu_percent(None)),
               "sys/rss_mib": self._process.memory_info().rss / MIB}
        if hasattr(os, "getloadavg"):
            out["sys/load1"] = float(os.getloadavg()[0])
        if cores := os.cpu_count():
            out["sys/cores"] = float(cores)
        stats = [s for s in (_memory_stats(d) for d in self._devices) if s]
        if in_use := [s["bytes_in_use"] for s in stats if "bytes_in_use" in s]:
            out["sys/device_mem_mib"] = max(in_use) / MIB
        if peaks := [s["peak_bytes_in_use"] for s in stats if "peak_bytes_in_use" in s]:
            out["sys/device_peak_mib"] = max(peaks) / MIB
        out.update(self._gpu_figures())
        return out

    def _gpu_figures(self) -> dict[str, float]:
        if not self._gpus:
            return {}
        nvml, util, power = self._nvml, [], []
        for handle in self._gpus:
            try:
                util.append(float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu))
                power.append(nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0)  # mW
            except nvml.NVMLError:
                continue
        if not util:
            return {}
        return {"sys/gpu_util": sum(util) / len(util), "sys/gpu_power_w": sum(power)}


def _memory_stats(device) -> dict | None:
    """``device.memory_stats()``, or None where the backend has none (the CPU's)."""
    try:
        return device.memory_stats()
    except (AttributeError, NotImplementedError, RuntimeError):  # jaxlib raises XlaRuntimeError, a RuntimeError
        return None


def _nvml_handles(gpus: Sequence) -> tuple[Any, list]:
    """(the ``pynvml`` module, an NVML handle per GPU of ``gpus``), or (None, []) where there
    are none, ``pynvml`` is not installed or NVML does not start (no NVIDIA driver).

    A JAX GPU's CUDA ordinal (``local_hardware_id``) counts the GPUs that
    ``CUDA_VISIBLE_DEVICES`` lets CUDA see, and NVML counts every GPU: the ordinal is mapped
    through that list (an index, or a ``GPU-…``/``MIG-…`` UUID) when it is set."""
    if not gpus:
        return None, []
    try:
        import pynvml
    except ImportError:
        return None, []
    try:
        pynvml.nvmlInit()
        visible = [t.strip() for t in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if t.strip()]
        handles = []
        for device in gpus:
            ordinal = getattr(device, "local_hardware_id", None)
            ordinal = device.id if ordinal is None else ordinal
            token = visible[ordinal] if ordinal < len(visible) else str(ordinal)
            handles.append(pynvml.nvmlDeviceGetHandleByIndex(int(token)) if token.isdigit()
                           else pynvml.nvmlDeviceGetHandleByUUID(token))
    except pynvml.NVMLError:
        return None, []
    return pynvml, handles
