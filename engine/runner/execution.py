"""One run trained by this process, from its claim to its stored end: ``RunExecution``.

A ``RunExecution`` claims its run (or is handed the lease a worker claimed), resumes it
from its newest trusted checkpoint, trains it while its process's liveness channel
(``liveness.Channel``) beats for it, stops when it is asked to (cancel, a signal, a lost lease,
a database that refuses its writes) and finishes by storing its notes and its end. What ends it
is recorded on the run (``engine.errors.failure_text``): a user error as its one line, any other
failure as ``failed: …`` or ``bug: …`` with its whole traceback. ``engine.runner.jobs.JobManager``
runs one per run on its worker threads; the rules they keep (exactly-once leases, faults) are
stated there.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Callable, Iterator, NamedTuple

from engine.config import ConfigError, RunConfig
from engine.errors import TASK_FAILURES, failure_text, is_bug
from engine.runner import campaigns, hosts, liveness, runlog
from engine.runner.paths import resume_limit, run_folders
from engine.runner.queueing import device_kind  # noqa: F401  (where jobs and tests read it)
from engine.runner.writer import StoreWriter
from engine.training import parallel
from engine.training.checkpoints import CheckpointDiskFull, CheckpointError, RunCheckpoints
from engine.training.loop import Record, TrainingDiverged, train
from engine.training.phases import Phases
from storage import DatabaseFullError, LeaseLostError, RunNotFoundError, RunRecord, RunStore, StorageError

log = logging.getLogger(__name__)

LOST = "lost"  # the status of an ``Outcome`` whose run another claim took


class Outcome(NamedTuple):
    """How a ``RunExecution`` left its run: its ``status`` and ``error``, and whether that
    status is stored (``released``: False when the database refused it, e.g. its disk is
    full, so the run still reads ``running`` under this lease)."""

    status: str
    error: str | None
    released: bool = True
    cause: str | None = None  # why it is interrupted (``storage.records.INTERRUPTION_CAUSES``), when it is


class RunExecution:
    """The training of run ``run_id`` by this process, under its owner's lease ``epoch``.

    State: ``run`` (the row as claimed), ``steps_done`` (the progress its channel's beat
    stores), ``lease_state`` (what the ``channel`` last read of its lease and cancel flag),
    ``notes`` (how it resumed), ``lost`` (the refusal that showed another claim took the run), ``status``/``error`` (its end) and ``released`` (whether that end is
    stored), ``cause`` (why it is interrupted, when it is). ``stop`` is set to cancel it, ``interrupted`` to interrupt it (a signal).
    ``on_resume(note, skipped)`` hears how a run trained before continues, once its checkpoint is
    read: ``note`` names the step actually used (``resumed from the checkpoint at step 42``, or a
    restart from step 0), ``skipped`` why newer checkpoints were refused."""

    def __init__(self, store: RunStore, writer: StoreWriter, run_id: int, *, owner: str, stop: threading.Event,
                 interrupted: threading.Event, checkpoints: Path, channel: liveness.Channel, epoch: int | None = None,
                 on_step: Callable[[int, float | None], None] | None = None,
                 on_record: Callable[[Record], None] | None = None,
                 on_resume: Callable[[str, list[str]], None] | None = None,
                 source: Callable[..., Iterator[Record]] | None = None):
        self.store, self.writer, self.run_id, self.owner = store, writer, run_id, owner
        self.stop_event, self.interrupted = stop, interrupted
        self.checkpoint_root, self.epoch, self.channel = checkpoints, epoch, channel
        self.lease_state: liveness.LeaseState | None = None
        self.on_step, self.on_record, self.on_resume = on_step, on_record, on_resume
        self.source = source or train  # what trains it: ``train``, or its cohort (``engine.runner.cohorts``)
        self.run: RunRecord | None = None
        self.notes: list[str] = []
        self.pruned: str | None = None  # why a pruner stopped this trial (engine.analysis.pruning)
        self.lost: LeaseLostError | None = None
        self.status: str | None = None
        self.error: str | None = None
        self.cause: str | None = None
        self.released = threading.Event()
        self.checkpoint_dir: Path | None = None

    @property
    def row(self) -> RunRecord:
        """The run's row as ``execute`` read it."""
        if self.run is None:
            raise RuntimeError(f"run {self.run_id} is read by execute() first")
        return self.run

    @property
    def steps_done(self) -> int:
        """The run's progress: the last step trained (its lease state's, which the channel stores)."""
        return self.lease_state.steps_done if self.lease_state is not None else 0

    @steps_done.setter
    def steps_done(self, step: int) -> None:
        if self.lease_state is not None:
            self.lease_state.steps_done = step

    @property
    def lease(self) -> int:
        """The epoch of this process's lease on the run (after ``claim``)."""
        if self.epoch is None:
            raise RuntimeError(f"run {self.run_id} is claimed first")
        return self.epoch

    # ------------------------------------------------------------------ the life of a run

    def claim(self, worker_id: str) -> bool:
        """Take a new lease on the run unless one was handed over; False when it is not to
        be trained: this process was interrupted before it started (then it is marked
        ``interrupted``, resumable, if it is still queued), it was cancelled, deleted or claimed elsewhere while
        queued, or the database's disk is full (it stays queued, said in one line)."""
        if self.epoch is not None:
            return True
        if self.interrupted.is_set():
            self.writer.call(self.run_id, self.store.queue.interrupt_queued, self.run_id,
                             "interrupted before it started; resume it to train it", "signal")
            self.writer.flush()
            return False
        try:
            self.epoch = self.store.queue.claim(self.run_id, self.owner, worker_id)
        except DatabaseFullError as e:
            log.warning("run %s not started, still queued: %s; `python -m engine resume --all` trains it once "
                        "there is space", self.run_id, e)
            return False
        return self.epoch is not None

    def execute(self) -> Outcome:
        """Train the claimed run to its end and return its ``Outcome``: (status, error) as
        written, or (``LOST``, the reason) when another claim took the run: then nothing more
        was written to it, not even a checkpoint.

        A database that cannot be reached is waited for (the writer retries). A full disk, of
        the database or of the checkpoints, ends the run ``interrupted`` with the one-line
        reason ``disk full: … resume N``; should the database refuse even that status, the
        outcome says it is not ``released`` (the caller writes it later)."""
        self.writer.forget(self.run_id)  # a failure of an earlier training of this run is not this one's
        self.run = self.store.runs.get_run(self.run_id)
        self.lease_state = self.channel.hold(self.run_id, self.lease, self.row.steps_done)
        try:
            self.status, self.error, self.cause = self.train()
        except LeaseLostError as e:
            self.lost = e
        except TrainingDiverged as e:
            self.status, self.error = "failed", str(e)
            self.steps_done = e.step  # the steps run past it before the loss was read are not progress
        except CheckpointDiskFull as e:  # the one line; what orbax logged goes to the run's log only
            self.status, self.error, self.cause = "interrupted", disk_full(self.run_id, e.path, str(e)), "disk_full"
            runlog.keep(e.details)
        except (ConfigError, CheckpointError) as e:
            self.status, self.error = "failed", str(e)
            runlog.keep(getattr(e, "details", ()))
        except TASK_FAILURES as e:  # recorded on the run (a bug as one, every frame kept), never raised into the worker
            self.status, self.error = "failed", failure_text(e)
            if is_bug(e):  # said whole where it is seen first; the end's one line follows (``jobs.ENDS``)
                log.error("run %s: %s", self.run_id, self.error)
        finally:
            self.channel.release(self.run_id)
        if self.lost is None:
            self.finish()
        if self.lost is not None:  # what it still queued under this lease is dropped by the writer, not written
            log.warning("%s", self.lost)
            return Outcome(LOST, str(self.lost))
        return Outcome(self.status or "failed", self.error, self.released.is_set(), self.cause)

    def train(self) -> tuple[str, str | None, str | None]:
        """Open the run's checkpoints under the lease, train from the newest trusted one and
        store every record; (status, error, interruption cause) of how the training ended. A
        training that reached the last step also stores where its time went (``Phases``:
        ``time/<phase>_s`` at the last step)."""
        config = RunConfig.from_dict(self.row.config)
        self.writer.call(self.run_id, self.store.runs.set_device, self.run_id,
                         device_kind(parallel.device_count(config)), epoch=self.epoch)
        pruning = campaigns.pruning_for(self.store, self.row)
        phases, wall = Phases(), None
        with self.open_checkpoints(config) as checkpoints:
            for record in self.source(config, should_stop=self.should_stop, on_step=self.note_step,
                                      checkpoints=checkpoints, resume=True, on_resume=self.resume_from, phases=phases):
                if self.lease_lost():
                    break
                self.store_record(record)
                wall = record.wall_time
                if pruning is not None and "val_loss" in record.values:
                    self.writer.flush()
                    self.pruned = pruning.prune(record.step, record.values["val_loss"])
                    if self.pruned:
                        self.stop_event.set()
        if self.lease_lost() and self.lost is not None:
            raise self.lost
        if wall is not None and self.steps_done == config.steps and not self.stop_event.is_set():
            self.writer.metrics(self.run_id, [(config.steps, wall, k, v) for k, v in phases.metrics().items()],
                                epoch=self.epoch)
        return self.ending()

    def open_checkpoints(self, config: RunConfig) -> RunCheckpoints:
        """The run's checkpoints as its owner trusts them: a resume takes none newer than the
        database records, a save goes to this lease's folder only while the lease holds and
        is recorded after. The followers of a multi-host run are told first, as opening
        checkpoints is collective there."""
        folders = run_folders(self.store, self.row.uid, self.checkpoint_root)
        self.checkpoint_dir = folders.own
        hosts.announce({"uid": self.row.uid, "config": self.row.config, "checkpoints": str(folders.own),
                        "borrowed": [str(p) for p in folders.borrowed], "keep": config.checkpoint_keep,
                        "epoch": self.epoch, "recorded": self.row.checkpoint_step})
        return folders.open(keep=config.checkpoint_keep, name=f"run {self.run_id}", epoch=self.epoch,
                            resume_limit=resume_limit(self.row.checkpoint_step), guard=self.hold_lease,
                            on_saved=self.record_checkpoint)

    def ending(self) -> tuple[str, str | None, str | None]:
        """(status, error, interruption cause) of a training that returned: the database refused its writes,
        a signal interrupted it, it was cancelled, or it finished."""
        failure = self.writer.failure(self.run_id)
        if failure is not None:
            return _ended_by(failure, self.run_id, self.store)
        if self.interrupted.is_set():
            return "interrupted", "interrupted by a signal; resume it to continue from its checkpoint", "signal"
        if self.stop_event.is_set():
            return "cancelled", self.pruned, None
        return "finished", None, None

    def finish(self) -> None:
        """Store the run's notes, its last progress and its end (under the lease), and wait
        for them to be written; the final writes may find the lease gone."""
        if self.notes:
            self.writer.final(self.run_id, self.store.runs.append_notes, self.run_id, "; ".join(self.notes),
                              epoch=self.epoch)
        self.writer.heartbeat(self.run_id, self.steps_done, owner=self.owner, epoch=self.epoch)
        self.writer.final(self.run_id, self.store_end)
        self.writer.flush()
        self.lease_lost()

    def store_end(self) -> None:
        self.store.runs.set_status(self.run_id, self.status or "failed", error=self.error, epoch=self.epoch, cause=self.cause)
        self.released.set()

    # ------------------------------------------------------------------ what train calls back

    def should_stop(self) -> bool:
        """Whether to stop before the next step: cancelled (here, or as the channel last read:
        a cancel request, the run deleted), interrupted, the lease lost, the database refusing
        the run's writes. Reads memory only, never the database."""
        state = self.lease_state
        if state is not None and state.cancelled.is_set():
            self.stop_event.set()
        if self.stop_event.is_set() or self.interrupted.is_set() or self.lease_lost():
            return True
        return self.writer.failure(self.run_id) is not None  # deleted meanwhile, or the database refuses writes

    def note_step(self, step: int, loss: float | None) -> None:
        self.steps_done = step
        if self.on_step:
            self.on_step(step, loss)

    def resume_from(self, step: int, skipped: list[str]) -> None:
        """The training continues from ``step`` (0: the start; the checkpoint actually read,
        newer refused ones in ``skipped``): note why, tell ``on_resume``, and delete the
        stored metrics (and per-batch evaluation losses) it will compute again."""
        self.steps_done = step
        had_history = self.row.steps_done > 0 or self.row.checkpoint_step is not None
        note = None
        if step:
            note = f"resumed from the checkpoint at step {step}"
        elif had_history:
            note = (f"restarted from step 0: no readable checkpoint in {self.checkpoint_dir} (is the "
                    "checkpoint directory shared with the machine that trained it?)")
        self.notes.extend([note] if note else [])
        self.notes.extend(f"skipped: {s}" for s in skipped)
        runlog.keep([note] if note else [], runlog.INFO)
        runlog.keep([f"skipped: {s}" for s in skipped], runlog.WARNING)
        if note and self.on_resume is not None:
            self.on_resume(note, skipped)
        # always: an owner killed before its first heartbeat or checkpoint left rows (step 0's)
        # that neither records; what this claim recomputes is deleted before it is written
        self.writer.call(self.run_id, self.store.metrics.delete_metrics_after, self.run_id, step if step else -1,
                         epoch=self.epoch)
        self.writer.heartbeat(self.run_id, step, owner=self.owner, epoch=self.epoch)

    def store_record(self, record: Record) -> None:
        """Queue the record's metrics and its per-batch evaluation losses, as one write (one transaction)."""
        losses = [(record.step, split, values) for split, values in record.batch_losses.items()]
        self.writer.metrics(self.run_id, [(record.step, record.wall_time, k, v) for k, v in record.values.items()],
                            eval_losses=losses, epoch=self.epoch)
        if "val_loss" in record.values:  # an evaluation: the run's progress line
            runlog.note(runlog.INFO, progress_line(record, self.row.steps))
        if self.on_record:
            self.on_record(record)

    # ------------------------------------------------------------------ the lease

    def lease_lost(self) -> bool:
        """Whether another claim took the run: a write of it was refused as such, or the
        channel's last beat read a newer lease."""
        refusal = self.writer.lost(self.run_id, self.lease)
        if refusal is None and self.lease_state is not None:
            refusal = self.lease_state.lost
        if refusal is not None and self.lost is None:
            self.lost = refusal
        return self.lost is not None

    def hold_lease(self, step: int) -> None:
        """Before a checkpoint: raise ``LeaseLostError`` if the lease is known lost (``lease_lost``:
        no query). One lost since the channel's last beat is not seen here: the save goes to this
        lease's own folder, and the record of it (``record_checkpoint``) is fenced."""
        if self.lease_lost() and self.lost is not None:
            raise self.lost

    def record_checkpoint(self, step: int) -> None:
        """After a checkpoint: record its step, fenced by the lease."""
        self.writer.call(self.run_id, self.writer.store.runs.set_checkpoint_step, self.run_id, step, epoch=self.epoch)


PROGRESS_KEYS = ("train_loss", "val_loss", "test_loss", "lr")


def progress_line(record: Record, steps: int | None) -> str:
    """A run's progress at an evaluation, as its log keeps it: "step 200/1000: train_loss 3.214, val_loss 3.402 (41.2 s)"."""
    values = ", ".join(f"{k} {record.values[k]:.4g}" for k in PROGRESS_KEYS if k in record.values)
    return f"step {record.step}" + (f"/{steps}" if steps else "") + f": {values} ({record.wall_time:.1f} s)"


def disk_full(run_id: int, where, detail: str) -> str:
    """The one-line reason of a run stopped by a full disk, naming the disk and the resume."""
    return (f"disk full: free space on {where} and run `python -m engine resume {run_id}` "
            f"(it continues from its last checkpoint); {detail}")


def _ended_by(failure: Exception, run_id: int, store: RunStore) -> tuple[str, str | None, str | None]:
    """(status, error, interruption cause) of a run whose writes failed for good: ``interrupted``
    (resumable) when the database's disk is full, ``cancelled`` when the run was deleted, else
    ``failed`` (a write that raised anything but a ``StorageError`` is a bug: ``failure_text``,
    its whole traceback kept)."""
    if not isinstance(failure, StorageError):
        return "failed", failure_text(failure), None
    if isinstance(failure, DatabaseFullError):
        url = store.engine.url
        where = (Path(url.database).parent if url.get_backend_name() == "sqlite" and url.database
                 else f"the disk of the database server ({store.url})")
        return "interrupted", disk_full(run_id, where, f"the database refused a write: {failure.reason}"), "disk_full"
    if isinstance(failure, RunNotFoundError):
        return "cancelled", None, None
    return "failed", f"the database refused a write of the run: {failure}", None
