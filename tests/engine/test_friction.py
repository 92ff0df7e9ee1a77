"""The friction a new user met (issue 29): ``engine list`` fits a terminal, newest first;
Table 3 counts one run per seed; ``engine sweep`` warns before relaunching a sweep."""

from __future__ import annotations

import dataclasses

import pytest

from engine.analysis import progress
from engine.analysis import report as rep
from engine.cli import main as cli
from engine.cli.listing import WIDTH
from engine.reads import reports
from engine.reads.queries import run_table3
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
    lab.runs.rename_run(second, long_name.strip()[:190])
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


def test_table3_counts_one_run_per_seed_and_names_the_shorter_duplicates(lab, capsys):
    long = dataclasses.replace(TINY, steps=40)
    ids = [fake_run(lab, dataclasses.replace(long, estimator="exact", seed=s)) for s in (0, 1)]
    ids += [fake_run(lab, dataclasses.replace(long, rank=8, seed=s), final=6.3) for s in (0, 1)]
    short = dataclasses.replace(TINY, steps=20)  # the same setup relaunched shorter: bookkeeping differs only
    dup = [fake_run(lab, dataclasses.replace(short, rank=8, seed=0), final=6.3),
           fake_run(lab, dataclasses.replace(short, estimator="exact", seed=0))]
    table = run_table3(lab)
    assert table["step"].tolist() == [40, 40]  # the 20-step relaunch does not pull the common step down
    assert table["seeds"].tolist() == [2, 2]
    assert table["duplicates"].tolist() == [f"{dup[1]} (see {ids[0]})", f"{dup[0]} (see {ids[2]})"]
    assert not set(dup) & {int(i) for r in table["run_ids"] for i in r.split(", ")}

    assert cli.main(["summary"]) == 0
    out = capsys.readouterr().out
    assert "Left out as duplicates" in out and f"{dup[0]} (see {ids[2]})" in out


def test_the_report_names_interrupted_and_resumed_runs_and_how_to_gather_claims_a_and_b(lab):
    sweep = InSweep(lab, LONG_SWEEP)
    done = fake_run(sweep, dataclasses.replace(TINY, estimator="exact"))
    resumed = fake_run(sweep, dataclasses.replace(TINY, rank=8))
    lab.runs.append_notes(resumed, "resumed from the checkpoint at step 20")
    stopped = fake_run(sweep, dataclasses.replace(TINY, rank=32), status="interrupted", steps_done=30)
    built = reports.build(lab, reports.selection_of(sweep=LONG_SWEEP))
    notes = " ".join(built.notes)
    assert f"#{stopped} at step 30 of 40" in notes and "engine resume --all" in notes
    assert f"#{resumed} resumed from the checkpoint at step 20" in notes
    assert f"#{done}" not in notes.split("interrupted and resumed")[-1]
    how = [b for b in built.blocks() if b.kind == "list" and b.title.startswith("How to gather")]
    assert len(how) == 1
    text = " ".join(how[0].items)
    assert f"engine diagnose {resumed} --estimators balanced,countsketch,basis,scalars" in text  # furthest finished
    assert f"engine report --sweep {LONG_SWEEP}" in text
    again = rep.Report.from_json(built.to_json())
    assert again.gathering == built.gathering
    html = rep.to_html(again)
    assert "How to gather the data claims (a) and (b) need" in html and f"#{stopped} at step 30" in html


def test_progress_counts_steps_and_estimates_the_time_left_from_observed_rates(lab):
    finished = fake_run(lab, TINY)  # 40 steps; fake_run's wall time: 0.5 s + 0.01 s per step
    running = fake_run(lab, dataclasses.replace(TINY, seed=1), status="running", steps_done=20)
    queued = fake_run(lab, dataclasses.replace(TINY, seed=2), status="queued", steps_done=0)
    failed = fake_run(lab, dataclasses.replace(TINY, seed=3), status="failed", steps_done=5, error="NaN")
    records = [lab.runs.get_run(i) for i in (finished, running, queued, failed)]
    p = progress.progress(records, lab.metrics([r.id for r in records]))
    assert p.counts == {"finished": 1, "running": 1, "queued": 1, "failed": 1}
    assert (p.done, p.total) == (40 + 20, 3 * 40)  # a failed run is counted by status, not in the steps
    assert p.rate == pytest.approx(100.0)  # validations at steps 0, 10, 20: 20 steps in 0.2 s
    assert p.seconds_left == pytest.approx(60 / 100.0)
    assert p.text().startswith("1 finished · 1 training · 1 queued · 1 failed — 60 of 120 steps (50 %) — about ")
    assert "left at 100 steps/s" in p.text()
    blind = progress.progress(records, lab.metrics([finished]))  # no running run has validated yet
    assert blind.seconds_left is None and "known after the first validations" in blind.text()
    ended = progress.progress(records[:1], lab.metrics([finished]))
    assert ended.text() == "1 finished — 40 of 40 steps (100 %)"


def test_sweep_warns_but_launches_when_the_same_configs_and_seeds_exist(lab, capsys):
    grid = ["sweep", "--queue-only", "--preset", "tiny", "--ranks", "exact,8", "--seeds", "0,1", "--steps", "6"]
    assert cli.main(grid) == 0
    first = capsys.readouterr()
    assert "already in the database" not in first.err
    queued = {r.id: r for r in lab.runs.list_runs()}
    assert cli.main([*grid[:-1], "7"]) == 0  # other steps: other configs, no warning
    assert "already in the database" not in capsys.readouterr().err
    lab.runs.set_status(min(queued), "failed")  # a failed run is no reason to warn: relaunching it is the fix
    assert cli.main([*grid[:-3], "0,1,2", "--steps", "6"]) == 0
    err = capsys.readouterr().err
    warned = [line for line in err.splitlines() if "already in the database" in line]
    assert len(warned) == 1 and warned[0].startswith("warning: 3 of the 6 runs to launch")
    named = {r.id for r in queued.values() if f"#{r.id} {r.name} (queued)" in warned[0]}
    assert named == set(queued) - {min(queued)}
    assert len(lab.runs.list_runs()) == 4 + 4 + 6  # warned, not refused
