"""``python -m engine``: run, sweep, list, show, export, summary and cancel BASIS runs.

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

from engine import data
from engine.basis import ESTIMATORS
from engine.grid import expand_grid, parse_ranks
from engine.model import PRESETS, SKETCHED_LAYER_CHOICES
from engine.steps import OPTIMIZERS
from engine.summary import MIB, run_summary
from engine.train import ConfigError, RunConfig, check_data

EXIT_BAD_INPUT = 2


class CliError(Exception):
    """Bad command-line input: printed without a traceback, exit status 2."""


def _csv(kind):
    def parse(text: str):
        try:
            return [kind(t) for t in text.split(",") if t.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of {kind.__name__}") from None
    return parse


def _db_parent() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--db", metavar="URL", help="SQLAlchemy URL or SQLite path (default: $BASIS_LAB_DB_URL or the default file)")
    return p


def _config_parent() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    d = RunConfig()
    g = p.add_argument_group("run configuration")
    g.add_argument("--preset", default=d.preset, choices=tuple(PRESETS))
    g.add_argument("--layers", dest="sketched_layers", default=d.sketched_layers, choices=SKETCHED_LAYER_CHOICES, help="which dense layers are sketched")
    g.add_argument("--lam", type=float, default=d.lam, help="shrink λ in [0, 1); the paper's code used 0.01 (default %(default)s)")
    g.add_argument("--optimizer", default=d.optimizer, choices=OPTIMIZERS)
    g.add_argument("--lr", type=float, default=d.lr)
    g.add_argument("--momentum", type=float, default=d.momentum)
    g.add_argument("--weight-decay", type=float, default=d.weight_decay)
    g.add_argument("--steps", type=int, default=d.steps)
    g.add_argument("--batch-size", type=int, help="default: the preset's")
    g.add_argument("--seq-len", type=int, help="default: the preset's")
    g.add_argument("--dataset", default=d.dataset, choices=data.SOURCES)
    g.add_argument("--data-path", help="files: a .txt/.jsonl/.parquet path or glob")
    g.add_argument("--data-files", help="fineweb-edu: a local mirror (path or glob) instead of the Hub")
    g.add_argument("--text-field", help="files: the text column of .jsonl/.parquet (default text)")
    g.add_argument("--max-documents", type=int, help="fineweb-edu: number of documents to stream")
    g.add_argument("--val-tokens", type=int, default=d.val_tokens)
    g.add_argument("--eval-interval", type=int, default=d.eval_interval)
    g.add_argument("--val-batches", type=int, default=d.val_batches)
    g.add_argument("--probe-interval", type=int, default=d.probe_interval, help="steps between dW-cosine probes (0 = never)")
    g.add_argument("--dtype", default=d.dtype, choices=("float32", "bfloat16"))
    g.add_argument("--head-chunk", type=int, default=d.head_chunk,
                   help="fuse the LM head with the loss in chunks of this many rows, so the B·T×V logits are never stored (0 = off)")
    return p


def _base_config(args, **fields) -> RunConfig:
    options = {
        "path": args.data_path, "data_files": args.data_files,
        "text_field": args.text_field, "max_documents": args.max_documents,
    }
    options = {k: v for k, v in options.items() if v is not None}
    return RunConfig(
        preset=args.preset, sketched_layers=args.sketched_layers, lam=args.lam,
        optimizer=args.optimizer, lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay,
        steps=args.steps, batch_size=args.batch_size, seq_len=args.seq_len,
        dataset=args.dataset, dataset_options=options, val_tokens=args.val_tokens,
        eval_interval=args.eval_interval, val_batches=args.val_batches,
        probe_interval=args.probe_interval, dtype=args.dtype, head_chunk=args.head_chunk, **fields,
    )


def build_parser() -> argparse.ArgumentParser:
    db, cfg = _db_parent(), _config_parent()
    parser = argparse.ArgumentParser(prog="python -m engine", description="BASIS Lab: sketched-backprop training runs.")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", parents=[db, cfg], help="train one run in the foreground")
    run.add_argument("--estimator", default="basis", choices=ESTIMATORS)
    run.add_argument("--rank", type=int, default=RunConfig().rank)
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--name", help="a name for the run (default: e.g. 'basis R=8 s0')")

    sweep = sub.add_parser("sweep", parents=[db, cfg], help="a grid over estimators × ranks × λ × seeds")
    sweep.add_argument("--estimators", type=_csv(str), default=["basis"], help=f"comma list of {', '.join(ESTIMATORS)}")
    sweep.add_argument("--ranks", default="exact,1,8,32", help="comma list; 'exact' adds exact backprop (default %(default)s)")
    sweep.add_argument("--lams", type=_csv(float), help="comma list of λ (overrides --lam)")
    sweep.add_argument("--seeds", type=_csv(int), default=[0])
    sweep.add_argument("--concurrent", type=int, default=1, help="runs trained at once")

    sub.add_parser("list", parents=[db], help="all runs")
    show = sub.add_parser("show", parents=[db], help="one run: config, environment, final metrics")
    show.add_argument("run", help="run id or name")
    export = sub.add_parser("export", parents=[db], help="metric histories as CSV")
    export.add_argument("--out", required=True, help="CSV file to write")
    export.add_argument("--runs", nargs="*", help="run ids or names (default: all)")
    export.add_argument("--format", default="long", choices=("long", "wide"))
    export.add_argument("--force", action="store_true", help="overwrite --out if it exists (never the database)")
    summary = sub.add_parser("summary", parents=[db], help="the paper's Table 3: seeds paired at one step, Δ vs exact with a 95%% t-interval")
    summary.add_argument("--runs", nargs="*", help="run ids or names (default: all)")
    summary.add_argument("--at-step", type=int, help="compare every run at this step (default: per config, the latest step all its runs reached)")
    summary.add_argument("--format", default="table", choices=("table", "csv", "markdown", "latex"))
    summary.add_argument("--out", help="file to write instead of stdout")
    summary.add_argument("--force", action="store_true", help="overwrite --out if it exists (never the database)")
    cancel = sub.add_parser("cancel", parents=[db], help="stop queued or running runs (any process)")
    cancel.add_argument("runs", nargs="+", help="run ids or names")
    return parser


def _open_store(url):
    from storage import RunStore
    return RunStore(url)


def _grid(args) -> list[RunConfig]:
    if args.command == "run":
        if args.estimator not in ESTIMATORS:
            raise CliError(f"unknown estimator {args.estimator!r}; choose one of {', '.join(ESTIMATORS)}")
        return [_base_config(args, estimator=args.estimator, rank=args.rank, seed=args.seed, name=args.name)]
    unknown = [e for e in args.estimators if e not in ESTIMATORS]
    if unknown:
        raise CliError(f"unknown estimator(s) {unknown}; choose from {', '.join(ESTIMATORS)}")
    with_exact, ranks = parse_ranks(args.ranks)
    base = _base_config(args, estimator="exact")
    return expand_grid(base, estimators=args.estimators, ranks=ranks, seeds=args.seeds, lams=args.lams, with_exact=with_exact)


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
    n = export_csv(store, args.out, ids, fmt=args.format, force=args.force)
    print(f"wrote {n} rows to {args.out} ({args.format})")
    return 0


def _summary(args) -> int:
    from engine.summary import render, run_table3
    from storage.export import write_file

    if args.at_step is not None and args.at_step < 0:
        raise CliError(f"--at-step must be >= 0 (got {args.at_step})")
    store = _open_store(args.db)
    ids = store.resolve_runs(args.runs) if args.runs else None
    text = render(run_table3(store, ids, at_step=args.at_step), args.format)
    if args.out:
        write_file(store, args.out, text, force=args.force)
        print(f"wrote the summary to {args.out} ({args.format})", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def _cancel(args) -> int:
    store = _open_store(args.db)
    for run_id in store.resolve_runs(args.runs):
        ok = store.request_cancel(run_id)
        print(f"run {run_id}: {'cancel requested' if ok else 'already ended'}")
    return 0


def main(argv=None) -> int:
    from storage import StorageError

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command in ("run", "sweep"):
            configs = _grid(args)  # validated before anything is written
            return _train(args, configs)
        return {"list": _list, "show": _show, "export": _export, "summary": _summary, "cancel": _cancel}[args.command](args)
    except (CliError, ConfigError, StorageError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
