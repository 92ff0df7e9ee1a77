"""``python -m engine``: run, sweep, list, show, export and cancel BASIS runs.

Every command takes ``--db URL`` (default ``$BASIS_LAB_DB_URL`` or the SQLite
file in ``storage.db.DEFAULT_DB_PATH``), the same database the dashboard reads.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time

import pandas as pd
from tqdm import tqdm

from engine.config import (
    DATA_OPTIONS, GROUPS, SWEEP_AXES, ConfigError, FieldSpec, RunConfig, Sweep, base_type, default_of, from_flat,
    parse_estimators, parse_lams, parse_ranks, parse_seeds, schema,
)
from engine.summary import MIB, run_summary
from engine.train import check_data

EXIT_BAD_INPUT = 2


class CliError(Exception):
    """Bad command-line input: printed without a traceback, exit status 2."""


def _db_parent() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--db", metavar="URL", help="SQLAlchemy URL or SQLite path (default: $BASIS_LAB_DB_URL or the default file)")
    return p


def _typed(kind: type, name: str):
    """argparse ``type`` of a field: int/float/str, with a message naming the field."""
    def parse(text: str):
        try:
            return kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name}: {text!r} is not {'an integer' if kind is int else 'a number'}") from None
    return parse if kind in (int, float) else str


def _help(s: FieldSpec, default) -> str:
    unit = f" [{s.unit}]" if s.unit else ""
    shown = s.none if default is None and s.none else default
    return f"{s.help}{unit} (default: {shown})".replace("%", "%%")


def add_config_flags(parser: argparse.ArgumentParser, cls: type = RunConfig, *, sweep: bool) -> None:
    """One flag per field of the schema ``cls`` (``--field-name`` plus its aliases), in
    argument groups named after the field groups. With ``sweep`` the swept fields
    (estimator, rank, λ, seed) take lists instead (``--ranks exact,1,8,32``; the
    singular spelling is an alias)."""
    groups = {g: parser.add_argument_group(f"{title.lower()} options") for g, title in GROUPS.items()}
    for f, s, tp in schema(cls):
        kind, optional = base_type(tp)
        group, default = groups[s.group], default_of(f)
        flag = "--" + f.name.replace("_", "-")
        if f.name == "dataset_options":
            for opt in DATA_OPTIONS:
                group.add_argument(opt.cli_flag, dest=opt.name, type=_typed(opt.kind, opt.name),
                                   help=f"{'/'.join(opt.sources)}: {opt.help}".replace("%", "%%"))
            continue
        if sweep and s.swept:
            plural, _ = SWEEP_AXES[f.name]
            text = {"rank": "exact,1,8,32", "estimator": "basis"}.get(f.name, str(default))
            group.add_argument("--" + plural, flag, dest=plural, default=text, metavar="LIST",
                               help=f"comma list: {s.help}" + (" ('exact' adds exact backprop once per seed)" if f.name == "rank" else "")
                               + f" (default: {text})")
            continue
        kwargs = {"dest": f.name, "default": default, "help": _help(s, default)}
        if s.allowed() is not None:
            kwargs["choices"] = s.allowed()
        elif kind is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            kwargs["type"] = _typed(kind, f.name)
        group.add_argument(flag, *s.aliases, **kwargs)


def sweep_from_args(args: argparse.Namespace, cls: type = RunConfig, *, sweep: bool) -> Sweep:
    """The ``Sweep`` the flags describe (``run`` is a sweep of one)."""
    values = vars(args)
    if not sweep:
        return Sweep(from_flat(values, cls), estimators=(args.estimator,), ranks=(args.rank,), lams=(args.lam,),
                     seeds=(args.seed,))
    with_exact, ranks = parse_ranks(values["ranks"])
    flat = {k: v for k, v in values.items() if k not in ("estimator", "rank", "lam", "seed")}
    return Sweep(from_flat(flat, cls), estimators=tuple(parse_estimators(values["estimators"])), ranks=tuple(ranks),
                 lams=tuple(parse_lams(values["lams"])), seeds=tuple(parse_seeds(values["seeds"])), with_exact=with_exact)


def build_parser() -> argparse.ArgumentParser:
    db = _db_parent()
    parser = argparse.ArgumentParser(prog="python -m engine", description="BASIS Lab: sketched-backprop training runs.")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", parents=[db], help="train one run in the foreground",
                         description="Train one run in the foreground. Every run field is a flag.")
    add_config_flags(run, sweep=False)
    sweep = sub.add_parser("sweep", parents=[db], help="a grid over estimators × ranks × λ × seeds",
                           description="Train a grid of runs: estimators × ranks × λs × seeds, exact once per seed.")
    add_config_flags(sweep, sweep=True)
    sweep.add_argument("--concurrent", type=int, default=1, help="runs trained at once (default: 1)")

    sub.add_parser("list", parents=[db], help="all runs")
    show = sub.add_parser("show", parents=[db], help="one run: config, environment, final metrics")
    show.add_argument("run", help="run id or name")
    export = sub.add_parser("export", parents=[db], help="metric histories as CSV")
    export.add_argument("--out", required=True, help="CSV file to write")
    export.add_argument("--runs", nargs="*", help="run ids or names (default: all)")
    export.add_argument("--format", default="long", choices=("long", "wide"))
    cancel = sub.add_parser("cancel", parents=[db], help="stop queued or running runs (any process)")
    cancel.add_argument("runs", nargs="+", help="run ids or names")
    return parser


def _open_store(url):
    from storage import RunStore
    return RunStore(url)


def _grid(args) -> list[RunConfig]:
    grid = sweep_from_args(args, sweep=args.command == "sweep")
    for clip in grid.clipped():
        print(f"note: {clip}; the run records R={clip.effective}", file=sys.stderr)
    return grid.expand()


def _train(args, configs: list[RunConfig]) -> int:
    from engine.jobs import JobManager

    concurrent = getattr(args, "concurrent", 1)
    if concurrent < 1:
        raise CliError(f"--concurrent must be >= 1 (got {concurrent})")
    store = _open_store(args.db)
    check_data(configs)
    bars: dict[int, tqdm] = {}
    lock = threading.Lock()

    def on_step(run_id, step, loss):
        with lock:
            bar = bars[run_id]
            bar.update(step - bar.n)
            if loss is not None:
                bar.set_postfix(loss=f"{loss:.3f}", refresh=False)

    manager = JobManager(store, max_concurrent=concurrent, on_step=on_step)
    if manager.interrupted:
        print(f"marked interrupted (left running by a process that died): {manager.interrupted}")
    ids = manager.submit(configs)
    for i, (run_id, config) in enumerate(zip(ids, configs)):
        bars[run_id] = tqdm(total=config.steps, desc=f"#{run_id} {config.label()}", position=i, unit="step", leave=True)
    print(f"queued {len(ids)} run(s) in {store.url}: ids {ids}", file=sys.stderr)
    start = time.perf_counter()

    def interrupt(signum, frame):
        print("\ncancelling...", file=sys.stderr)
        for run_id in ids:
            manager.cancel(run_id)

    previous = signal.signal(signal.SIGINT, interrupt)
    try:
        manager.wait(ids)
    finally:
        signal.signal(signal.SIGINT, previous)
        manager.shutdown(cancel_running=True)
        for bar in bars.values():
            bar.close()
    print(f"\nwall time {time.perf_counter() - start:.1f} s")
    _print_summary(store, ids)
    statuses = {store.get_run(i).status for i in ids}
    return 0 if statuses <= {"finished"} else 1


def _print_summary(store, ids) -> None:
    s = run_summary(store, ids)
    table = pd.DataFrame({
        "id": s["run_id"], "run": s["name"], "status": s["status"], "step": s["step"],
        "train": s["train_loss"].round(4), "val": s["val_loss"].round(4),
        "Δval": s["delta_val_vs_exact"].round(4), "cos": s["cos_mean"].round(3),
        "saved MiB": (s["mem_saved_bytes"] / MIB).round(2), "exact MiB": (s["mem_saved_bytes_exact"] / MIB).round(2),
        "saved/exact": s["mem_saved_ratio"].round(4), "temp MiB": (s["mem_temp_bytes"] / MIB).round(2),
        "tok/s": s["tokens_per_s"].round(0), "wall s": s["wall_s"].round(1),
    })
    print(table.to_string(index=False, na_rep="-"))
    for r in (store.get_run(i) for i in ids):
        if r.status == "failed":
            print(f"run {r.id} failed: {r.error.splitlines()[0] if r.error else '?'}")


def _list(args) -> int:
    frame = _open_store(args.db).runs_frame()
    if frame.empty:
        print("no runs yet: start one with `python -m engine run` or `python -m engine sweep`")
        return 0
    cols = ["id", "name", "status", "estimator", "rank", "lam", "seed", "preset", "steps_done", "steps",
            "last_train_loss", "last_val_loss", "last_mean_cos", "created_at"]
    print(frame[[c for c in cols if c in frame.columns]].to_string(index=False, na_rep="-"))
    return 0


def _show(args) -> int:
    store = _open_store(args.db)
    run_id = store.resolve_runs([args.run])[0]
    r = store.get_run(run_id)
    print(f"run {r.id}: {r.name}  [{r.status}]  steps {r.steps_done}/{r.steps}")
    print(f"created {r.created_at}  started {r.started_at}  finished {r.finished_at}")
    print(f"device {r.device}  git {r.git_commit}")
    print("versions " + json.dumps(r.versions))
    print("config " + json.dumps(r.config, indent=2))
    if r.notes:
        print(f"notes: {r.notes}")
    if r.error:
        print(f"error: {r.error}")
    _print_summary(store, [run_id])
    return 0


def _export(args) -> int:
    from storage import export_csv
    store = _open_store(args.db)
    ids = store.resolve_runs(args.runs) if args.runs else None
    n = export_csv(store, args.out, ids, fmt=args.format)
    print(f"wrote {n} rows to {args.out} ({args.format})")
    return 0


def _cancel(args) -> int:
    store = _open_store(args.db)
    for run_id in store.resolve_runs(args.runs):
        ok = store.request_cancel(run_id)
        print(f"run {run_id}: {'cancel requested' if ok else 'already ended'}")
    return 0


def main(argv=None) -> int:
    from storage import RunNotFoundError, StorageError

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command in ("run", "sweep"):
            configs = _grid(args)  # validated before anything is written
            return _train(args, configs)
        return {"list": _list, "show": _show, "export": _export, "cancel": _cancel}[args.command](args)
    except (CliError, ConfigError, StorageError, ValueError) as e:
        hint = "; `python -m engine list` shows the ids and names" if isinstance(e, RunNotFoundError) else ""
        print(f"error: {e}{hint}", file=sys.stderr)
        return EXIT_BAD_INPUT


def main_exit() -> None:
    """The ``basis-lab`` console script: ``main()`` as the process exit status."""
    sys.exit(main())
