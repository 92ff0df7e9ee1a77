"""``engine.runner.preflight.check_data``: a grid's data is loaded before anything is written,
each distinct dataset once, and a data error reaches the caller."""

import pytest

from engine.config import RunConfig
from engine.data import DataError
from engine.runner import preflight


def test_each_distinct_dataset_is_loaded_once(monkeypatch):
    loaded = []
    monkeypatch.setattr(preflight, "load_data", lambda c: loaded.append(c))
    base = RunConfig(preset="tiny")
    seeds_and_methods = [base, base.replace(seed=1), base.replace(estimator="exact"), base.replace(lam=0.1)]
    other_split = base.replace(val_tokens=base.val_tokens * 2)
    preflight.check_data([*seeds_and_methods, other_split, other_split.replace(seed=2)])
    assert loaded == [base, other_split]


def test_a_data_error_stops_the_check(monkeypatch):
    def refuse(config):
        raise DataError(f"no such corpus for {config.dataset}; fix the path")

    monkeypatch.setattr(preflight, "load_data", refuse)
    with pytest.raises(DataError, match="fix the path"):
        preflight.check_data([RunConfig(preset="tiny")])
