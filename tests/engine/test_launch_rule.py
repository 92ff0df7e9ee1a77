"""One rule for a large launch (``engine.config.needs_confirmation``, more than
``LARGE_LAUNCH`` runs): ``sweep`` and ``reproduce`` both refuse it without ``--yes``, in
one line, queueing nothing (the Launch form's side: tests/app/test_launch_confirm.py)."""

import pytest

from engine.cli.main import main
from engine.config import LARGE_LAUNCH, needs_confirmation, reproduction_sweep
from engine.config import sweep as sweep_module


def test_the_threshold_is_one_number():
    assert not needs_confirmation(LARGE_LAUNCH) and needs_confirmation(LARGE_LAUNCH + 1)


def test_reproduce_of_a_thousand_seeds_asks_for_yes_and_queues_nothing(tmp_path, capsys):
    db = tmp_path / "lab.db"
    code = main(["reproduce", "--db", str(db), "--seeds", "0-999", "--queue-only", "--no-measure"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith(f"error: {len(reproduction_sweep(seeds=range(1000)).expand()):,} runs to launch")
    assert "pass --yes" in err and err.count("\n") == 1
    assert not db.exists()  # nothing opened, nothing queued


@pytest.mark.parametrize("argv", [
    ["reproduce", "--queue-only", "--no-measure", "--steps", "10"],
    ["sweep", "--preset", "tiny", "--queue-only", "--ranks", "1,2,4", "--seeds", "0,1"],
])
def test_sweep_and_reproduce_follow_the_same_threshold(tmp_path, capsys, monkeypatch, argv):
    monkeypatch.setattr(sweep_module, "LARGE_LAUNCH", 5)  # the one number both commands read
    db = tmp_path / "lab.db"
    assert main([*argv, "--db", str(db)]) == 2
    assert "runs to launch" in capsys.readouterr().err and not db.exists()


def test_yes_lets_the_same_launch_go(tmp_path, capsys, monkeypatch):
    from engine.cli.main import build_parser
    from storage import RunStore

    assert build_parser().parse_args(["reproduce", "--yes"]).yes
    monkeypatch.setattr(sweep_module, "LARGE_LAUNCH", 5)
    db = f"sqlite:///{tmp_path / 'lab.db'}"
    assert main(["sweep", "--preset", "tiny", "--queue-only", "--ranks", "1,2,4", "--seeds", "0,1", "--yes", "--db", db]) == 0
    store = RunStore(db)
    try:
        assert len(store.runs.list_runs()) == 6
    finally:
        store.close()
