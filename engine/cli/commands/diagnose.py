"""``diagnose``: bias, variance and MSE of the dW estimators on a run's checkpoint; list,
cancel, delete or rerun stored diagnoses."""

from __future__ import annotations

import sys

from engine.cli import arguments
from engine.cli.arguments import CliError
from engine.cli.output import table_text


def register(subparsers) -> None:
    p = subparsers.add_parser("diagnose", parents=[arguments.db_parent()],
                              help="bias, variance and MSE of the dW estimators on a run's state",
                              description="Measure every estimator's squared bias, variance, MSE (relative to ‖dW‖²) and "
                                          "mean cosine on a run's checkpoint and the training batches that followed it; "
                                          "stored in the database (the dashboard's Diagnosis page).")
    p.add_argument("run", nargs="?", help="run id or name")
    p.add_argument("--step", type=int, help="checkpoint step (default: the newest; 0: the initial parameters)")
    p.add_argument("--estimators", metavar="LIST", help="comma list (default: every sketched estimator)")
    p.add_argument("--ranks", metavar="LIST", help="comma list, clipped to B·T (default: 1,4,16,64)")
    p.add_argument("--lams", metavar="LIST", help="comma list of λ (default: the run's λ)")
    p.add_argument("--keys", type=int, help="sketch keys K per batch (default: the K at which a variance ratio "
                   "of 0.8 reads lower with power 0.8, engine.analysis.keystats.DEFAULT_KEYS)")
    p.add_argument("--batches", type=int, default=4, help="training batches N after the step (default: 4)")
    p.add_argument("--chunk", type=int, help="keys per vectorised chunk (default: 256, fewer for large layers)")
    p.add_argument("--seed", type=int, default=0, help="seed of the sketch keys (default: 0)")
    p.add_argument("--out", help="also write the results as CSV to this file")
    arguments.add_force(p)
    other = p.add_mutually_exclusive_group()
    other.add_argument("--list", action="store_true", help="list the stored diagnoses (of RUN, or all) instead")
    other.add_argument("--cancel", type=int, metavar="ID", help="stop diagnosis ID (in any process); it keeps what it "
                                                                "measured so far and ends cancelled")
    other.add_argument("--delete", type=int, metavar="ID", help="delete diagnosis ID and its results")
    other.add_argument("--rerun", type=int, metavar="ID", help="run diagnosis ID again with its settings, as a new one")


def run(args) -> int:
    from engine.runner import diagnosis

    store = arguments.open_store(args.db, create=False)
    if args.list:
        return _list(args, store)
    if args.cancel is not None or args.delete is not None:
        diagnosis.check_stale_diagnoses(store)
        return _cancel(args, store) if args.cancel is not None else _delete(args, store)
    if not args.run and args.rerun is None:
        raise CliError("name the run to diagnose (id or name), or pass --list, --rerun, --cancel or --delete")
    return _diagnose(args, store)


def _list(args, store) -> int:
    """Print the stored diagnoses (of ``RUN``, or all)."""
    run_id = store.runs.resolve_runs([args.run])[0] if args.run else None
    frame = store.frames.diagnostics_frame(run_id)
    if frame.empty:
        print("no diagnoses yet: run `python -m engine diagnose RUN`")
        return 0
    frame["settings"] = [" ".join(f"{k}={','.join(map(str, v)) if isinstance(v, list) else v}" for k, v in s.items()
                                  if k not in ("step", "notes", "chunk"))
                         for s in frame["settings"]]
    frame["error"] = [e.splitlines()[0] if isinstance(e, str) and e else "-" for e in frame["error"]]
    print(table_text(frame[["id", "run_id", "step", "status", "created_at", "settings", "error"]]
          .rename(columns={"run_id": "run"})))
    return 0


def _cancel(args, store) -> int:
    if store.diagnostics.request_cancel_diagnostic(args.cancel):
        print(f"cancel requested for diagnosis {args.cancel}: a queued one is cancelled now, a running one stops "
              "after its current step and keeps what it measured")
    else:
        print(f"diagnosis {args.cancel} has already ended; nothing to cancel")
    return 0


def _delete(args, store) -> int:
    store.diagnostics.delete_diagnostic(args.delete)
    print(f"deleted diagnosis {args.delete} and its results")
    return 0


def _plan(args, store):
    """The diagnosis to run: ``--rerun ID``'s settings, or those the flags give for ``RUN``."""
    from engine.runner import diagnosis

    if args.rerun is not None:
        return diagnosis.replan(store, args.rerun)
    run_id = store.runs.resolve_runs([args.run])[0]
    return diagnosis.plan_diagnosis(store, run_id, step=args.step, estimators=args.estimators, ranks=args.ranks,
                                    lams=args.lams, batches=args.batches, seed=args.seed,
                                    keys=diagnosis.DEFAULT_KEYS if args.keys is None else args.keys,
                                    chunk=diagnosis.DEFAULT_CHUNK if args.chunk is None else args.chunk)


def _announce(store, plan) -> None:
    """Print what is diagnosed, its cost and estimated time, and the plan's notes."""
    from engine.core.units import format_seconds
    from engine.runner import diagnosis

    where = "the initial parameters" if plan.initial else f"the checkpoint at step {plan.step}"
    print(f"run {plan.run_id} {store.runs.get_run(plan.run_id).name}: diagnosing {where} on the {plan.batches} training "
          f"batch(es) after it, K = {plan.keys} keys", file=sys.stderr)
    eta = diagnosis.estimate_seconds(store, plan)
    print(f"cost: {plan.cost_text()}; estimated time "
          f"{format_seconds(eta) if eta is not None else 'unknown (no finished diagnosis of this model yet)'}",
          file=sys.stderr)
    for note in plan.notes:
        print(f"note: {note}", file=sys.stderr)


def _diagnose(args, store) -> int:
    """Plan, run and store a diagnosis with a progress bar; print its table (and write ``--out``)."""
    from tqdm import tqdm

    from engine.runner import diagnosis
    from storage.export import check_output, write_file

    if args.out:
        check_output(store, args.out, force=args.force)  # before the work, which the file would not hold
    plan = _plan(args, store)
    _announce(store, plan)
    diag_id = diagnosis.start(store, plan)
    bar = tqdm(total=plan.work, unit="setting", desc=f"diagnosis {diag_id}")
    try:
        frame = diagnosis.execute(store, diag_id, plan, on_progress=lambda done, total: bar.update(done - bar.n))
    finally:
        bar.close()
    print(_table(frame))
    status = store.frames.diagnostics_frame().set_index("id").loc[diag_id, ["status", "error"]]
    if status["status"] == "cancelled":
        print(f"cancelled: {status['error']}", file=sys.stderr)
    print(f"stored as diagnosis {diag_id} of run {plan.run_id} (step {plan.step})")
    if args.out:
        write_file(store, args.out, diagnosis.results_csv(store, diag_id), force=args.force)
        print(f"wrote {len(frame)} rows to {args.out}", file=sys.stderr)
    return 0


def _table(frame) -> str:
    """The results, layer ``all`` first, then by estimator, λ and rank."""
    import pandas as pd

    from engine.analysis.diagnostics import COLUMNS

    layers = ["all", *dict.fromkeys(frame["layer"][frame["layer"] != "all"])]
    shown = frame.assign(layer=pd.Categorical(frame["layer"], layers))
    shown = shown.sort_values(["layer", "estimator", "lam", "rank"], kind="stable")[
        [c for c in COLUMNS if c not in ("keys", "batches")]]
    return shown.to_string(index=False, float_format=lambda v: f"{v:.4g}")
