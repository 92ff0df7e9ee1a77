"""Runs as TensorBoard event files (``engine export --format tensorboard DIR``): one folder
per run, ``<id>-<name>``, so ``tensorboard --logdir DIR`` charts every metric and lists the
runs in its HParams view.

Each folder holds one event file, written with tensorboardX's own event writer
(``EventsWriter``, the one its ``SummaryWriter`` runs in a background thread; here it runs in
the caller, so a write error such as a full disk raises instead of stopping that thread and
leaving the export waiting on its queue): every stored metric value as a scalar at its step,
at the wall time ``created_at`` of the run plus the row's training wall time (seconds across
resumes), and the run's hyperparameters as an HParams session (``tensorboardX.summary.hparams``):
its config fields (nested ones joined with ``.``, lists as JSON), the method (estimator, rank,
lam, seed, …; an exact run has no rank or lam), the effective B, T, R, status, sweep and tags.
No experiment summary is written: TensorBoard then builds one from all the sessions it finds
(every hyperparameter with its range of values, every scalar tag a metric column showing the
run's final value), where an experiment summary per run would show only one run's columns.
TensorBoard holds scalars as 32-bit floats, so a value reads back as the stored one rounded to
``float32``.

Memory is bounded by a chunk of metric rows (``storage.stream``): the rows are read a chunk at
a time, in run order, and each is written as it comes. The folders are written into a private
folder first and moved into place at the end, so a failure leaves no partial export.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import secrets
import shutil
import stat
import tempfile
import zipfile
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

import pandas as pd
from tensorboardX.event_file_writer import EventsWriter
from tensorboardX.proto.api_pb2 import Status
from tensorboardX.proto.event_pb2 import Event
from tensorboardX.proto.plugin_hparams_pb2 import HParamsPluginData
from tensorboardX.proto.summary_pb2 import Summary
from tensorboardX.summary import hparams, scalar

from engine.config import shape_columns
from engine.core.estimators import is_exact
from storage import RunRecord, RunStore, StorageError
from storage.export import flatten_config
from storage.outputs import OutputExistsError, special_kind

__all__ = ["check_out_dir", "export_tensorboard", "folder_name", "hyperparameters", "tensorboard_zip"]

NAME_CHARS = 80  # the run name's share of a folder name
_UNSAFE = re.compile(r"[^A-Za-z0-9._=+-]+")
# a run's status as its HParams session's; any other (queued, cancelled, interrupted): STATUS_UNKNOWN
_SESSION_STATUS = {"finished": "STATUS_SUCCESS", "failed": "STATUS_FAILURE", "running": "STATUS_RUNNING"}
_STAGING = ".basis-lab-tensorboard-"


def folder_name(run: RunRecord) -> str:
    """The run's folder: ``<id>-<name>``, the name's characters other than ASCII letters,
    digits and ``. _ = + -`` each run replaced by ``_`` and cut to ``NAME_CHARS``; unique by
    the id."""
    slug = _UNSAFE.sub("_", run.name or "")[:NAME_CHARS].strip("._")
    return f"{run.id}-{slug}" if slug else str(run.id)


def hyperparameters(run: RunRecord) -> dict[str, Any]:
    """The run's hyperparameters for TensorBoard's HParams view: its stored config (nested
    keys joined with ``.``, lists and dicts as JSON), then its method and identity
    (``estimator``, ``rank``, ``lam``, ``seed``, ``preset``, ``steps``), the effective shape
    (``B_seqs``, ``T_tokens``, ``R_rows``), ``status``, ``sweep_id`` and ``tags``. An exact run
    has no rank nor lam (its config's are unused defaults); empty values are left out."""
    exact = is_exact(run.estimator)
    values: dict[str, Any] = dict(flatten_config(run.config, prefix=""))
    values.update(estimator=run.estimator, rank=run.rank, lam=run.lam, seed=run.seed, preset=run.preset,
                  steps=run.steps, **shape_columns(run.config), status=run.status, sweep_id=run.sweep_id,
                  tags=", ".join(run.tags or []) or None)
    if exact:
        values.update(rank=None, lam=None, R_rows=None)
    return {k: v for k, v in values.items() if v is not None and isinstance(v, (str, bool, int, float))}


def check_out_dir(out_dir: "str | os.PathLike[str]", runs: Sequence[RunRecord] = (), force: bool = False) -> Path:
    """The directory :func:`export_tensorboard` writes for ``out_dir`` (``~`` and links
    resolved), once it may; :class:`StorageError` (one line naming the fix), writing nothing,
    when ``out_dir`` is a file (the database included) or anything else but a directory (a
    device, a FIFO, a socket: ``storage.outputs``), a directory that holds anything while
    ``force`` is false, one whose folder for one of ``runs`` is a link or not a folder
    (``force`` or not), or is missing with its parent directory missing too."""
    shown = os.fspath(out_dir)
    target = Path(os.path.realpath(os.path.expanduser(shown)))
    kind = special_kind(target)
    if kind is None and target.exists():
        raise StorageError(f"cannot write {shown}: it is a file; give a directory (a new or an empty one)")
    if kind is not None and kind != "a directory":
        raise StorageError(f"refusing to write {shown}: it is {kind}, not a directory, and an output never replaces "
                           "one; give a directory (a new or an empty one)")
    if kind is None:
        if not target.parent.is_dir():
            raise StorageError(f"cannot write {shown}: directory {target.parent} does not exist; create it or "
                               "choose another path")
        return target
    try:
        with os.scandir(target) as entries:
            empty = next(entries, None) is None
    except OSError as e:
        raise StorageError(f"cannot read {shown} ({e.strerror or e}); choose another output directory") from e
    if not force and not empty:
        raise OutputExistsError(shown, "is not empty; pass {force} to write the runs' folders into it (a folder of the "
                                       "same name is replaced, nothing else is touched), or choose a new or an empty directory")
    for run in runs:
        _check_replaceable(target / folder_name(run))
    return target


def _check_replaceable(folder: Path) -> None:
    """StorageError when something other than a real folder (a link not followed) is at ``folder``."""
    try:
        mode = os.lstat(folder).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(mode):
        raise StorageError(f"cannot replace {folder}: it is not a folder (a file, a link or a device); move it away "
                           "or choose another directory")


def export_tensorboard(store: RunStore, ids: Optional[Iterable[int]], out_dir: "str | os.PathLike[str]",
                       force: bool = False, *, size: Optional[int] = None) -> list[Path]:
    """Write the runs ``ids`` (None: every run) as TensorBoard event files into ``out_dir``,
    one folder per run (:func:`folder_name`); return the folders, in the order of ``ids``.
    ``out_dir`` is created when it does not exist; an existing one must be empty unless
    ``force``, which replaces the folders of these runs and leaves everything else there
    (:func:`check_out_dir`; bad paths and unknown runs raise before anything is written).
    The metric rows are read about ``size`` at a time (default ``storage.stream.CHUNK_ROWS``)."""
    runs = store.runs.list_runs() if ids is None else [store.runs.get_run(int(i)) for i in dict.fromkeys(ids)]
    target = check_out_dir(out_dir, runs, force)
    shown = os.fspath(out_dir)
    staging = _make_staging(target, shown)
    try:
        _write_runs(store, runs, staging, size)
        if staging.parent == target:
            _move_into(staging, target, runs)
        else:
            os.rename(staging, target)  # the whole export appears at once
    except OSError as e:
        raise StorageError(f"cannot write {shown} ({e.strerror or e}); choose another output directory") from e
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return [target / folder_name(r) for r in runs]


def _make_staging(target: Path, shown: str) -> Path:
    """A new private folder to write the export in: inside ``target`` when it exists, else beside it."""
    where = target if target.is_dir() else target.parent
    staging = where / f"{_STAGING}{secrets.token_hex(6)}"
    try:
        staging.mkdir(0o777)  # as the user's umask says, like any folder they make
    except OSError as e:
        raise StorageError(f"cannot write {shown} ({e.strerror or e}); choose another output directory") from e
    return staging


def _move_into(staging: Path, target: Path, runs: Sequence[RunRecord]) -> None:
    """Move each run's folder from ``staging`` into ``target``; one there already (checked a
    real folder) is moved into ``staging`` first, to be removed with it."""
    for run in runs:
        name = folder_name(run)
        dest = target / name
        _check_replaceable(dest)
        if dest.exists():
            os.rename(dest, staging / f"{name}.old")
        os.rename(staging / name, dest)


def _write_runs(store: RunStore, runs: Sequence[RunRecord], staging: Path, size: Optional[int]) -> None:
    """Every run's event file in ``staging``: the metric rows streamed in run order, each
    run's file open while its rows come; a run with no rows gets its hyperparameters alone."""
    by_id = {r.id: r for r in runs}
    current: Optional[_RunEvents] = None
    try:
        for frame in store.metrics.chunks(list(by_id), size=size):
            for run_id, rows in frame.groupby("run_id", sort=False):
                if current is None or current.run.id != run_id:
                    if current is not None:
                        current.close()
                    current = _RunEvents(by_id.pop(int(run_id)), staging)
                current.add(rows)
    except BaseException:
        if current is not None:  # its folder goes with the staging folder
            with contextlib.suppress(OSError):
                current.writer.close()
        raise
    if current is not None:
        current.close()
    for run in by_id.values():
        _RunEvents(run, staging).close()


class _RunEvents:
    """One run's event file: its hyperparameters at the start, its metric rows as they come,
    its end status when closed."""

    def __init__(self, run: RunRecord, staging: Path):
        self.run = run
        self.origin = run.created_at.timestamp() if run.created_at is not None else 0.0
        folder = staging / folder_name(run)
        folder.mkdir()
        self.writer = EventsWriter(os.fspath(folder / "events"))
        self._tags: dict[str, str] = {}
        _, self._start, self._end = hparams(hyperparameters(run), {})
        self._write(self._start, 0, 0.0)

    def add(self, rows: pd.DataFrame) -> None:
        """Write metric rows (``store.metrics``' columns) as scalars: the values of consecutive
        rows of one step and wall time (one training record) as one event."""
        values: list = []
        at = (0, 0.0)
        for step, wall, name, value in zip(rows["step"].tolist(), rows["wall_time"].tolist(), rows["name"].tolist(),
                                           rows["value"].tolist()):
            if values and (step, wall) != at:
                self._write(Summary(value=values), *at)
                values = []
            at = (step, wall)
            values.append(Summary.Value(tag=self._tag(name), simple_value=value))
        if values:
            self._write(Summary(value=values), *at)

    def _tag(self, name: str) -> str:
        """The metric's tag: its name as tensorboardX's ``scalar`` cleans it, worked out once."""
        tag = self._tags.get(name)
        if tag is None:
            tag = self._tags[name] = scalar(name, 0.0).value[0].tag
        return tag

    def close(self) -> None:
        """Write the session's end (its status from the run's) and close the file."""
        plugin = self._end.value[0].metadata.plugin_data
        data = HParamsPluginData.FromString(plugin.content)
        data.session_end_info.status = Status.Value(_SESSION_STATUS.get(self.run.status, "STATUS_UNKNOWN"))
        if self.run.finished_at is not None:
            data.session_end_info.end_time_secs = self.run.finished_at.timestamp()
        plugin.content = data.SerializeToString()
        try:
            self._write(self._end, self.run.steps_done, 0.0)
        finally:
            self.writer.close()

    def _write(self, summary: Summary, step: int, wall: float) -> None:
        """One event at ``step``, at the run's origin plus ``wall`` training seconds."""
        seconds = self.origin + (wall if math.isfinite(wall) else 0.0)
        self.writer.write_event(Event(wall_time=seconds, step=int(step), summary=summary))


def tensorboard_zip(store: RunStore, ids: Iterable[int], root: str = "basis-runs-tensorboard") -> bytes:
    """:func:`export_tensorboard` of the runs ``ids`` as a zip (a download button's data): the
    run folders under ``root/``, so ``tensorboard --logdir root`` shows them once unzipped.
    Built in a temporary folder and a temporary file: memory holds the zip's bytes."""
    with tempfile.TemporaryDirectory() as tmp:
        folders = export_tensorboard(store, ids, Path(tmp) / root)
        with tempfile.TemporaryFile() as f:
            with zipfile.ZipFile(f, "w", zipfile.ZIP_DEFLATED) as z:
                for folder in folders:
                    for file in sorted(folder.iterdir()):
                        z.write(file, arcname=f"{root}/{folder.name}/{file.name}")
            f.seek(0)
            return f.read()
