"""``engine report --out x.md`` writes its figure folder ``x-figures/`` by the rules of
``--out``: an existing figure file is refused without ``--force``, no symbolic link is
ever written through (the folder or a file in it), and a refused output stores nothing
(a new report is not saved, a ``--rebuild`` leaves the stored one as it was)."""

import dataclasses
import os

import pytest

from engine.analysis import report as rep
from engine.cli.main import main
from engine.reads import reports
from storage import RunStore
from tests.support.runs import TINY, InSweep, fake_run

SWEEP = "sw-out"


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    url = f"sqlite:///{tmp_path_factory.mktemp('lab') / 'lab.db'}"
    store = RunStore(url)
    swept = InSweep(store, SWEEP)
    for seed in (0, 1):
        fake_run(swept, dataclasses.replace(TINY, estimator="exact", seed=seed))
        fake_run(swept, dataclasses.replace(TINY, rank=8, seed=seed), final=6.1)
    names = list(rep.figure_files(reports.build(store, reports.selection_of(sweep=SWEEP)), ".").values())
    assert names  # the report has figures to write
    yield url, store, [os.path.basename(n) for n in names]
    store.close()


def _refused(capsys, url, argv, message):
    assert main(["report", "--db", url, *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


def test_an_existing_figure_is_refused_without_force_and_nothing_is_stored(lab, tmp_path, capsys):
    url, store, names = lab
    before = store.reports.list_reports()
    out = tmp_path / "x.md"
    (tmp_path / "x-figures").mkdir()
    (tmp_path / "x-figures" / names[0]).write_text("mine")
    _refused(capsys, url, ["--sweep", SWEEP, "--out", str(out)], f"already holds {names[0]}; pass --force")
    assert (tmp_path / "x-figures" / names[0]).read_text() == "mine" and not out.exists()
    assert store.reports.list_reports() == before


def test_a_linked_figure_folder_or_file_is_never_written_through_even_with_force(lab, tmp_path, capsys):
    url, store, names = lab
    before, force = store.reports.list_reports(), ["--force"]
    elsewhere = tmp_path / "system"
    elsewhere.mkdir()
    (tmp_path / "x-figures").symlink_to(elsewhere, target_is_directory=True)
    _refused(capsys, url, ["--sweep", SWEEP, "--out", str(tmp_path / "x.md"), *force], "x-figures is a symbolic link")
    (tmp_path / "y-figures").mkdir()
    (tmp_path / "y-figures" / names[-1]).symlink_to(elsewhere / "victim.svg")
    _refused(capsys, url, ["--sweep", SWEEP, "--out", str(tmp_path / "y.md"), *force], f"{names[-1]} is a symbolic link")
    (tmp_path / "z.md").symlink_to(elsewhere / "z.md")
    _refused(capsys, url, ["--sweep", SWEEP, "--out", str(tmp_path / "z.md"), *force], "z.md is a symbolic link")
    assert list(elsewhere.iterdir()) == [] and store.reports.list_reports() == before


def test_a_refused_rebuild_leaves_the_stored_report_as_it_was(lab, tmp_path, capsys):
    url, store, names = lab
    report_id = reports.save(store, reports.build(store, reports.selection_of(sweep=SWEEP)))
    before = store.reports.get_report(report_id)
    fake_run(InSweep(store, SWEEP), dataclasses.replace(TINY, rank=8, seed=2), final=6.2)  # a rebuild would change it
    (tmp_path / "x-figures").mkdir()
    (tmp_path / "x-figures" / names[0]).write_text("mine")
    _refused(capsys, url, ["--id", str(report_id), "--rebuild", "--out", str(tmp_path / "x.md")], "already holds")
    after = store.reports.get_report(report_id)
    assert (after.content, after.run_ids) == (before.content, before.run_ids)


def test_the_figure_folder_is_opened_without_following_a_link_that_appears_late(lab, tmp_path, monkeypatch):
    url, store, names = lab
    built = reports.build(store, reports.selection_of(sweep=SWEEP))
    elsewhere = tmp_path / "system"
    elsewhere.mkdir()
    (tmp_path / "late-figures").symlink_to(elsewhere, target_is_directory=True)  # after any check: the write itself refuses
    with pytest.raises(reports.ReportError, match="is a symbolic link"):
        reports._write_figures(built, tmp_path / "late-figures", force=True)
    assert list(elsewhere.iterdir()) == []
    # the figures move into place by name: a taken name is refused without force, replaced with it
    def draw(report, directory):  # the browser's part, without a browser: the files kaleido would write
        directory.mkdir(parents=True, exist_ok=True)
        return [directory / n for n in names if (directory / n).write_text("<svg/>")]

    monkeypatch.setattr(rep, "write_figures", draw)
    folder = tmp_path / "real-figures"
    folder.mkdir()
    (folder / names[0]).write_text("mine")
    with pytest.raises(reports.ReportError, match="already exists; pass --force"):
        reports._write_figures(built, folder, force=False)
    assert (folder / names[0]).read_text() == "mine"
    assert reports._write_figures(built, folder, force=True) == [folder / n for n in names]
    assert all((folder / n).read_text() == "<svg/>" for n in names)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["late-figures", "real-figures", "system"]  # no drawing folder left


def test_the_report_list_says_latest_for_a_report_at_the_latest_common_step(lab, capsys):
    url, store, _ = lab
    latest = reports.save(store, reports.build(store, reports.selection_of(sweep=SWEEP)))
    fixed = reports.save(store, reports.build(store, reports.selection_of(sweep=SWEEP, at_step=20)))
    assert main(["report", "--db", url, "--list"]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:]}
    assert "None" not in rows[str(latest)] and " latest " in rows[str(latest)], rows
    assert " 20 " in rows[str(fixed)], rows
