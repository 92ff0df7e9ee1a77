"""``python -m tests.support.disk_full checkpoint|database FULL_AT ARGS…``: the CLI
(``engine.cli.main`` with ARGS) in a process whose disk fills once its run saves (checkpoint)
or writes (database) step FULL_AT, the fault raised where the real one arises, so that the
process's console (its stderr, logging as the CLI configures it: not at all) reads as a
user's would:

- checkpoint: tensorstore's write of every array of the checkpoint fails as on a full volume
  (``RESOURCE_EXHAUSTED … No space left on device``), inside orbax's own writer threads,
  which log their traceback through absl as they do for the real one;
- database: from the first metrics of step FULL_AT on, every INSERT, UPDATE and DELETE is
  refused by SQLite's driver with "database or disk is full" (reads still work), until the
  process ends.
"""

from __future__ import annotations

import sqlite3
import sys

FULL = {"step": None, "full": False}


def fill_checkpoints(full_at: int) -> None:
    import orbax.checkpoint as ocp
    from orbax.checkpoint._src.serialization import serialization

    save, write = ocp.CheckpointManager.save, serialization.async_serialize_from_host

    def saving(self, step, *args, **kwargs):
        FULL["step"] = step
        return save(self, step, *args, **kwargs)

    async def writing(*args, **kwargs):
        if FULL["step"] is not None and FULL["step"] >= full_at:
            raise ValueError('RESOURCE_EXHAUSTED: Error writing "params.head/0" in OCDBT database: Failed to write '
                             "4096 bytes to file 14: No space left on device [os_error_code='28']")
        return await write(*args, **kwargs)

    ocp.CheckpointManager.save = saving
    serialization.async_serialize_from_host = writing


def fill_database(full_at: int) -> None:
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    from storage.metrics import MetricsRepository

    add = MetricsRepository.add_metrics

    def add_metrics(self, run_id, rows, **kwargs):
        if any(step >= full_at for step, *_ in rows):
            FULL["full"] = True
        return add(self, run_id, rows, **kwargs)

    @event.listens_for(Engine, "before_cursor_execute")
    def refuse(conn, cursor, statement, parameters, context, executemany):
        if FULL["full"] and statement.lstrip().split(None, 1)[0].upper() in ("INSERT", "UPDATE", "DELETE"):
            raise sqlite3.OperationalError("database or disk is full")

    MetricsRepository.add_metrics = add_metrics


if __name__ == "__main__":
    kind, full_at, argv = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    (fill_checkpoints if kind == "checkpoint" else fill_database)(full_at)
    from engine.cli.main import main

    sys.exit(main(argv))
