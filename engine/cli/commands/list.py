"""``list``: every run (or those ``--where`` matches), one line each."""

from __future__ import annotations

from engine.cli import arguments

COLUMNS = ["id", "name", "status", "sweep_id", "estimator", "rank", "lam", "seed", "preset", "steps_done", "steps",
           "last_train_loss", "last_val_loss", "last_mean_cos", "owner", "created_at"]


def register(subparsers) -> None:
    subparsers.add_parser("list", parents=[arguments.db_parent(), arguments.where_parent()],
                          help="all runs (or those --where matches)")


def run(args) -> int:
    store = arguments.open_store(args.db, create=False)
    frame = store.runs_frame()
    if frame.empty:
        print("no runs yet: start one with `python -m engine run` or `python -m engine sweep`")
        return 0
    if args.where:
        frame = frame[frame["id"].isin(arguments.where_ids(store, args.where))]
    print(frame[[c for c in COLUMNS if c in frame.columns]].to_string(index=False, na_rep="-"))
    return 0
