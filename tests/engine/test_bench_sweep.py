"""``bench/sweep.py`` end to end at the tiny preset (a worker process, the database, checkpoints,
evaluations): its table's phases add up to each run's wall time and the training share is a
share; and the phases it reads (``engine.training.phases``) count compiling once and add up to
the wall time of the training that kept them."""

import re
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from engine.training import phases as phases_module
from engine.training.phases import OTHER, PHASES, WALL, Phases, metric

ROOT = Path(__file__).resolve().parents[2]
NUMBER = r"(-?[\d.]+)"


def test_nested_compile_spans_count_once():
    spans = phases_module._Spans()
    spans.add(1.0, 2.0)
    spans.add(3.0, 4.0)
    spans.add(0.5, 5.0)  # encloses both (an outer trace reported after its inner ones)
    spans.add(6.0, 7.0)
    spans.add(6.5, 8.0)  # overlaps the last
    assert spans.total == pytest.approx(4.5 + 2.0)


def test_phases_add_up_to_the_wall_time_and_take_compiling_out():
    phases = Phases()
    with phases.timed("eval"):
        jax.jit(lambda x: jnp.sin(x) * 3.0 + 0.25)(jnp.arange(7.0)).block_until_ready()  # compiled here
    time.sleep(0.05)
    phases.close("train")
    with phases.timed("write"):
        time.sleep(0.02)
    out = phases.metrics()
    assert set(out) == {metric(p) for p in PHASES} | {OTHER, WALL}
    assert out[metric("compile")] > 0 and out[metric("train")] >= 0.05 and out[metric("write")] >= 0.02
    assert out[metric("eval")] < out[metric("compile")] + 0.05  # the compile is not counted twice
    assert sum(v for k, v in out.items() if k != WALL) == pytest.approx(out[WALL], abs=1e-6)


def test_the_sweep_table_adds_up():
    cmd = [sys.executable, "bench/sweep.py", "--preset", "tiny", "--ranks", "exact,4", "--steps", "2", "--seeds", "0"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("run "))
    columns = lines[head].split()[1:11]
    assert columns == ["wall", "train", "compile", "eval", "probe", "ckpt", "write", "setup", "idle", "share"]
    rows = [line for line in lines[head + 1:] if line.startswith("#")]
    assert len(rows) == 2
    for line in rows:
        values = [float(v) for v in re.findall(NUMBER, line[24:])]  # after the run's name
        wall, phases, idle, share = values[0], values[1:8], values[8], values[9] / 100
        assert all(p >= 0 for p in phases) and phases[0] > 0 and phases[1] > 0  # train, compile
        assert sum(phases) <= wall + 0.1  # the columns are rounded to 0.1 s
        assert sum(phases) + idle == pytest.approx(wall, abs=0.5)
        assert 0 < share <= 1
    assert re.search(r"sweep: 2 runs in [\d.]+ s .*runs/hour", proc.stdout)
