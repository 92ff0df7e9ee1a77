"""A diagnosis of a stored run: ``engine.analysis.diagnostics.diagnose`` on that run's own state and batches.

What is measured
----------------
A diagnosis at step S takes the parameters of the run's checkpoint at S and the N
training batches the run drew *after* S (steps S+1 … S+N of its own sampler
sequence: the sampler state saved with the checkpoint, continued), so each d̂W is
measured exactly where training would have used it. At step 0 (a run without
checkpoints, or ``step=0``) the parameters are the run's initial ones
(``engine.training.build.initial_params``) and the batches the first N of a fresh ``BatchSampler``
with the run's seed. The sketch keys are ``jax.random.key(seed)`` (``seed`` a
setting, 0 by default), split inside ``diagnose``.

The job
-------
``plan_diagnosis`` validates every setting and resolves the step (reading no arrays),
so bad input is a one-line ``ConfigError``/``CheckpointError`` and nothing is written.
``start`` stores the diagnostic row (status ``queued``) with the plan's settings (the
step used, whether it is the initial parameters, the clipped ranks, …); ``execute``
claims it (``running``, stamped every ``liveness.HEARTBEAT_S`` by its process's ``liveness.Channel``,
which also reads back a cancel request), computes, stores the result rows and ends it ``finished``,
or ``failed`` (``engine.errors.failure_text``: a user error's one line, else the error and its
whole traceback). ``run_diagnosis``
does all three in the calling thread (the CLI); ``JobManager.diagnose`` runs
``execute`` on a thread of its own (the dashboard). ``check_stale_diagnoses`` marks
running diagnoses whose process died ``interrupted`` (the runs' rule,
``liveness.stale_runs``). ``results_csv`` is the CSV export (formula-neutralised).
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import pandas as pd

from engine import data
from engine.analysis import keystats
from engine.analysis.diagnostics import COLUMNS, diagnose
from engine.config import SEED_END, ConfigError, RunConfig, parse_estimators, parse_lams, parse_ranks
from engine.core import checks
from engine.core.choices import ESTIMATORS
from engine.errors import failure_text
from engine.runner import liveness
from engine.runner.paths import RunFolders, run_folders
from engine.training.build import initial_params, model_config, optimizer_for
from engine.training.checkpoints import CheckpointError, RunCheckpoints  # CheckpointError: raised to callers
from engine.training.inputs import load_data
from engine.training.steps import init_state
from storage import RunStore, StorageError
from storage.export import to_csv_bytes

SKETCHED = tuple(e for e in ESTIMATORS if e != "exact")  # the default estimators
DEFAULT_RANKS = (1, 4, 16, 64)
DEFAULT_KEYS = keystats.DEFAULT_KEYS  # 81: a variance ratio of 0.8 read "lower" with power 0.8 (keystats)
DEFAULT_BATCHES = 4
DEFAULT_CHUNK = 256  # keys per vmap; fewer where their d̂W would be large (diagnostics.CHUNK_FLOATS)
MAX_BATCHES = 1000

__all__ = [
    "Plan", "plan_diagnosis", "replan", "estimate_seconds", "start", "execute", "run_diagnosis", "checkpoint_steps", "check_stale_diagnoses",
    "results_csv", "SKETCHED", "DEFAULT_RANKS", "DEFAULT_KEYS", "DEFAULT_CHUNK",
]


@dataclass(frozen=True)
class Plan:
    """Everything a diagnosis needs, validated; ``settings`` is what its row stores."""

    run_id: int
    step: int  # the step measured (0: the initial parameters)
    initial: bool  # the run's initial parameters, not a checkpoint
    estimators: tuple[str, ...]
    ranks: tuple[int, ...]
    lams: tuple[float, ...]
    keys: int
    batches: int
    chunk: int
    seed: int
    checkpoints: RunFolders  # the run's checkpoint folders
    notes: tuple[str, ...] = field(default=())

    @property
    def work(self) -> int:
        """(batch, estimator, rank, λ) steps: what progress counts."""
        return self.batches * len(self.estimators) * len(self.ranks) * len(self.lams)

    @property
    def sketches(self) -> int:
        """Sketched dŴ per sketched layer: estimators × ranks × λs × keys × batches (the cost)."""
        return self.work * self.keys

    def cost_text(self) -> str:
        """``4 estimators × 4 ranks × 1 λ × 256 keys × 4 batches = 16,384 sketched dW per layer``."""
        def n(count, word, plural=None):
            return f"{count:,} {word if count == 1 else (plural or word + 's')}"
        return (f"{n(len(self.estimators), 'estimator')} × {n(len(self.ranks), 'rank')} × {n(len(self.lams), 'λ', 'λs')}"
                f" × {n(self.keys, 'key')} × {n(self.batches, 'batch', 'batches')} = {self.sketches:,} sketched dW "
                "per sketched layer")

    @property
    def settings(self) -> dict:
        return {
            "step": self.step, "initial": self.initial, "estimators": list(self.estimators),
            "ranks": list(self.ranks), "lams": list(self.lams), "keys": self.keys, "batches": self.batches,
            "chunk": self.chunk, "seed": self.seed, "notes": list(self.notes),
        }


def _run_dir(store: RunStore, run, checkpoints) -> RunFolders:
    return run_folders(store, run.uid, checkpoints)


def _open(folders: RunFolders, config: RunConfig, run_id: int) -> RunCheckpoints | None:
    """The run's checkpoints, or None when it never wrote one (nothing is created)."""
    if not folders.exists():
        return None
    return folders.open(keep=config.checkpoint_keep, name=f"run {run_id}")


def checkpoint_steps(store: RunStore, run_id: int, checkpoints: str | Path | None = None) -> list[int]:
    """The steps of ``run_id``'s complete checkpoints on disk, oldest first."""
    run = store.runs.get_run(run_id)
    ckpt = _open(_run_dir(store, run, checkpoints), RunConfig.from_dict(run.config), run_id)
    if ckpt is None:
        return []
    with ckpt:
        return ckpt.steps()


def _whole(name: str, value, low: int, high: int | None = None) -> int:
    if not checks.is_whole(value, low, high):
        bound = f"an integer in [{low}, {high}]" if high is not None else f"an integer >= {low}"
        raise ConfigError(f"{name} must be {bound} (got {value!r})")
    return value


def plan_diagnosis(
    store: RunStore,
    run_id: int,
    *,
    step: int | None = None,
    estimators: str | Sequence[str] | None = None,
    ranks: str | Sequence[int] | None = None,
    lams: str | Sequence[float] | None = None,
    keys: int = DEFAULT_KEYS,
    batches: int = DEFAULT_BATCHES,
    chunk: int = DEFAULT_CHUNK,
    seed: int = 0,
    checkpoints: str | Path | None = None,
) -> Plan:
    """Validate the settings of a diagnosis of ``run_id`` and resolve its step: ``None``
    the newest checkpoint (the initial parameters when there is none), 0 the initial
    parameters, S > 0 the checkpoint at S (a ``CheckpointError`` listing the saved
    steps when there is none). Defaults: every sketched estimator, ranks
    ``DEFAULT_RANKS``, the run's λ. Ranks are clipped to the run's B·T (duplicates
    dropped), as training clips them. Reads no arrays and writes nothing."""
    run = store.runs.get_run(run_id)
    config = RunConfig.from_dict(run.config)
    cfg = model_config(config)
    if not cfg.sketched_kernel_paths():
        raise ConfigError(f"run {run_id} sketches no layers (sketched_layers={config.sketched_layers}); "
                          "diagnose a run with sketched layers")
    est = _estimators(estimators)
    clipped, notes = _ranks(ranks, config.rows)
    lam_list = [float(config.lam)] if lams is None else parse_lams(lams)
    _whole("keys", keys, 2)
    _whole("batches", batches, 1, MAX_BATCHES)
    _whole("chunk", chunk, 1)
    _whole("seed", seed, 0, SEED_END - 1)
    directory = _run_dir(store, run, checkpoints)
    used = _step(directory, config, run_id, step, notes)
    return Plan(run_id=int(run_id), step=used, initial=used == 0, estimators=tuple(est), ranks=tuple(clipped),
                lams=tuple(lam_list), keys=keys, batches=batches, chunk=chunk, seed=seed, checkpoints=directory,
                notes=tuple(notes))


def _estimators(estimators: str | Sequence[str] | None) -> list[str]:
    """The sketched estimators asked for (default: all of them); exact has no sketch."""
    est = list(SKETCHED) if estimators is None else parse_estimators(estimators)
    if "exact" in est:
        raise ConfigError(f"estimators: exact has no sketch to diagnose; choose from {', '.join(SKETCHED)}")
    return est


def _ranks(ranks: str | Sequence[int] | None, rows: int) -> tuple[list[int], list[str]]:
    """The ranks asked for (default ``DEFAULT_RANKS``) clipped to the run's B·T = ``rows``,
    duplicates dropped, and a note when any was clipped."""
    if ranks is None:
        wanted = list(DEFAULT_RANKS)
    else:
        with_exact, wanted = parse_ranks(ranks if isinstance(ranks, str) else ",".join(map(str, ranks)))
        if with_exact:
            raise ConfigError("ranks: 'exact' is not a rank here; give integers >= 1, e.g. 1, 4, 16, 64")
    clipped = list(dict.fromkeys(min(r, rows) for r in wanted))
    return clipped, [f"ranks above B·T = {rows} clipped to {rows}"] if any(r > rows for r in wanted) else []


def _step(directory: RunFolders, config: RunConfig, run_id: int, step: int | None, notes: list[str]) -> int:
    """The step to measure: ``step`` when the run has a checkpoint there (or it is 0), the
    newest checkpoint for None (0 when there is none, noted in ``notes``)."""
    ckpt = _open(directory, config, run_id)
    saved = []
    if ckpt is not None:
        with ckpt:
            saved = ckpt.steps()
    if step is None:
        if not saved:
            notes.append("the run has no checkpoint: measured at its initial parameters")
        return saved[-1] if saved else 0
    used = _whole("step", step, 0)
    if used and used not in saved:
        raise CheckpointError(f"run {run_id} has no checkpoint at step {used} (saved: "
                              f"{', '.join(map(str, saved)) or 'none'}; 0 = the initial parameters): "
                              "choose a saved step")
    return used


def replan(store: RunStore, diag_id: int, checkpoints: str | Path | None = None) -> Plan:
    """The plan of stored diagnosis ``diag_id`` again (same run, step, estimators, ranks,
    λs, keys, batches, chunk and seed), validated anew: to run it again."""
    frame = store.frames.diagnostics_frame()
    rows = frame[frame["id"] == int(diag_id)]
    if rows.empty:
        raise ConfigError(f"no diagnosis {diag_id}; `python -m engine diagnose --list` shows their ids")
    row = rows.iloc[0]
    settings = row["settings"] or {}
    keep = {k: settings[k] for k in ("estimators", "ranks", "lams", "keys", "batches", "chunk", "seed") if k in settings}
    return plan_diagnosis(store, int(row["run_id"]), step=int(settings.get("step", row["step"] or 0)),
                          checkpoints=checkpoints, **keep)


def estimate_seconds(store: RunStore, plan: Plan) -> float | None:
    """The wall time ``plan`` should take, from the diagnoses of runs of the same model
    shape (preset, B, T, sketched layers) that finished: the median seconds per sketched
    dW times ``plan.sketches``; None when there is none."""
    config = RunConfig.from_dict(store.runs.get_run(plan.run_id).config)
    shape = (config.preset, config.rows, config.sketched_layers)
    frame = store.frames.diagnostics_frame()
    frame = frame[(frame["status"] == "finished") & frame["started_at"].notna() & frame["finished_at"].notna()]
    rates = []
    runs: dict[int, tuple[str, int, str] | None] = {}
    for row in frame.itertuples():
        if row.run_id not in runs:
            try:
                other = RunConfig.from_dict(store.runs.get_run(int(row.run_id)).config)
                runs[row.run_id] = (other.preset, other.rows, other.sketched_layers)
            except (ConfigError, TypeError, ValueError):
                runs[row.run_id] = None
        settings = row.settings or {}
        work = (len(settings.get("estimators", [])) * len(settings.get("ranks", [])) * len(settings.get("lams", []))
                * int(settings.get("keys", 0)) * int(settings.get("batches", 0)))
        if runs[row.run_id] == shape and work:
            rates.append((row.finished_at - row.started_at).total_seconds() / work)
    return float(pd.Series(rates).median()) * plan.sketches if rates else None


def start(store: RunStore, plan: Plan) -> int:
    """Store the diagnostic row of ``plan`` (status ``queued``); its id."""
    return store.diagnostics.create_diagnostic(plan.run_id, plan.step, plan.settings)


def load_inputs(store: RunStore, plan: Plan):
    """``(model config, params, [batch …])`` the plan measures: the parameters at its step
    and the ``plan.batches`` batches the run drew after it."""
    config = RunConfig.from_dict(store.runs.get_run(plan.run_id).config)
    train_tokens = load_data(config)[0]
    sampler = data.BatchSampler(train_tokens, config.effective_batch_size, config.effective_seq_len, config.seed)
    params = initial_params(config)
    if not plan.initial:
        ckpt = _open(plan.checkpoints, config, plan.run_id)
        if ckpt is None:
            raise CheckpointError(f"run {plan.run_id}'s checkpoints at {plan.checkpoints.own} are gone: "
                                  "choose step 0 (the initial parameters)")
        with ckpt:
            state, extra = ckpt.restore(init_state(params, optimizer_for(config)), plan.step)
        if int(extra.get("step", -1)) != plan.step:
            raise CheckpointError(f"checkpoint at step {plan.step} of run {plan.run_id} says it is step "
                                  f"{extra.get('step')}: fix by deleting it")
        sampler.set_state(extra["sampler"])
        params = state.params
    batches = [jnp.asarray(sampler.next()) for _ in range(plan.batches)]
    return model_config(config), params, batches


@contextmanager
def _watched(store: RunStore, diag_id: int, owner: str, cancel: threading.Event, channel: liveness.Channel | None):
    """Diagnosis ``diag_id`` beaten for by ``channel`` (else by a channel of its own, started here)
    while the block runs; ``cancel`` is set once someone asks it to stop."""
    own = channel is None
    channel = liveness.Channel(store, owner) if channel is None else channel
    channel.watch(diag_id, cancel)
    if own:
        channel.start()
    try:
        yield
    finally:
        channel.unwatch(diag_id)
        if own:
            channel.stop()


def execute(
    store: RunStore,
    diag_id: int,
    plan: Plan,
    *,
    owner: str | None = None,
    on_progress: Callable[[int, int], None] | None = None,
    cancel: threading.Event | None = None,
    channel: liveness.Channel | None = None,
) -> pd.DataFrame:
    """Claim the queued diagnostic ``diag_id``, compute ``plan``, store its rows and end it
    ``finished``; on an error, end it ``failed`` (``engine.errors.failure_text``: a user error's
    one line, else the error and its whole traceback) and raise it again. Its heartbeat is
    ``channel``'s (its process's), else a channel's of its own. ``cancel`` set (here, or by
    ``DiagnosticsRepository.diagnostics.request_cancel_diagnostic`` from any process, seen at the channel's next beat)
    stops it after the current (batch, estimator, rank, λ): the rows of the work done are
    stored and it ends ``cancelled``, saying how much was done."""
    owner = owner or liveness.current_owner()
    if not store.diagnostics.claim_diagnostic(diag_id, owner):
        raise ConfigError(f"diagnosis {diag_id} is not queued (already run or running); start a new one")
    cancel = cancel if cancel is not None else threading.Event()
    progress = [0, plan.work]

    def count(done: int, total: int) -> None:
        progress[:] = [done, total]
        if on_progress is not None:
            on_progress(done, total)

    try:
        with _watched(store, diag_id, owner, cancel, channel):
            cfg, params, batches = load_inputs(store, plan)
            frame = diagnose(cfg, params, batches, estimators=plan.estimators, ranks=plan.ranks, lams=plan.lams,
                             keys=plan.keys, key=jax.random.key(plan.seed), chunk=plan.chunk, on_progress=count,
                             should_stop=cancel.is_set)
        store.diagnostics.add_diagnostic_results(diag_id, frame.to_dict("records"))
        if cancel.is_set() and progress[0] < progress[1]:
            store.diagnostics.set_diagnostic_status(diag_id, "cancelled", error=(
                f"cancelled after {progress[0]:,} of {progress[1]:,} (batch, estimator, rank, λ) steps; the results "
                "pool the batches each setting finished (see its batches column)"))
        else:
            store.diagnostics.set_diagnostic_status(diag_id, "finished")
        return frame
    except BaseException as e:
        interrupted = isinstance(e, KeyboardInterrupt)
        try:
            store.diagnostics.set_diagnostic_status(diag_id, "interrupted" if interrupted else "failed",
                                        error="interrupted; run the diagnosis again" if interrupted else failure_text(e))
        except StorageError:  # the run (and so the row) was deleted meanwhile, or the database went away
            pass
        raise


def run_diagnosis(
    store: RunStore,
    run_id: int,
    *,
    step: int | None = None,
    estimators=None,
    ranks=None,
    lams=None,
    keys: int = DEFAULT_KEYS,
    batches: int = DEFAULT_BATCHES,
    chunk: int = DEFAULT_CHUNK,
    seed: int = 0,
    checkpoints: str | Path | None = None,
    on_progress: Callable[[int, int], None] | None = None,
    diag_id: int | None = None,
) -> tuple[int, pd.DataFrame]:
    """Plan, store and compute a diagnosis of ``run_id`` in this thread; ``(id, results)``
    (``engine.analysis.diagnostics.COLUMNS``). ``diag_id``: a queued row already created with
    ``start`` for the same settings, to run instead of creating one."""
    plan = plan_diagnosis(store, run_id, step=step, estimators=estimators, ranks=ranks, lams=lams, keys=keys,
                          batches=batches, chunk=chunk, seed=seed, checkpoints=checkpoints)
    diag_id = start(store, plan) if diag_id is None else diag_id
    return diag_id, execute(store, diag_id, plan, on_progress=on_progress)


def check_stale_diagnoses(store: RunStore, timeout_s: float = liveness.STALE_AFTER_S) -> list[int]:
    """Mark ``running`` diagnoses whose process died (or that stopped beating for
    ``timeout_s``) ``interrupted``; their ids (``liveness.mark_stale_diagnoses``)."""
    return liveness.mark_stale_diagnoses(store, timeout_s)


def results_csv(store: RunStore, diag_id: int, results: pd.DataFrame | None = None) -> bytes:
    """The result rows of ``diag_id`` as CSV, with its run and step in the first columns,
    formula-neutralised (``storage.export.to_csv_bytes``)."""
    diag = store.frames.diagnostics_frame().set_index("id").loc[int(diag_id)]
    run = store.runs.get_run(int(diag["run_id"]))
    frame = store.diagnostics.diagnostic_results(diag_id) if results is None else results[list(COLUMNS)]
    frame = frame.copy()
    frame.insert(0, "step", int(diag["step"]) if pd.notna(diag["step"]) else None)
    frame.insert(0, "run_name", run.name)
    frame.insert(0, "run_id", run.id)
    frame.insert(0, "diagnostic_id", int(diag_id))
    return to_csv_bytes(frame)
