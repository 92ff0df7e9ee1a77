"""Outputs never replace anything but a regular file (``storage.outputs``, issue 42): ``export``,
``backup``, ``summary`` and ``report`` with ``--force`` onto a FIFO refuse in one line, write
nothing and leave the FIFO as it was (a device node the same way; the tests never touch /dev)."""

from __future__ import annotations

import os
import stat

import pytest

from engine.cli.main import main
from engine.reads import reports
from storage import RunStore
from storage.outputs import refuse_special, special_kind
from tests.support.runs import new_run


@pytest.fixture
def lab(tmp_path):
    url = f"sqlite:///{tmp_path / 'lab.db'}"
    store = RunStore(url)
    new_run(store, "r")
    fifo = tmp_path / "out.csv"
    os.mkfifo(fifo)
    yield url, fifo
    store.close()


def _refused(err: str, fifo) -> None:
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert "a FIFO (named pipe), not a regular file" in err and "choose a file path" in err
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)  # still the FIFO
    assert sorted(p.name for p in fifo.parent.iterdir() if p.name.startswith(".")) == []  # no temporary left


@pytest.mark.parametrize("argv", [
    ["export", "--out", "{fifo}", "--force"],
    ["export", "--out", "{fifo}"],
    ["backup", "{fifo}", "--force"],
    ["summary", "--out", "{fifo}", "--force"],
])
def test_a_command_with_force_never_replaces_a_fifo(lab, capsys, argv):
    url, fifo = lab
    assert main([a.format(fifo=fifo) for a in argv] + ["--db", url]) == 2
    _refused(capsys.readouterr().err, fifo)


def test_a_link_to_a_fifo_is_refused_too(lab, capsys, tmp_path):
    url, fifo = lab
    (tmp_path / "link.csv").symlink_to(fifo)
    assert main(["export", "--db", url, "--out", str(tmp_path / "link.csv"), "--force"]) == 2
    assert "a FIFO (named pipe)" in capsys.readouterr().err
    assert stat.S_ISFIFO(os.stat(tmp_path / "link.csv").st_mode)


def test_a_report_never_replaces_a_fifo_nor_a_figure_that_is_one(tmp_path):
    fifo = tmp_path / "report.html"
    os.mkfifo(fifo)
    with pytest.raises(reports.ReportError, match=r"it is a FIFO \(named pipe\), not a regular file"):
        reports.write(None, fifo, force=True)  # refused before the report is read
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    figure = tmp_path / "loss.svg"
    os.mkfifo(figure)
    with pytest.raises(reports.ReportError, match="not a regular file"):
        reports._replaceable(figure, os.lstat(figure).st_mode)


def test_special_kind_names_what_is_not_a_regular_file(tmp_path):
    (tmp_path / "file").write_text("x")
    os.mkfifo(tmp_path / "fifo")
    assert special_kind(tmp_path / "file") is None and special_kind(tmp_path / "missing") is None
    assert special_kind(tmp_path) == "a directory" and special_kind(tmp_path / "fifo") == "a FIFO (named pipe)"
    refuse_special(tmp_path / "file")
    with pytest.raises(ValueError, match="choose a file path"):
        refuse_special(tmp_path / "fifo", "out", error=ValueError)
