"""``workers``: the registered workers and what they train."""

from __future__ import annotations

from engine.cli import arguments


def register(subparsers) -> None:
    subparsers.add_parser("workers", parents=[arguments.db_parent()], help="the registered workers and what they train")


def run(args) -> int:
    from engine.runner.liveness import worker_states

    store = arguments.open_store(args.db, create=False)
    frame = worker_states(store.workers_frame())
    if frame.empty:
        print("no workers yet: start one with `python -m engine worker`")
        return 0
    cols = ["id", "state", "host", "pid", "device", "concurrent", "current_run_id", "started_at", "heartbeat_at"]
    print(frame[cols].rename(columns={"current_run_id": "run"}).to_string(index=False, na_rep="-"))
    return 0
