"""Issue 43, item 15: an output that exists is refused naming the option the way the caller
spells it: ``engine export`` (and every command with ``--force``) says ``--force``, the Python
API (``engine.api.Lab.export``) says ``force=True``, from one definition of the message
(``storage.outputs.OutputExistsError``)."""

import pickle

import pytest

from engine.api import Lab
from engine.cli.main import main
from storage import RunStore, StorageError
from storage.outputs import FORCE_FLAG, OutputExistsError
from tests.support.runs import TINY, fake_run


@pytest.fixture
def url(tmp_path):
    store = RunStore(f"sqlite:///{tmp_path / 'force.db'}")
    fake_run(store, TINY)
    store.close()
    return f"sqlite:///{tmp_path / 'force.db'}"


@pytest.mark.parametrize("fmt", ["long", "wide", "tensorboard"])
def test_the_cli_names_its_flag_and_the_api_its_argument(url, tmp_path, capsys, fmt):
    out = tmp_path / ("taken" if fmt == "tensorboard" else "taken.csv")
    if fmt == "tensorboard":
        out.mkdir()
        (out / "mine.txt").write_text("precious")
    else:
        out.write_text("precious")

    assert main(["export", "--db", url, "--format", fmt, str(out)]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "pass --force to" in line and "force=True" not in line, line

    with Lab(url) as lab, pytest.raises(StorageError) as info:
        lab.export(str(out), format=fmt)
    said = str(info.value)
    assert "pass force=True to" in said and "--force" not in said, said
    assert (out / "mine.txt" if fmt == "tensorboard" else out).read_text() == "precious"  # nothing written


def test_the_message_has_one_definition():
    error = OutputExistsError("out.csv")
    assert str(error) == f"out.csv already exists; pass {FORCE_FLAG} to overwrite it, or choose another path"
    assert str(error.spelled("force=True")) == "out.csv already exists; pass force=True to overwrite it, or choose another path"
    assert str(OutputExistsError("{odd}.csv")).startswith("{odd}.csv already exists")  # a path is not a template
    assert str(pickle.loads(pickle.dumps(error))) == str(error)
