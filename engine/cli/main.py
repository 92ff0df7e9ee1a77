"""``python -m engine``: run, sweep, reproduce, report, resume, worker, workers, list, show, export, summary,
delete, cancel and diagnose BASIS runs, and back up the database.

Every command takes ``--db URL`` (default ``$BASIS_LAB_DB_URL`` or the SQLite
file in ``storage.db.DEFAULT_DB_PATH``), the same database the dashboard reads.

The parser is generated from the run schema alone (``engine.config``: no JAX), and
each command imports what it runs, so ``--help`` and bad flags answer at once.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time

from engine.config import (
    DATA_OPTIONS,
    GROUPS,
    LARGE_LAUNCH,
    PAPER_STEPS,
    REPRODUCE_SEEDS,
    SWEEP_AXES,
    ConfigError,
    FieldSpec,
    RunConfig,
    Sweep,
    base_type,
    default_of,
    from_flat,
    launch_warnings,
    needs_confirmation,
    parse_seeds,
    reproduction_sweep,
    schema,
    shape_columns,
    sweep_from_flat,
)
from engine.core.choices import EQUIVALENCE_MARGIN as MARGIN
from engine.core.choices import SUMMARY_FORMATS

EXIT_BAD_INPUT = 2


class CliError(Exception):
    """Bad command-line input: printed without a traceback, exit status 2."""


def _db_parent() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--db", metavar="URL", help="SQLAlchemy URL or SQLite path (default: $BASIS_LAB_DB_URL or the default file)")
    return p


def _where_parent() -> argparse.ArgumentParser:
    """``--where EXPR``, the one run filter of list, export and summary (``engine.analysis.where``)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--where", metavar="EXPR",
                   help="only the runs this filter matches, e.g. \"rank >= 8 and lam == 0 and val_loss < 6.5 and tags "
                        "contains pilot\": any run or config field or metric (its final value); and, or, not, ( ), "
                        "==, !=, <, <=, >, >=, contains, in [..]")
    return p


def _where_ids(store, args, runs=None) -> list[int] | None:
    """The ids of ``runs`` (None: every run) that ``args.where`` matches; None: every run.
    A filter matching no run is a CliError (nothing is written)."""
    from engine.runner.queries import where_ids

    ids = where_ids(store, args.where, runs)
    if ids is not None and not ids and args.where:
        raise CliError(f"no run matches --where {args.where!r}; `python -m engine list` shows the runs")
    return ids


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
    if not sweep:
        return Sweep(from_flat(vars(args), cls), estimators=(args.estimator,), ranks=(args.rank,), lams=(args.lam,),
                     seeds=(args.seed,))
    return sweep_from_flat(vars(args), cls)


def build_parser() -> argparse.ArgumentParser:
    db = _db_parent()
    where = _where_parent()
    parser = argparse.ArgumentParser(prog="python -m engine", description="BASIS Lab: sketched-backprop training runs.")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", parents=[db], help="train one run in the foreground",
                         description="Train one run in the foreground. Every run field is a flag.")
    add_config_flags(run, sweep=False)
    sweep = sub.add_parser("sweep", parents=[db], help="a grid over estimators × ranks × λ × seeds",
                           description="Train a grid of runs: estimators × ranks × λs × seeds, exact once per seed.")
    add_config_flags(sweep, sweep=True)
    sweep.add_argument("--concurrent", type=int, default=1, help="runs trained at once (default: 1)")
    for p in (run, sweep):
        p.add_argument("--queue-only", action="store_true",
                       help="queue the runs for `python -m engine worker` processes instead of training them here")
        p.add_argument("--tags", metavar="LIST", help="comma list of tags for every run (filter by them on Runs)")
        p.add_argument("--yes", action="store_true",
                       help=f"launch even when that is more than {LARGE_LAUNCH} runs (asked for otherwise)")

    reproduce = sub.add_parser(
        "reproduce", parents=[db], help="the paper's grid: exact and basis R=1,8,16,32,64 (λ 0.01), tagged reproduce",
        description="Train (or with --queue-only, queue) the paper's grid: the paper preset, exact backprop and basis "
                    "at R = 1, 8, 16, 32, 64 with λ = 0.01, over seeds, tagged 'reproduce'. The estimated time is "
                    "printed first. When its last run ends, the sweep's report is built and stored (`python -m "
                    "engine report --sweep ID --out report.html` writes it).")
    reproduce.add_argument("--steps", type=int, default=PAPER_STEPS, help=f"steps per run (default: {PAPER_STEPS:,}, the paper's)")
    reproduce.add_argument("--seeds", default=",".join(map(str, REPRODUCE_SEEDS)), metavar="LIST",
                           help=f"comma list or range of seeds (default: {','.join(map(str, REPRODUCE_SEEDS))})")
    reproduce.add_argument("--concurrent", type=int, default=1, help="runs trained at once (default: 1)")
    reproduce.add_argument("--yes", action="store_true",
                           help=f"launch even when that is more than {LARGE_LAUNCH} runs (asked for otherwise)")
    reproduce.add_argument("--queue-only", action="store_true",
                           help="queue the runs for `python -m engine worker` processes instead of training them here")
    reproduce.add_argument("--margin", type=float, default=MARGIN, metavar="NATS",
                           help=f"equivalence margin δ of a Δ val loss vs exact (default: {MARGIN:g}): the seeds are "
                                "checked for the power to decide it before anything starts")
    reproduce.add_argument("--no-measure", action="store_true",
                           help="do not compile and time a step of models the lab has no finished run of (the estimate "
                                "is then unknown)")

    resume = sub.add_parser("resume", parents=[db], help="continue interrupted runs from their last checkpoint",
                            description="Continue runs under their own ids from their newest checkpoint (from step 0 "
                                        "when they have none). Metrics past that step are replaced.")
    resume.add_argument("runs", nargs="*", help="run ids or names")
    resume.add_argument("--all", action="store_true",
                        help="every interrupted run, and every queued run no live process will train")
    resume.add_argument("--concurrent", type=int, default=1, help="runs trained at once (default: 1)")

    worker = sub.add_parser("worker", parents=[db], help="train queued runs from the database until stopped",
                            description="A long-lived process that claims queued runs (whoever queued them) and "
                                        "trains them; run one per GPU or machine against one shared database.")
    worker.add_argument("--concurrent", type=int, default=1, help="runs trained at once (default: 1)")
    worker.add_argument("--max-runs", type=int, help="exit after this many runs")
    worker.add_argument("--idle-exit", type=float, metavar="S", help="exit after S seconds with nothing to train")
    sub.add_parser("workers", parents=[db], help="the registered workers and what they train")

    listing = sub.add_parser("list", parents=[db, where], help="all runs (or those --where matches), newest first")
    listing.add_argument("--wide", action="store_true", help="every column, nothing cut (default: fits 100 columns)")
    show = sub.add_parser("show", parents=[db], help="one run: config, environment, final metrics")
    show.add_argument("run", help="run id or name")
    export = sub.add_parser("export", parents=[db, where], help="metric histories as CSV",
                            description="Every metric value of the runs as CSV, with each run's status, sweep, tags, "
                                        "notes and effective B, T, R; the README's column dictionary says what "
                                        "each column holds.")
    export.add_argument("--out", required=True, help="CSV file to write")
    export.add_argument("--runs", nargs="*", help="run ids or names (default: all)")
    export.add_argument("--format", default="long", choices=("long", "wide"))
    export.add_argument("--force", action="store_true", help="overwrite --out if it exists (never the database)")
    summary = sub.add_parser("summary", parents=[db, where], help="the paper's Table 3: seeds paired at one step, Δ vs exact with a 95%% t-interval")
    summary.add_argument("--runs", nargs="*", help="run ids or names (default: all)")
    summary.add_argument("--at-step", type=int, help="compare every run at this step (default: per config, the latest step all its runs reached)")
    summary.add_argument("--format", default="table", choices=SUMMARY_FORMATS)
    summary.add_argument("--margin", type=float, default=MARGIN, metavar="NATS",
                         help=f"equivalence margin δ: a Δ val loss whose 90%% interval lies inside ±δ reads "
                              f"'equivalent' (default: {MARGIN:g})")
    summary.add_argument("--out", help="file to write instead of stdout")
    summary.add_argument("--force", action="store_true", help="overwrite --out if it exists (never the database)")
    backup = sub.add_parser("backup", parents=[db], help="a consistent copy of the database, while runs keep writing",
                            description="Copy the whole database into OUT in one consistent snapshot: SQLite with its "
                                        "backup API (WAL included; open the copy with --db OUT), PostgreSQL with "
                                        "pg_dump (restore with pg_restore). Runs may keep training meanwhile.")
    backup.add_argument("out", help="file to write")
    backup.add_argument("--force", action="store_true", help="overwrite OUT if it exists (never the database)")
    report = sub.add_parser(
        "report", parents=[db], help="a report of a sweep, tagged runs or a list of runs: HTML or Markdown",
        description="Build the report of a set of runs from the database (setup, Table 3 with paired Δ, 95% CI and "
                    "verdicts, the claims table, figures, diagnoses), store it with them and write it: .html is one "
                    "self-contained file with interactive figures (no network), .md is Markdown with SVG figures in "
                    "a folder beside it. Building a selection again replaces its stored report.")
    chosen = report.add_mutually_exclusive_group()
    chosen.add_argument("--sweep", metavar="ID", help="the runs of one sweep (`python -m engine list` shows sweep ids)")
    chosen.add_argument("--tags", metavar="LIST", help="the runs carrying every one of these tags (comma list)")
    chosen.add_argument("--runs", nargs="+", metavar="RUN", help="run ids or names")
    chosen.add_argument("--id", type=int, help="a stored report (`--list` shows them): write it as it was built")
    report.add_argument("--at-step", type=int, help="read every run at this step (default: per config, the latest step "
                                                    "all its runs reached)")
    report.add_argument("--margin", type=float, metavar="NATS",
                        help=f"equivalence margin δ of Table 3 and claim (c) (default: {MARGIN:g}; a stored "
                             "report rebuilt with --rebuild keeps its own)")
    report.add_argument("--out", help="file to write: report.html or report.md")
    report.add_argument("--force", action="store_true", help="overwrite --out if it exists (never the database)")
    report.add_argument("--rebuild", action="store_true", help="with --id: build that report again from the database")
    report.add_argument("--list", action="store_true", help="list the stored reports instead")
    delete = sub.add_parser("delete", parents=[db], help="delete runs with their metrics and checkpoints")
    delete.add_argument("runs", nargs="+", help="run ids or names (running runs must be cancelled first)")
    cancel = sub.add_parser("cancel", parents=[db], help="stop queued or running runs (any process)")
    cancel.add_argument("runs", nargs="+", help="run ids or names")
    diag = sub.add_parser("diagnose", parents=[db], help="bias, variance and MSE of the dW estimators on a run's state",
                          description="Measure every estimator's squared bias, variance, MSE (relative to ‖dW‖²) and "
                                      "mean cosine on a run's checkpoint and the training batches that followed it; "
                                      "stored in the database (the dashboard's Estimators page).")
    diag.add_argument("run", nargs="?", help="run id or name")
    diag.add_argument("--step", type=int, help="checkpoint step (default: the newest; 0: the initial parameters)")
    diag.add_argument("--estimators", metavar="LIST", help="comma list (default: every sketched estimator)")
    diag.add_argument("--ranks", metavar="LIST", help="comma list, clipped to B·T (default: 1,4,16,64)")
    diag.add_argument("--lams", metavar="LIST", help="comma list of λ (default: the run's λ)")
    diag.add_argument("--keys", type=int, help="sketch keys K per batch (default: the K at which a variance ratio "
                      "of 0.8 reads lower with power 0.8, engine.analysis.keystats.DEFAULT_KEYS)")
    diag.add_argument("--batches", type=int, default=4, help="training batches N after the step (default: 4)")
    diag.add_argument("--chunk", type=int, help="keys per vectorised chunk (default: 256, fewer for large layers)")
    diag.add_argument("--seed", type=int, default=0, help="seed of the sketch keys (default: 0)")
    diag.add_argument("--out", help="also write the results as CSV to this file")
    diag.add_argument("--force", action="store_true", help="overwrite --out if it exists (never the database)")
    other = diag.add_mutually_exclusive_group()
    other.add_argument("--list", action="store_true", help="list the stored diagnoses (of RUN, or all) instead")
    other.add_argument("--cancel", type=int, metavar="ID", help="stop diagnosis ID (in any process); it keeps what it "
                                                                "measured so far and ends cancelled")
    other.add_argument("--delete", type=int, metavar="ID", help="delete diagnosis ID and its results")
    other.add_argument("--rerun", type=int, metavar="ID", help="run diagnosis ID again with its settings, as a new one")
    return parser


def _open_store(url, *, create: bool = True):
    from storage import RunStore
    return RunStore(url, create=create)


def _grid(args) -> list[RunConfig]:
    """The runs to launch, after the notes and warnings the Launch form also shows; more
    than ``LARGE_LAUNCH`` runs need ``--yes``."""
    grid = sweep_from_args(args, sweep=args.command == "sweep")
    for clip in grid.clipped():
        print(f"note: {clip}; the run records R={clip.effective}", file=sys.stderr)
    configs = grid.expand()
    warnings = launch_warnings(configs)
    for w in warnings:
        text = w.text if w.field is None else w.text.replace(w.field, "--" + w.field.replace("_", "-"), 1)
        print(f"warning: {text}", file=sys.stderr)
    _confirmed(args, configs, "fewer --seeds/--ranks")
    return configs


def _confirmed(args, configs: list[RunConfig], fewer: str) -> None:
    """The one launch rule (``needs_confirmation``, the Launch form's too): more than
    ``LARGE_LAUNCH`` runs are launched only with ``--yes``; otherwise nothing is queued."""
    if needs_confirmation(len(configs)) and not args.yes:
        raise CliError(f"{len(configs):,} runs to launch (estimated total {_total_time(args.db, configs)}): pass --yes to "
                       f"launch them, or {fewer}")


def _total_time(url, configs: list[RunConfig]) -> str:
    """The estimated wall time of ``configs`` from the step times of finished runs of the
    same models in the database (the Launch form's estimate), or ``unknown``."""
    from engine.runner import estimates
    from engine.training import timing
    from storage import StorageError

    try:
        store = _open_store(url, create=False)
    except (StorageError, OSError):
        return "unknown"
    try:
        estimate = estimates.grid_estimate(store, configs)
    except StorageError:
        return "unknown"
    finally:
        store.close()
    return timing.format_seconds(estimate.seconds) if estimate.known else "unknown"


class _Signals:
    """SIGINT, SIGTERM and SIGHUP end the runs of this process the same way: each
    running run writes a checkpoint and ends ``interrupted`` (resumable), then the
    process exits with 128 + the signal number."""

    NAMES = ("SIGINT", "SIGTERM", "SIGHUP")

    def __init__(self, on_signal):
        self.received: int | None = None
        self._on_signal = on_signal
        self._previous = {}

    def __enter__(self):
        for name in self.NAMES:
            if hasattr(signal, name):
                sig = getattr(signal, name)
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.received is None:
            self.received = signum
            print(f"\n{signal.Signals(signum).name}: checkpointing and stopping (runs end interrupted; "
                  "`python -m engine resume --all` continues them)...", file=sys.stderr)
            self._on_signal()

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def exit_code(self, default: int) -> int:
        return 128 + self.received if self.received is not None else default


def _bars(manager_hook: dict):
    """tqdm progress bars per run, updated from worker threads."""
    from tqdm import tqdm

    bars: dict[int, tqdm] = {}
    lock = threading.Lock()

    def on_step(run_id, step, loss):
        with lock:
            bar = bars.get(run_id)
            if bar is None:
                return
            bar.update(step - bar.n)
            if loss is not None:
                bar.set_postfix(loss=f"{loss:.3f}", refresh=False)

    def add(run_id: int, total: int, label: str, done: int = 0) -> None:
        with lock:
            bars[run_id] = tqdm(total=total, initial=done, desc=f"#{run_id} {label}", position=len(bars), unit="step",
                                leave=True)

    def close():
        for bar in bars.values():
            bar.close()

    manager_hook.update(on_step=on_step)
    return add, close


def _foreground(args, store, start_runs) -> int:
    """Train in this process what ``start_runs(manager)`` queues, with progress bars and
    signal handling; print the summary. Exit 0 when every run finished."""
    from engine.runner.jobs import JobManager

    concurrent = getattr(args, "concurrent", 1)
    if concurrent < 1:
        raise CliError(f"--concurrent must be >= 1 (got {concurrent})")
    hooks: dict = {}
    add_bar, close_bars = _bars(hooks)
    manager = JobManager(store, max_concurrent=concurrent, on_step=lambda *a: hooks["on_step"](*a))
    if manager.interrupted:
        print(f"marked interrupted (left running by a process that died): {manager.interrupted}", file=sys.stderr)
    start = time.perf_counter()
    with _Signals(manager.interrupt) as signals:
        try:
            ids = start_runs(manager)
            for run_id in ids:
                r = store.get_run(run_id)
                add_bar(run_id, r.steps or 0, r.name, r.steps_done if r.status == "queued" else 0)
            manager.wait(ids)
        finally:
            manager.shutdown(cancel_running=False)
            close_bars()
    print(f"\nwall time {time.perf_counter() - start:.1f} s")
    if ids:
        _print_summary(store, ids)
    for run_id in ids:  # stopped by a fault (a full disk), not by a signal: the one line that says what to do
        outcome = manager.outcomes.get(run_id)
        if outcome is not None and outcome.status == "interrupted" and signals.received is None:
            print(f"run {run_id} interrupted: {(outcome.error or '').splitlines()[0]}", file=sys.stderr)
    statuses = {store.get_run(i).status for i in ids}
    return signals.exit_code(0 if statuses <= {"finished"} and not manager.lost else 1)


def _train(args, configs: list[RunConfig]) -> int:
    from engine.runner.jobs import new_sweep_id, queue_runs
    from engine.runner.queries import relaunch_warning
    from engine.training.inputs import check_data

    tags = _tags(args)
    store = _open_store(args.db)
    check_data(configs)
    if (again := relaunch_warning(store, configs)) is not None:
        print(f"warning: {again}", file=sys.stderr)
    if args.queue_only:
        ids = queue_runs(store, configs, tags=tags)
        print(f"queued {len(ids)} run(s) for workers in {store.url}: ids {ids}; start one with "
              "`python -m engine worker`")
        return 0

    def start(manager):
        ids = manager.submit(configs, sweep_id=new_sweep_id(), tags=tags)
        print(f"queued {len(ids)} run(s) in {store.url}: ids {ids}", file=sys.stderr)
        return ids

    return _foreground(args, store, start)


def _margin(value) -> float:
    from engine.core.stats import check_margin

    try:
        return check_margin(value)
    except ValueError as e:
        raise CliError(f"--margin: {e}") from None


def _reproduce(args) -> int:
    from engine.runner.estimates import grid_estimate
    from engine.runner.jobs import new_sweep_id, queue_runs
    from engine.runner.queries import relaunch_warning, seed_plan
    from engine.training.inputs import check_data

    if args.steps < 1:
        raise CliError(f"--steps must be >= 1 (got {args.steps})")
    if args.concurrent < 1:
        raise CliError(f"--concurrent must be >= 1 (got {args.concurrent})")
    margin = _margin(args.margin)
    sweep = reproduction_sweep(args.steps, parse_seeds(args.seeds))
    configs = sweep.expand()
    _confirmed(args, configs, "fewer --seeds")
    store = _open_store(args.db)
    check_data(configs)
    if (plan := seed_plan(store, configs, margin)) is not None:
        print(f"warning: {plan} (--seeds)", file=sys.stderr)
    if (again := relaunch_warning(store, configs)) is not None:
        print(f"warning: {again}", file=sys.stderr)
    seeds = ", ".join(map(str, sweep.seeds))
    print(f"the paper's grid: {len(configs)} runs (exact and basis R={','.join(map(str, sweep.ranks))}, "
          f"λ={sweep.lams[0]:g}; seeds {seeds}), {args.steps:,} steps each, tagged {', '.join(sweep.tags)}",
          file=sys.stderr)
    if not args.no_measure:
        print("estimating: the step time of each model, from the lab's finished runs or measured now…", file=sys.stderr)
    estimate = grid_estimate(store, configs, 1 if args.queue_only else args.concurrent, measure=not args.no_measure)
    where = "by one worker" if args.queue_only else f"{args.concurrent} run{'s' if args.concurrent > 1 else ''} at a time"
    print(f"estimated time ({where}): {estimate.text()}", file=sys.stderr)
    sweep_id = new_sweep_id()
    if args.queue_only:
        ids = queue_runs(store, configs, sweep_id=sweep_id, tags=sweep.tags)
        print(f"queued {len(ids)} run(s) for workers in {store.url}: sweep {sweep_id}, ids {ids}; start one with "
              "`python -m engine worker`; its report is stored when the last run ends")
        return 0

    def start(manager):
        ids = manager.submit(configs, sweep_id=sweep_id, tags=sweep.tags)
        print(f"queued {len(ids)} run(s) in {store.url}: sweep {sweep_id}, ids {ids}", file=sys.stderr)
        return ids

    code = _foreground(args, store, start)
    reports = store.list_reports(sweep_id=sweep_id)
    if reports:
        print(f"report {reports[0].id} of sweep {sweep_id} stored; write it with `python -m engine report --sweep "
              f"{sweep_id} --out report.html` (or .md), or open the dashboard's Report page")
    return code


def _tags(args) -> tuple[str, ...]:
    from storage.limits import TAG_MAX, check_utf8

    tags = tuple(dict.fromkeys(t.strip() for t in (getattr(args, "tags", None) or "").split(",") if t.strip()))
    for t in tags:
        if len(t) > TAG_MAX:
            raise CliError(f"--tags: {t[:20]!r}… is longer than {TAG_MAX} characters; use shorter tags")
        try:
            check_utf8("--tags", t)
        except ValueError as e:
            raise CliError(str(e)) from None
    return tags


def _resume(args) -> int:
    if not args.all and not args.runs:
        raise CliError("name the runs to resume (ids or names), or pass --all")
    store = _open_store(args.db, create=False)

    def start(manager):
        from engine.runner.liveness import check_stale

        check_stale(store)
        ids = store.resolve_runs(args.runs) if args.runs else []
        if args.all:
            ids += [r.id for r in store.list_runs(statuses=["interrupted"]) if r.id not in ids]
        for run_id in ids:
            r = store.get_run(run_id)
            if r.status in ("running", "queued", "finished"):
                print(f"run {run_id}: {r.status}, nothing to resume", file=sys.stderr)
        moved = manager.resume(ids)
        if args.all:
            moved += manager.adopt_orphans()
        for run_id in moved:
            r = store.get_run(run_id)
            where = f"from its checkpoint at step {r.checkpoint_step}" if r.checkpoint_step else "from step 0 (no checkpoint)"
            print(f"run {run_id} {r.name}: resuming {where}", file=sys.stderr)
        if not moved:
            print("nothing to resume", file=sys.stderr)
        return moved

    return _foreground(args, store, start)


def _worker(args) -> int:
    from engine.runner.jobs import JobManager

    for name in ("concurrent", "max_runs"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise CliError(f"--{name.replace('_', '-')} must be >= 1 (got {value})")
    if args.idle_exit is not None and args.idle_exit < 0:
        raise CliError(f"--idle-exit must be >= 0 seconds (got {args.idle_exit})")
    store = _open_store(args.db)
    manager = JobManager(store, max_concurrent=args.concurrent, pull=True, max_runs=args.max_runs,
                         on_step=None)
    print(f"worker {manager.worker_id} on {store.url}: training queued runs, {args.concurrent} at a time; "
          f"checkpoints in {manager.checkpoint_root}", file=sys.stderr)
    with _Signals(manager.interrupt) as signals:
        try:
            while signals.received is None:
                time.sleep(0.5)
                if args.max_runs is not None and manager.started_runs >= args.max_runs and not manager.busy():
                    break
                if args.idle_exit is not None and manager.idle_seconds() >= args.idle_exit:
                    break
        finally:
            manager.shutdown(cancel_running=False)
    print(f"worker {manager.worker_id} stopped after {manager.started_runs} run(s)", file=sys.stderr)
    return signals.exit_code(0)


def _workers(args) -> int:
    from engine.runner.liveness import worker_states

    store = _open_store(args.db, create=False)
    frame = worker_states(store.workers_frame())
    if frame.empty:
        print("no workers yet: start one with `python -m engine worker`")
        return 0
    cols = ["id", "state", "host", "pid", "device", "concurrent", "current_run_id", "started_at", "heartbeat_at"]
    print(frame[cols].rename(columns={"current_run_id": "run"}).to_string(index=False, na_rep="-"))
    return 0


def _print_summary(store, ids) -> None:
    import pandas as pd

    from engine.analysis.summary import MIB
    from engine.runner.queries import run_summary

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
    from engine.cli.listing import list_text
    from engine.runner.liveness import check_stale

    store = _open_store(args.db, create=False)
    check_stale(store)
    frame = store.runs_frame()
    if frame.empty:
        print("no runs yet: start one with `python -m engine run` or `python -m engine sweep`")
        return 0
    if args.where:
        frame = frame[frame["id"].isin(_where_ids(store, args))]
    print(list_text(frame, wide=args.wide))
    return 0


def _show(args) -> int:
    from engine.runner.liveness import check_stale

    store = _open_store(args.db, create=False)
    check_stale(store)
    run_id = store.resolve_runs([args.run])[0]
    r = store.get_run(run_id)
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
    _print_summary(store, [run_id])
    return 0


def _export(args) -> int:
    from storage import export_csv
    store = _open_store(args.db, create=False)
    ids = _where_ids(store, args, store.resolve_runs(args.runs) if args.runs else None)
    n = export_csv(store, args.out, ids, fmt=args.format, force=args.force, shape=shape_columns)
    print(f"wrote {n} rows to {args.out} ({args.format})")
    return 0


def _summary(args) -> int:
    from engine.runner.queries import run_table3, table3_text
    from storage.export import write_file

    if args.at_step is not None and args.at_step < 0:
        raise CliError(f"--at-step must be >= 0 (got {args.at_step})")
    margin = _margin(args.margin)
    store = _open_store(args.db, create=False)
    ids = _where_ids(store, args, store.resolve_runs(args.runs) if args.runs else None)
    text = table3_text(run_table3(store, ids, at_step=args.at_step, margin=margin), args.format)
    if args.out:
        write_file(store, args.out, text, force=args.force)
        print(f"wrote the summary to {args.out} ({args.format})", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def _backup(args) -> int:
    from storage.backup import backup

    store = _open_store(args.db, create=False)
    done = backup(store, args.out, force=args.force)
    print(f"backed up {store.url} to {done.path}: {done.describe()}")
    return 0


def _report(args) -> int:
    import pandas as pd

    from engine.runner import reports

    store = _open_store(args.db, create=False)
    if args.list:
        listed = store.list_reports()
        if not listed:
            print("no reports yet: build one with `python -m engine report --sweep ID --out report.html`")
            return 0
        frame = pd.DataFrame([{"id": r.id, "title": r.title, "runs": len(r.run_ids), "at step": r.at_step,
                               "built (UTC)": r.created_at.strftime("%Y-%m-%d %H:%M:%S") if r.created_at else None}
                              for r in listed])
        print(frame.to_string(index=False, na_rep="-"))
        return 0
    if args.out:
        reports.format_of(args.out)  # a bad suffix fails before anything is built
    margin = None if args.margin is None else _margin(args.margin)

    def checked(report):
        """``report`` once ``--out`` may be written (its figure folder too): else nothing is stored."""
        if args.out:
            reports.check_output(report, args.out, force=args.force)
        return report

    if args.id is not None:
        if args.at_step is not None:
            raise CliError("--at-step builds a new report; with --id the stored report keeps its own step")
        if margin is not None:
            raise CliError("--margin builds a new report; with --id the stored report keeps its own margin")
        if args.rebuild:
            report_id, built = reports.rebuild(store, args.id, check=checked)
            print(f"rebuilt report {report_id} from the database", file=sys.stderr)
        else:
            report_id, built = args.id, checked(reports.load(store, args.id))
    else:
        if args.rebuild:
            raise CliError("--rebuild needs --id (a stored report); building a selection always reads the database")
        runs = store.resolve_runs(args.runs) if args.runs else None
        tags = [t for t in (args.tags or "").split(",") if t.strip()] or None
        selection = reports.selection_of(sweep=args.sweep, tags=tags, runs=runs, at_step=args.at_step, margin=margin)
        built = checked(reports.build(store, selection))
        report_id = reports.save(store, built)
        print(f"stored as report {report_id}: {built.title} ({len(built.run_ids)} runs)", file=sys.stderr)
    for v in built.verdicts:
        print(f"({v.key}) {v.verdict}: {v.sentence}" + (f"\n    to decide it: {v.power}" if v.power else ""),
              file=sys.stderr)
    if args.out:
        written = reports.write(built, args.out, force=args.force)
        extra = f" and {len(written) - 1} figure(s) in {written[1].parent}" if len(written) > 1 else ""
        print(f"wrote {written[0]}{extra}")
    elif args.id is None or args.rebuild:
        print(f"write it with `python -m engine report --id {report_id} --out report.html` (or .md)")
    return 0


def _delete(args) -> int:
    from engine.runner.jobs import delete_runs
    from engine.runner.liveness import check_stale

    store = _open_store(args.db, create=False)
    check_stale(store)
    ids = store.resolve_runs(args.runs)
    problems = delete_runs(store, ids)
    for p in problems:
        print(f"error: {p}", file=sys.stderr)
    print(f"deleted {len(ids) - len(problems)} run(s)")
    return EXIT_BAD_INPUT if problems else 0


def _cancel(args) -> int:
    from engine.runner.liveness import check_stale

    store = _open_store(args.db, create=False)
    check_stale(store)
    for run_id in store.resolve_runs(args.runs):
        status = store.get_run(run_id).status
        if status not in ("queued", "running"):
            print(f"run {run_id}: not active ({status}); nothing to cancel")
            continue
        store.request_cancel(run_id)
        print(f"run {run_id}: {'cancelled' if status == 'queued' else 'cancel requested; it stops within a step'}")
    return 0


def _diagnose(args) -> int:
    from pathlib import Path

    import pandas as pd
    from tqdm import tqdm

    from engine.analysis.diagnostics import COLUMNS
    from engine.runner import diagnosis
    from engine.training.timing import format_seconds
    from storage.export import write_file

    store = _open_store(args.db, create=False)
    if args.list:
        diagnosis.check_stale_diagnoses(store)
        run_id = store.resolve_runs([args.run])[0] if args.run else None
        frame = store.diagnostics_frame(run_id)
        if frame.empty:
            print("no diagnoses yet: run `python -m engine diagnose RUN`")
            return 0
        frame["settings"] = [" ".join(f"{k}={','.join(map(str, v)) if isinstance(v, list) else v}" for k, v in s.items()
                                      if k not in ("step", "notes", "chunk"))
                             for s in frame["settings"]]
        frame["error"] = [e.splitlines()[0] if isinstance(e, str) and e else "-" for e in frame["error"]]
        print(frame[["id", "run_id", "step", "status", "created_at", "settings", "error"]]
              .rename(columns={"run_id": "run"}).to_string(index=False, na_rep="-"))
        return 0
    if args.cancel is not None:
        diagnosis.check_stale_diagnoses(store)
        if store.request_cancel_diagnostic(args.cancel):
            print(f"cancel requested for diagnosis {args.cancel}: a queued one is cancelled now, a running one stops "
                  "after its current step and keeps what it measured")
        else:
            print(f"diagnosis {args.cancel} has already ended; nothing to cancel")
        return 0
    if args.delete is not None:
        diagnosis.check_stale_diagnoses(store)
        store.delete_diagnostic(args.delete)
        print(f"deleted diagnosis {args.delete} and its results")
        return 0
    if not args.run and args.rerun is None:
        raise CliError("name the run to diagnose (id or name), or pass --list, --rerun, --cancel or --delete")
    if args.out:
        out = Path(args.out).expanduser()
        if out.exists() and not args.force:
            raise CliError(f"{args.out} already exists; pass --force to overwrite it, or choose another path")
        if not out.absolute().parent.is_dir():
            raise CliError(f"cannot write {args.out}: its directory does not exist; create it or choose another path")
    if args.rerun is not None:
        plan = diagnosis.replan(store, args.rerun)
        run_id = plan.run_id
    else:
        run_id = store.resolve_runs([args.run])[0]
        plan = diagnosis.plan_diagnosis(store, run_id, step=args.step, estimators=args.estimators, ranks=args.ranks,
                                        lams=args.lams, batches=args.batches, seed=args.seed,
                                        keys=diagnosis.DEFAULT_KEYS if args.keys is None else args.keys,
                                        chunk=diagnosis.DEFAULT_CHUNK if args.chunk is None else args.chunk)
    where = "the initial parameters" if plan.initial else f"the checkpoint at step {plan.step}"
    print(f"run {run_id} {store.get_run(run_id).name}: diagnosing {where} on the {plan.batches} training "
          f"batch(es) after it, K = {plan.keys} keys", file=sys.stderr)
    eta = diagnosis.estimate_seconds(store, plan)
    print(f"cost: {plan.cost_text()}; estimated time "
          f"{format_seconds(eta) if eta is not None else 'unknown (no finished diagnosis of this model yet)'}",
          file=sys.stderr)
    for note in plan.notes:
        print(f"note: {note}", file=sys.stderr)
    diag_id = diagnosis.start(store, plan)
    bar = tqdm(total=plan.work, unit="setting", desc=f"diagnosis {diag_id}")
    try:
        frame = diagnosis.execute(store, diag_id, plan, on_progress=lambda done, total: bar.update(done - bar.n))
    finally:
        bar.close()
    shown = frame.assign(layer=pd.Categorical(frame["layer"], ["all", *dict.fromkeys(frame["layer"][frame["layer"] != "all"])]))
    shown = shown.sort_values(["layer", "estimator", "lam", "rank"], kind="stable")[
        [c for c in COLUMNS if c not in ("keys", "batches")]]
    print(shown.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    status = store.diagnostics_frame().set_index("id").loc[diag_id, ["status", "error"]]
    if status["status"] == "cancelled":
        print(f"cancelled: {status['error']}", file=sys.stderr)
    print(f"stored as diagnosis {diag_id} of run {run_id} (step {plan.step})")
    if args.out:
        write_file(store, args.out, diagnosis.results_csv(store, diag_id), force=args.force)
        print(f"wrote {len(frame)} rows to {args.out}", file=sys.stderr)
    return 0


def _command(args) -> int:
    if args.command in ("run", "sweep"):
        configs = _grid(args)  # validated before anything is written
        return _train(args, configs)
    commands = {"reproduce": _reproduce, "report": _report, "list": _list, "show": _show, "export": _export,
                "summary": _summary, "delete": _delete, "cancel": _cancel, "resume": _resume, "diagnose": _diagnose,
                "backup": _backup, "worker": _worker, "workers": _workers}
    return commands[args.command](args)


def _on_hosts(args) -> int:
    """A training command, on several hosts when ``engine.runner.hosts``' variables say so:
    process 0 runs it (and alone writes the database), every other process follows it."""
    from engine.runner import hosts

    if not hosts.initialize():
        return _command(args)
    if getattr(args, "concurrent", 1) != 1:
        raise CliError("--concurrent must be 1 on several hosts: every process trains the same run at once")
    if not hosts.is_leader():
        return hosts.follow()  # the leader validates the flags (and announces the end if they are bad)
    try:
        return _command(args)
    finally:
        hosts.announce(None)


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from storage import RunNotFoundError, StorageError

    try:
        if args.command in ("run", "sweep") and not args.queue_only or args.command in ("resume", "worker"):
            return _on_hosts(args)
        return _command(args)
    except (CliError, ConfigError, StorageError, ValueError) as e:  # ReportError is a ValueError
        hint = "; `python -m engine list` shows the ids and names" if isinstance(e, RunNotFoundError) else ""
        print(f"error: {e}{hint}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BrokenPipeError:  # the reader went away (`engine show 1 | head`): not an error of ours
        return _quiet_broken_pipe()
    except OSError as e:
        where = f" ({e.filename})" if getattr(e, "filename", None) else ""
        print(f"error: {e.strerror or e}{where}; check that the disk has space and the path is writable, "
              "or point BASIS_LAB_DB_URL / BASIS_LAB_CHECKPOINTS elsewhere", file=sys.stderr)
        return EXIT_BAD_INPUT


EXIT_BROKEN_PIPE = 128 + 13  # what a shell reports for a process a SIGPIPE ended (`cmd | head`)


def _quiet_broken_pipe() -> int:
    """Exit status after stdout's reader closed the pipe, with nothing printed: stdout is
    pointed at /dev/null so the interpreter's own flush at exit does not fail again
    (Python's documented handling of SIGPIPE, ``signal`` module notes)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout without a file descriptor (an in-process caller's buffer)
        pass
    return EXIT_BROKEN_PIPE


def main_exit() -> None:
    """The ``basis-lab`` console script: ``main()`` as the process exit status."""
    sys.exit(main())
