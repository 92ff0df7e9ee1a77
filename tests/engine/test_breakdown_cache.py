"""Memory figures kept on disk (``engine.training.breakdown_cache``): read instead of traced
while the model, the shapes and the traced code are the same; recomputed when any changes,
when the entry is damaged, and every time with the compilation cache off."""

from __future__ import annotations

import logging
import shutil

import jax.numpy as jnp
import pytest

from engine.config import RunConfig
from engine.model.memory import memory_breakdown
from engine.training import breakdown_cache, loop
from engine.training.build import initial_params, model_config

CONFIG = RunConfig(preset="tiny", rank=4, estimator="basis")


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.setattr(breakdown_cache.compile_cache, "enable", lambda: tmp_path)
    return tmp_path / breakdown_cache.SUBFOLDER


def _counted(value):
    calls = []

    def compute():
        calls.append(1)
        return dict(value)
    return compute, calls


def test_a_breakdown_is_computed_once_then_read_and_a_new_code_digest_is_a_new_entry(folder, monkeypatch):
    compute, calls = _counted({"attention": 10, "mlp": 32})
    assert breakdown_cache.cached("m", compute) == {"attention": 10, "mlp": 32} == breakdown_cache.cached("m", compute)
    assert len(calls) == 1 and len(list(folder.glob("*.json"))) == 1
    assert breakdown_cache.cached("other model", compute) and len(calls) == 2  # another memo: its own entry
    monkeypatch.setattr(breakdown_cache, "code_digest", lambda: "edited code")
    breakdown_cache.cached("m", compute)
    assert len(calls) == 3 and len(list(folder.glob("*.json"))) == 3


def test_a_damaged_entry_is_computed_again_and_rewritten(folder, caplog):
    compute, calls = _counted({"mlp": 7})
    breakdown_cache.cached("m", compute)
    entry = breakdown_cache.entry("m")
    entry.write_text('{"memo": "m", "bytes": {"mlp": ')  # a process killed mid-write
    with caplog.at_level(logging.WARNING):
        assert breakdown_cache.cached("m", compute) == {"mlp": 7}
    assert len(calls) == 2 and "unreadable" in caplog.text
    assert breakdown_cache.cached("m", compute) == {"mlp": 7} and len(calls) == 2  # whole again


def test_with_the_cache_off_it_computes_every_time_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(breakdown_cache.compile_cache, "enable", lambda: None)
    compute, calls = _counted({"mlp": 1})
    breakdown_cache.cached("m", compute), breakdown_cache.cached("m", compute)
    assert len(calls) == 2 and not list(tmp_path.rglob("*.json"))


def test_the_digest_covers_the_traced_source_and_nothing_else(tmp_path):
    root = tmp_path / "engine"
    shutil.copytree(breakdown_cache.Path(breakdown_cache.__file__).parents[1] / "sketch", root / "sketch")
    (root / "model").mkdir()
    (root / "core").mkdir()
    (root / "runner").mkdir()
    before = breakdown_cache.digest_of(root)
    (root / "runner" / "jobs.py").write_text("# not traced\n")
    assert breakdown_cache.digest_of(root) == before
    path = next((root / "sketch").rglob("*.py"))
    path.write_text(path.read_text() + "\n# an edit\n")
    assert breakdown_cache.digest_of(root) != before


def test_a_runs_memory_figures_read_from_disk_are_the_traced_ones(folder, monkeypatch):
    cfg = model_config(CONFIG)
    params, batch = initial_params(CONFIG), jnp.zeros((2, 33), jnp.int32)
    key = jnp.zeros((2,), jnp.uint32)
    monkeypatch.setattr(loop, "_BREAKDOWNS", {})
    traced = loop._breakdowns(cfg, params, batch, key)
    assert len(list(folder.glob("*.json"))) == 2  # this model's and exact backprop's
    monkeypatch.setattr(loop, "_BREAKDOWNS", {})
    monkeypatch.setattr(loop, "memory_breakdown", lambda *a: pytest.fail("traced again"))
    assert loop._breakdowns(cfg, params, batch, key) == traced
    assert traced == (memory_breakdown(cfg, params, batch, key), memory_breakdown(cfg.replace(estimator="exact"),
                                                                                   params, batch, None))
