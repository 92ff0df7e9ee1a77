"""BASIS Lab from Python: launch runs, wait for them, tag, note, cancel and resume them, and read
runs, metrics and the paper's Table 3 as pandas frames. A new read of ``Lab`` goes in ``reads``
(through ``engine.reads``), a new action in ``writes`` (through the functions the CLI calls).

What ``wandb.Api`` and ``MlflowClient`` give their users, over the lab's own database. Reading,
with the same ``--where`` filters as the CLI and the dashboard (``engine.analysis.where``)::

    from engine.api import Lab

    lab = Lab()                                    # the CLI's database: $BASIS_LAB_DB_URL or the default file
    runs = lab.runs("estimator == basis and val_loss < 6.5")
    curves = lab.metrics("tags contains pilot", names=["val_loss"])
    table3 = lab.summary("sweep == 20261122-101500-3fa9c1")
    trials, chosen = lab.trials(1), lab.choices(1)  # tuning campaign 1 (``python -m engine tune``)

Launching and changing runs, as ``python -m engine run/sweep/tag/cancel/resume`` do::

    lab = Lab(create=True)                         # creates the database if there is none yet
    run_id = lab.launch(preset="tiny", rank=8, steps=200)            # trains here, as `engine run`
    ids = lab.sweep(preset="tiny", ranks=["exact", 8, 32], seeds="0-2", steps=200,
                    run="queue", tags="pilot")     # for `python -m engine worker` processes
    done = lab.wait(ids, timeout=3600)             # their rows of lab.runs() once all have ended
    lab.tag(ids, add="baseline", remove="pilot")
    lab.note(run_id, "the first tiny run")
    lab.cancel(ids[-1]); lab.resume(ids[-1], run="queue")
    lab.close()                                    # or ``with Lab(create=True) as lab:`` (else at exit)

Every method goes through the functions the CLI's commands call (``engine.reads.queries`` to
read; ``engine.cli.launch``, ``engine.runner.control`` and ``engine.runner.tags`` to write), so
a frame here is what ``python -m engine list/export/summary --where`` would print, and a launch
is checked as ``run``/``sweep`` check it: a bad value (an unknown field, ``lr=-1``, ``rank="x"``)
raises a ``ValueError`` (``engine.config.ConfigError``, ``engine.cli.arguments.CliError``) whose
one line is the CLI's ``error: …`` line (an option named as an argument, ``yes=True``, where the
CLI names its flag), and nothing is written. The CLI's notes and warnings are
:class:`LaunchWarning`\\ s. ``run="here"`` trains in this process with the CLI's progress bars and
summary, until the runs end (Ctrl-C: they checkpoint and end interrupted, then
``KeyboardInterrupt``); ``run="queue"`` leaves them to workers (``python -m engine worker``).
Reading never writes: ``Lab()`` needs the database to exist.
"""

from __future__ import annotations

from typing import Optional

from engine.api.reads import Reads
from engine.api.writes import LaunchWarning, Writes
from storage import RunStore

__all__ = ["Lab", "LaunchWarning"]


class Lab(Reads, Writes):
    """A handle on the lab's database: reads (``runs``, ``metrics``, ``summary``, …) and
    writes (``launch``, ``sweep``, ``wait``, ``tag``, ``note``, ``cancel``, ``resume``).

    ``db_url``: a SQLAlchemy URL or a SQLite path; None: the CLI's default
    (``$BASIS_LAB_DB_URL``, else ``storage.db.DEFAULT_DB_PATH``). ``create``: create the
    database (at the newest schema) if there is none, as ``python -m engine run`` does;
    without it a missing database is a ``StorageError``. A bad filter raises
    ``engine.analysis.where.WhereError`` (a ``ValueError``) naming the fix."""

    def __init__(self, db_url: Optional[str] = None, *, create: bool = False):
        self.store = RunStore(db_url, create=create)

    def close(self) -> None:
        """Release the database connections."""
        self.store.close()

    def __enter__(self) -> "Lab":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
