"""Runs and waits the tests share: ``fake_run`` writes a run as a worker would (no
training), ``new_run`` a bare queued row, ``dead_pid`` a pid no process holds,
``wait_for`` polls a condition, ``InSweep`` makes the runs it writes belong to a sweep,
``trajectory`` is what a resumed run must share with its uninterrupted twin."""

from __future__ import annotations

import math
import subprocess
import sys
import time

import numpy as np

from engine.config import RunConfig
from engine.training.phases import PREFIX as PHASES
from engine.training.system import is_system
from storage import RunStore

TINY = RunConfig(preset="tiny", steps=40, eval_interval=10, probe_interval=10)
LAYERS = ("block_0/mlp/fc", "block_0/mlp/proj", "head")
SWEEP_A, SWEEP_B = "20261122-101500-3fa9c1", "20261122-143012-b71e02"


class InSweep:
    """A store whose new runs belong to one sweep with tags (what a launch records)."""

    def __init__(self, store, sweep_id, tags=()):
        self.store, self.sweep_id, self.tags = store, sweep_id, list(tags)

    @property
    def runs(self):
        return self  # store.runs.create_run lands on create_run below

    def __getattr__(self, name):  # the rest of the runs repository, and the other repositories
        return getattr(self.store.runs if hasattr(self.store.runs, name) else self.store, name)

    def create_run(self, **kwargs):
        return self.store.runs.create_run(**kwargs, sweep_id=self.sweep_id, tags=self.tags)


def fake_run(store: RunStore, config: RunConfig, *, status: str = "finished", final: float = 6.0,
             steps_done: int | None = None, error: str | None = None, breakdown: bool = False,
             saved: float = 12e6, saved_exact: float = 13e6, system: bool = False) -> int:
    """A run as a worker would have written it (metrics at step 0, every eval and probe
    interval), without training: val loss decays from 10.8 towards ``final``. With
    ``system``, the system metrics at every eval: ``sys/cpu_percent`` 100 + step + 10·seed,
    ``sys/rss_mib`` 500 + step, ``sys/load1`` 1.5."""
    run_id = store.runs.create_run(
        name=config.label(), config=config.to_dict(), estimator="exact" if config.is_exact else config.estimator,
        rank=None if config.is_exact else config.rank, lam=config.lam, seed=config.seed, preset=config.preset,
        steps=config.steps, versions={"jax": "0.10.2"}, device="cpu: cpu",
        status="queued",
    )
    if status != "queued":
        store.runs.set_status(run_id, "running")
    done = config.steps if steps_done is None else steps_done
    if config.is_exact:
        saved = saved_exact
    rows = [(0, 0.5, "val_loss", 10.8), (0, 0.5, "mem_saved_bytes", saved), (0, 0.5, "mem_saved_bytes_exact", saved_exact),
            (0, 0.5, "mem_saved_ratio", saved / saved_exact), (0, 0.5, "mem_temp_bytes", 30e6)]
    if breakdown:
        for cat, share in (("sketched_inputs", 0.2), ("nonlinearity", 0.3), ("loss_logits", 0.5)):
            rows += [(0, 0.5, f"mem_bytes/{cat}", share * saved), (0, 0.5, f"mem_bytes_exact/{cat}", share * saved_exact)]
    for step in range(1, done + 1):
        wall = 0.5 + 0.01 * step
        if step % config.effective_eval_interval == 0 or step == config.steps:
            v = final + (10.8 - final) * math.exp(-step / 10) + 0.01 * config.seed
            rows += [(step, wall, "val_loss", v), (step, wall, "train_loss", v - 0.1), (step, wall, "tokens_per_s", 1000.0)]
            if system:
                rows += [(step, wall, "sys/cpu_percent", 100.0 + step + 10 * config.seed),
                         (step, wall, "sys/rss_mib", 500.0 + step), (step, wall, "sys/load1", 1.5)]
        if not config.is_exact and config.probe_interval and step % config.probe_interval == 0:
            cos = [0.5 + 0.1 * i for i in range(len(LAYERS))]
            rows += [(step, wall, f"cos/{n}", c) for n, c in zip(LAYERS, cos)]
            rows += [(step, wall, f"rel_err/{n}", 1 - c) for n, c in zip(LAYERS, cos)]
            rows += [(step, wall, "cos_mean", float(np.mean(cos))), (step, wall, "rel_err_mean", 1 - float(np.mean(cos)))]
    store.metrics.add_metrics(run_id, rows)
    store.runs.heartbeat(run_id, done)
    if status not in ("queued", "running"):
        store.runs.set_status(run_id, status, error=error)
    return run_id


def new_run(store: RunStore, name: str = "run", **kw) -> int:
    """A queued run row with a made-up config (storage does not read it); ``kw`` overrides."""
    args = dict(
        name=name,
        config={"estimator": "ep", "model": {"width": 64, "depth": 2}, "lr": 1e-3, "layers": [1, 2]},
        estimator="ep",
        rank=8,
        lam=0.25,
        seed=0,
        preset="tiny",
        steps=100,
    )
    args.update(kw)
    return store.runs.create_run(**args)


def dead_pid() -> int:
    """The pid of a process that has exited and been reaped (so no process holds it)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def wait_for(predicate, timeout: float = 600.0, what: str = "the condition", every: float = 0.2):
    """``predicate()``'s first truthy value, polled every ``every`` seconds; AssertionError
    naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what}")


def trajectory(store: RunStore, run_id: int) -> dict:
    """``{(step, metric): value}`` of every stored metric of the run but the measured speed
    (``tokens_per_s``), the system metrics (``sys/*``) and the time of each phase (``time/*``):
    they measure the machine, and
    ``{(step, "eval_losses/val"): per-batch losses}`` of every stored evaluation, NaN as
    "nan" so that equal histories compare equal; asserts that no (step, metric) is stored
    twice. A resumed run's must equal its uninterrupted twin's."""
    m = store.metrics([run_id])
    assert not m.duplicated(["step", "name"]).any(), "a (step, metric) stored twice"
    m = m[(m["name"] != "tokens_per_s") & ~m["name"].map(is_system) & ~m["name"].str.startswith(PHASES)]
    out = {(int(s), n): (v if v == v else "nan") for s, n, v in zip(m["step"], m["name"], m["value"])}
    e = store.eval_losses([run_id], split="val")
    out.update({(int(s), "eval_losses/val"): tuple(x if x == x else "nan" for x in losses.tolist())
                for s, losses in zip(e["step"], e["losses"])})
    return out
