"""The friction a new user met (issue 29): ``engine list`` fits a terminal, newest first;
Table 3 counts one run per seed; ``engine sweep`` warns before relaunching a sweep."""

from __future__ import annotations

import dataclasses

import pytest

from engine.cli import main as cli
from engine.cli.listing import WIDTH
from storage import RunStore
from tests.support.runs import TINY, InSweep, fake_run

LONG_SWEEP = "20261125-100000-aaaaaa"


@pytest.fixture
def lab(tmp_path, monkeypatch):
    store = RunStore(f"sqlite:///{tmp_path / 'f.db'}")
    monkeypatch.setenv("BASIS_LAB_DB_URL", store.url)
    yield store
    store.close()


def test_list_fits_100_columns_newest_first_and_wide_shows_every_column(lab, capsys):
    sweep = InSweep(lab, LONG_SWEEP, ["pilot"])
    first = fake_run(sweep, dataclasses.replace(TINY, estimator="exact"))
    long_name = "a very long descriptive name for the learning-rate ablation of the paper preset " * 2
    second = fake_run(sweep, dataclasses.replace(TINY, rank=8, name=long_name.strip()[:190]), status="running",
                      steps_done=10)
    lab.rename_run(second, long_name.strip()[:190])
    assert cli.main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert max(len(line) for line in lines) <= WIDTH
    assert lines[0].split() == ["id", "name", "status", "steps", "val", "sweep"]
    assert [line.split()[0] for line in lines[1:]] == [str(second), str(first)]  # newest first
    assert "…" in lines[1] and LONG_SWEEP in lines[1] and "10/40" in lines[1]  # the sweep id whole, the name cut

    assert cli.main(["list", "--wide"]) == 0
    wide = capsys.readouterr().out.splitlines()
    assert max(len(line) for line in wide) > WIDTH
    assert all(c in wide[0] for c in ("estimator", "last_train_loss", "owner", "tags"))
    assert long_name.strip()[:190] in wide[1] and wide[1].split()[0] == str(second)
