"""``show``: one run's config, environment and final metrics."""

from __future__ import annotations

import json

from engine.cli import arguments


def register(subparsers) -> None:
    p = subparsers.add_parser("show", parents=[arguments.db_parent()], help="one run: config, environment, final metrics")
    p.add_argument("run", help="run id or name")


def run(args) -> int:
    from engine.cli.output import print_summary

    store = arguments.open_store(args.db, create=False)
    run_id = store.runs.resolve_runs([args.run])[0]
    r = store.runs.get_run(run_id)
    print(f"run {r.id}: {r.name}  [{r.status}]  steps {r.steps_done}/{r.steps}")
    print(f"created {r.created_at}  started {r.started_at}  finished {r.finished_at}")
    print(f"device {r.device}  git {r.git_commit}  worker {r.owner or '-'}")
    print(f"sweep {r.sweep_id or '-'}  tags {', '.join(r.tags) or '-'}  checkpoint step {r.checkpoint_step}")
    print("versions " + json.dumps(r.versions))
    print("config " + json.dumps(r.config, indent=2))
    if r.notes:
        print(f"notes: {r.notes}")
    if r.error:
        print(f"error: {r.error}")
    print_summary(store, [run_id])
    return 0
