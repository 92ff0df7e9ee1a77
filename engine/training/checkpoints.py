"""Checkpoints of training runs, written with orbax-checkpoint.

Where they live
---------------
``checkpoint_root()`` is ``$BASIS_LAB_CHECKPOINTS`` when set, else a
``checkpoints`` directory beside the SQLite database file the database URL
names (``storage.db.resolve_url()``: ``--db``/``$BASIS_LAB_DB_URL``, default
``~/.local/share/basis-lab/basis-lab.db`` → ``~/.local/share/basis-lab/checkpoints``).
For a database that is not a SQLite file (PostgreSQL) it is beside the default
SQLite path; runs that many machines train against one PostgreSQL database should
set ``BASIS_LAB_CHECKPOINTS`` to a filesystem they all mount. Each run keeps its
checkpoints in ``run_dir(root, run) = root / "run-<run>"`` (a copy of a database, e.g. a
backup, under ``root / "db-<its identity>"`` instead, reading its original's as
``borrowed``: ``engine.runner.paths``), one sub-directory per lease (epoch) of the run
that saved, and in it one per saved step::

    <root>/run-12/epoch-3/300/state/...   parameters, optimizer state, step (orbax StandardSave)
    <root>/run-12/epoch-3/300/meta/...    JSON metadata (sampler state, loss window, config,
                                          and the SHA-256 of every saved array)

Every claim of a run takes a new epoch (``storage.lease``), and an owner writes only
under its own, so two processes that both believe they train a run (one stalled, then
replaced) never write into one folder. Reading looks at every epoch (and at steps
directly under ``run-12/``, as written before epochs): ``steps()`` lists the steps of
all of them and a restore takes, for a step, the newest epoch's checkpoint of it.

What a checkpoint holds
-----------------------
``state`` is the ``TrainState`` pytree (params, optimizer state, step) and
``extra`` any JSON dict the caller needs to continue the exact trajectory, e.g.
``BatchSampler.state()``, the training losses since the last eval, the config
and the wall time so far. The sketch keys need nothing: ``sketch_key(root, step)``
depends only on the seed and the step.

Sharded state
-------------
A run on several devices (``engine.training.parallel``) saves its state as it lies:
orbax's ``StandardSave`` writes every array from its shards (each shard once, by the
process that holds its first replica), and ``restore`` reads them into the shardings of
the target state, so a run resumes on another device count or layout (4 devices with
sharded parameters → 2 devices) with the same numbers. Under ``jax.distributed`` every
process calls ``save`` and ``restore`` (they are collective); orbax lets process 0 write
the metadata and the replicated arrays.

Atomicity
---------
Saves are synchronous (``enable_async_checkpointing=False``): ``save`` returns
once the checkpoint is complete on disk. Orbax writes each step into
``<step>.orbax-checkpoint-tmp`` and renames it to ``<step>`` when every item
is written (``AtomicRenameTemporaryPath``, its default on a local or mounted
filesystem), so a process killed mid-save leaves only a temporary directory,
which ``steps()`` never lists. (The rename is atomic for a dying process; orbax
does not fsync the parent directory, so a power cut may lose the newest one.)
The owner of a lease deletes such leftovers when it opens the run's checkpoints (a
``RunCheckpoints`` with an ``epoch``), in its own epoch's folder and in every older one
(their owners are gone: a newer lease was taken), before it trains, so a resume after a
full disk starts with that space back; otherwise it is done at the first ``save``.
Reading never deletes them. A save that fails (a full disk: ``CheckpointDiskFull``)
deletes its own.

Proof of contents
-----------------
``save`` writes the SHA-256 of every array's bytes (and of the metadata) with the
checkpoint's metadata; ``restore`` recomputes them on the restored arrays, so a
checkpoint damaged on disk (flipped bytes, a truncated or missing file) is refused
with a one-line ``CheckpointError`` naming its step, and ``restore_latest_valid``
warns once and falls back to the next older checkpoint. (``bench/checkpoint.py``
measures what hashing costs next to the save.) Every checkpoint written with checksums
also declares so in orbax's own step metadata (``basis_lab_format``: 2), and checksums
came with lease epochs, so a checkpoint in an ``epoch-<E>`` folder, or one that declares
the format, whose checksum record is missing is damaged like one whose bytes are: only a
checkpoint of the older format (directly in the run folder, declaring none) is restored
unchecked. What orbax logs while it fails to read a damaged checkpoint (tracebacks,
warnings) is kept out of the output and logged at DEBUG: the failure is one line.

Retention
---------
The newest ``keep`` checkpoints are kept, plus every checkpoint saved with
``final=True`` (the run's last step), which later saves never delete. A writer of
epoch E also deletes the checkpoints of older epochs that are not among the newest
``keep`` of all, then the older epoch folders left empty.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import re
import shutil
import sys
import threading
from pathlib import Path
from typing import Any, Callable, Sequence

import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils
from orbax.checkpoint import checkpoint_managers

from engine.core import checks
from engine.errors import BasisLabError, UserError

log = logging.getLogger(__name__)

ENV_DIR = "BASIS_LAB_CHECKPOINTS"
_FINAL = "basis_lab_final"
_FORMAT = "basis_lab_format"  # custom step metadata: 2 = written with checksums (absent: before them)
_CHECKSUMMED = 2
_SUMS = "basis_lab_sha256"  # meta key: {array path: SHA-256 hex, "meta": digest of the rest}
_TMP_SUFFIX = ocp.path.atomicity_types.TMP_DIR_SUFFIX
_EPOCH_DIR = re.compile(r"epoch-(\d+)")


# What orbax and tensorstore raise for a directory, file or step they cannot read or write:
# the OS's errors, tensorstore's failed statuses and orbax's refusals (ValueError), a tree or
# metadata that does not match (KeyError, TypeError), a failed asynchronous save or XLA
# transfer (RuntimeError).
_ORBAX_ERRORS = (OSError, ValueError, KeyError, TypeError, RuntimeError)


def _orbax_error(error: BaseException) -> bool:
    """Whether ``error`` is one of orbax's I/O failures: :data:`_ORBAX_ERRORS`, or the bare
    ``Exception`` orbax raises for an array tensorstore cannot read or write (a deleted or
    truncated file: "Encountered error while reading array index")."""
    return isinstance(error, _ORBAX_ERRORS) or type(error) is Exception


class CheckpointError(UserError, ValueError):
    """A checkpoint cannot be written or read; the message names the fix."""


class CheckpointDiskFull(CheckpointError):
    """A checkpoint cannot be written because the disk (or the user's quota) under ``path``
    is full; nothing of it was kept."""

    def __init__(self, message: str, path: Path):
        super().__init__(message)
        self.path = path


def _disk_full(error: BaseException | None) -> bool:
    """Whether ``error`` (or what caused it) says the disk or the quota is full."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if any(s in str(error) for s in ("No space left on device", "Disk quota exceeded", "ENOSPC")):
            return True
        error = error.__cause__ or error.__context__
    return False


def run_dir(root: str | os.PathLike, run: int | str) -> Path:
    """The checkpoint directory of run ``run`` (its id or uid) under ``root``."""
    name = str(run)
    if not name or "/" in name or "\\" in name or name in (".", ".."):
        raise CheckpointError(f"run {run!r} is not a run id or uid: fix by passing the run's id")
    return Path(root) / f"run-{name}"


class _FinalSteps:
    """Orbax preservation policy: keep the checkpoints whose steps are in ``steps``."""

    def __init__(self, steps: set[int]):
        self.steps = steps

    def should_preserve(self, checkpoints: Sequence[Any], *, context: Any) -> Sequence[bool]:
        return [c.step in self.steps for c in checkpoints]


class _Damaged(BasisLabError, ValueError):
    """A restored array or the metadata does not match the checksum saved with it."""


def array_checksums(state) -> dict[str, str]:
    """``{path: SHA-256 hex}`` of the bytes of every array leaf of ``state`` (as the host
    holds them: C order, the array's own dtype). An array sharded over several
    processes (``jax.distributed``) is gathered whole first, so every process hashes
    the same bytes; that gather is collective, as ``save`` and ``restore`` are."""
    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
        if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
            leaf = multihost_utils.process_allgather(leaf, tiled=True)
        data = np.ascontiguousarray(np.asarray(leaf))
        out[jax.tree_util.keystr(path)] = hashlib.sha256(data.reshape(-1).view(np.uint8).data).hexdigest()
    return out


def _meta_digest(extra: dict) -> str:
    return hashlib.sha256(json.dumps(extra, sort_keys=True, allow_nan=False).encode()).hexdigest()


def _verify(state, extra: dict, sums: dict | None, *, checksummed: bool) -> None:
    """Raise ``_Damaged`` unless ``state``'s arrays and ``extra`` hash to ``sums``.
    ``sums`` None is taken as it is only for a checkpoint of the older format
    (``checksummed`` False): for one of the current format the record was lost."""
    if sums is None:
        if checksummed:
            raise _Damaged(f"its checksum record ({_SUMS}) is missing")
        return
    if not isinstance(sums, dict):
        raise _Damaged(f"its checksum record ({_SUMS}) is not a mapping")
    if sums.get("meta") != _meta_digest(extra):
        raise _Damaged("its metadata does not match its checksum")
    got = array_checksums(state)
    for path in sorted(set(got) | (set(sums) - {"meta"})):
        if got.get(path) != sums.get(path):
            raise _Damaged(f"array {path} does not match its checksum")


def _open_manager(directory: Path, policy=None) -> ocp.CheckpointManager:
    with _orbax_quiet():
        return _new_manager(directory, policy)


def _new_manager(directory: Path, policy) -> ocp.CheckpointManager:
    return ocp.CheckpointManager(
        directory,
        item_handlers={"state": ocp.StandardCheckpointHandler(), "meta": ocp.JsonCheckpointHandler()},
        options=ocp.CheckpointManagerOptions(enable_async_checkpointing=False, preservation_policy=policy,
                                             create=False),
    )


class RunCheckpoints:
    """The checkpoints of one run in ``directory``: the newest ``keep`` plus the
    final one. One instance per run; instances of different runs may save from
    different threads at once, and one instance serialises its own calls.

    ``epoch`` is the lease of the owner that writes: saves go to
    ``directory/epoch-<epoch>`` (None: into ``directory`` itself, for tools and
    benchmarks that own their folder). Reads see every epoch.

    ``borrowed`` are other directories of the same run, the nearest first: those the
    databases this one was copied from keep (``engine.runner.paths.RunFolders``). They
    are read (for one step, ``directory``'s checkpoint first, then the nearest) but never
    written, pruned or deleted: ``checkpoints()`` and retention see ``directory`` alone.

    A run's owner opens them as it trusts them: ``resume_limit`` bounds what a resume sees
    (``latest_step``, ``restore_latest_valid``: steps at or before it; the runner passes the
    newest step its database records, -1 when it records none), ``guard(step)`` is called
    before every save and may raise to refuse it (the runner: its lease is gone,
    ``storage.LeaseLostError``), and ``on_saved(step)`` after every complete save (the
    runner records the step). The followers of a multi-host run open them alike, so
    every process makes the same (collective) calls."""

    def __init__(self, directory: str | os.PathLike, *, keep: int, name: str | None = None,
                 epoch: int | None = None, borrowed: Sequence[str | os.PathLike] = (),
                 resume_limit: int | None = None, guard: Callable[[int], None] | None = None,
                 on_saved: Callable[[int], None] | None = None):
        if not checks.is_whole(keep, 1):
            raise CheckpointError(f"keep must be an integer >= 1 (got {keep!r}): fix by keeping at least one")
        if epoch is not None and not checks.is_whole(epoch, 0):
            raise CheckpointError(f"epoch must be an integer >= 0 (got {epoch!r}): fix the caller")
        self.directory = Path(directory).expanduser().absolute()
        self.borrowed = [Path(b).expanduser().absolute() for b in borrowed]
        self.keep = keep
        self.epoch = epoch
        self.resume_limit, self.guard, self.on_saved = resume_limit, guard, on_saved
        self.name = name or self.directory.name
        self.write_dir = self.directory if epoch is None else self.directory / f"epoch-{epoch}"
        self._lock = threading.RLock()
        self._final = _FinalSteps(set())
        self._cleaned = False
        self._readers: dict[Path, ocp.CheckpointManager] = {}
        try:
            self._manager = _open_manager(
                self.write_dir,
                checkpoint_managers.AnyPreservationPolicy([checkpoint_managers.LatestN(keep), self._final]),
            )
            self._readers[self.write_dir] = self._manager
            for step in self._manager.all_steps():
                if self._step_is_final(step):
                    self._final.steps.add(step)
        except _ORBAX_ERRORS as e:  # an unreadable directory
            raise CheckpointError(
                f"cannot open the checkpoints of {self.name} at {self.directory} ({_brief(e)}): "
                f"fix the path or its permissions, or set {ENV_DIR}"
            ) from None
        if epoch is not None:
            self._remove_unfinished_saves()
            self._cleaned = True

    def _step_is_final(self, step: int) -> bool:
        try:
            with _orbax_quiet():
                return bool((self._manager.metadata(step).custom_metadata or {}).get(_FINAL))
        except _ORBAX_ERRORS:  # unreadable metadata: such a checkpoint is not protected
            return False

    # ------------------------------------------------------------------ where they are

    def _folders(self) -> list[tuple[int, Path]]:
        """``(epoch, folder)`` of every folder of ``directory`` that may hold steps, oldest
        epoch first; the run folder itself (checkpoints from before epochs) counts as epoch -1."""
        found = _epoch_folders(self.directory)
        if self.epoch is not None and all(e != self.epoch for e, _ in found):
            found.append((self.epoch, self.write_dir))
        return sorted(found)

    def _reader(self, folder: Path) -> ocp.CheckpointManager:
        manager = self._readers.get(folder)
        if manager is None:
            manager = self._readers[folder] = _open_manager(folder)
        return manager

    def checkpoints(self) -> list[tuple[int, int]]:
        """``(step, epoch)`` of every complete checkpoint in ``directory``, oldest first
        (epoch -1: saved before epochs; for one step, older epochs first)."""
        with self._lock:
            return sorted((step, epoch) for step, epoch, _ in self._list(self._folders()))

    def located(self) -> list[tuple[int, int, Path]]:
        """``(step, epoch, folder of the step)`` of every complete checkpoint, ``directory``'s
        and the borrowed ones, by step; of one step, the one a restore takes last."""
        with self._lock:
            return [(step, epoch, folder / str(step)) for step, _, epoch, folder in self._everything()]

    def _everything(self) -> list[tuple[int, int, int, Path]]:
        """``(step, rank, epoch, folder)`` of every complete checkpoint, of ``directory``
        (rank 0) and the borrowed ones (rank -1 the nearest, -2 the next…), so that sorted,
        the last of a step is the one a restore takes."""
        out = [(step, 0, epoch, folder) for step, epoch, folder in self._list(self._folders())]
        for i, other in enumerate(self.borrowed):
            out += [(step, -1 - i, epoch, folder) for step, epoch, folder in self._list(_epoch_folders(other))]
        return sorted(out)

    def _list(self, folders: list[tuple[int, Path]]) -> list[tuple[int, int, Path]]:
        out = []
        for epoch, folder in folders:
            try:
                with _orbax_quiet():
                    manager = self._reader(folder)
                    manager.reload()
                    out += [(int(step), epoch, folder) for step in manager.all_steps()]
            except _ORBAX_ERRORS as e:  # an unreadable folder of another epoch is skipped, not fatal
                log.warning("checkpoints of %s in %s are unreadable (%s); skipping them", self.name, folder,
                            _brief(e))
        return out

    def _folder_of(self, epoch: int) -> Path:
        return self.directory if epoch < 0 else self.directory / f"epoch-{epoch}"

    # ------------------------------------------------------------------ writing

    def save(self, step: int, state, extra: dict, *, final: bool = False) -> None:
        """Write ``state`` (a pytree of arrays) and ``extra`` (a JSON dict) as the
        checkpoint of ``step``, with the checksums of both, replacing one already there;
        returns once it is complete on disk, so the caller may donate ``state``'s
        buffers afterwards. ``final=True`` marks the run's last step, which is then
        always kept. ``guard`` may refuse it first; ``on_saved`` hears of it after."""
        if self.guard is not None:
            self.guard(step)
        self._write(step, state, extra, final=final)
        if self.on_saved is not None:
            self.on_saved(step)

    def _write(self, step: int, state, extra: dict, *, final: bool) -> None:
        if not isinstance(extra, dict):
            raise CheckpointError(f"checkpoint metadata must be a dict (got {type(extra).__name__}): fix the caller")
        try:
            meta = dict(extra)
            meta[_SUMS] = {**array_checksums(state), "meta": _meta_digest(extra)}
        except (TypeError, ValueError) as e:
            raise CheckpointError(
                f"checkpoint metadata at step {step} of {self.name} is not JSON ({_brief(e)}): "
                "fix by passing plain dicts, lists, strings and finite numbers"
            ) from None
        with self._lock:
            try:
                self.write_dir.mkdir(parents=True, exist_ok=True)
                if not self._cleaned:
                    self._remove_unfinished_saves()
                    self._cleaned = True
                if step in self._manager.all_steps():
                    self._final.steps.discard(step)
                    self._manager.delete(step)
                if final:
                    self._final.steps.add(step)
                self._manager.save(
                    step,
                    args=ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)),
                    custom_metadata={_FINAL: bool(final), _FORMAT: _CHECKSUMMED},
                    force=True,
                )
                self._manager.wait_until_finished()
            except Exception as e:  # a full or read-only disk
                if not _orbax_error(e):
                    raise  # a bug of ours, with its traceback
                self._final.steps.discard(step)
                self._remove_unfinished_saves(step)
                if _disk_full(e):
                    raise CheckpointDiskFull(
                        f"cannot write the checkpoint at step {step} of {self.name} to {self.write_dir}: the disk is "
                        f"full ({_brief(e)})", self.write_dir) from None
                raise CheckpointError(
                    f"cannot write the checkpoint at step {step} of {self.name} to {self.write_dir} "
                    f"({_brief(e)}): fix that path, its permissions or the disk space, or set {ENV_DIR}"
                ) from None
            if self.epoch is not None:
                self._prune_older_epochs(self.epoch)

    def _prune_older_epochs(self, current: int) -> None:
        """Delete the checkpoints of older epochs that are not among the newest ``keep``
        of all (by step, then epoch), and the older epoch folders left without any.
        Every process calls it (listing opens orbax managers, which is collective under
        ``jax.distributed``); process 0 alone deletes."""
        everything = self.checkpoints()
        kept = set(sorted(everything, reverse=True)[: self.keep])
        gone = {(step, epoch) for step, epoch in everything if epoch < current and (step, epoch) not in kept}
        leader = jax.process_index() == 0
        if leader:
            for step, epoch in gone:
                shutil.rmtree(self._folder_of(epoch) / str(step), ignore_errors=True)
        left = {e for s, e in everything if (s, e) not in gone}
        for epoch, folder in self._folders():
            if 0 <= epoch < current and epoch not in left:
                self._readers.pop(folder, None)
                if leader:
                    shutil.rmtree(folder, ignore_errors=True)

    def _remove_unfinished_saves(self, step: int | None = None) -> None:
        """Delete the temporary directories of saves that never finished (a killed
        process, a full disk): of ``step`` in this epoch's folder (a save of this writer
        that just failed), else of every step there and in the folders of older epochs,
        whose owners lost their lease to this one. Done by the writer only (when the
        owner of a lease opens, at a first save, when a save fails), so opening a run to
        read never removes another process's save in progress."""
        if jax.process_index() != 0:  # under jax.distributed the leader alone tidies the shared directory
            return
        if step is not None or self.epoch is None:
            folders = [self.write_dir]
        else:
            folders = [folder for epoch, folder in self._folders() if epoch <= self.epoch]
        for folder in folders:
            for path in folder.glob(f"*{_TMP_SUFFIX}*" if step is None else f"{step}{_TMP_SUFFIX}*"):
                shutil.rmtree(path, ignore_errors=True)

    # ------------------------------------------------------------------ reading

    def steps(self) -> list[int]:
        """The steps of the complete checkpoints on disk (of any epoch, borrowed ones
        included), oldest first."""
        with self._lock:
            return sorted({step for step, _, _, _ in self._everything()})

    def latest_step(self) -> int | None:
        """The newest step a resume may take (at most ``resume_limit``), None when none."""
        steps = [s for s in self.steps() if self.resume_limit is None or s <= self.resume_limit]
        return steps[-1] if steps else None

    def restore(self, target_state, step: int | None = None, *, epoch: int | None = None):
        """``(state, extra)`` of the checkpoint at ``step`` (default the newest; of the
        newest epoch holding it unless ``epoch`` is given), with the structure, dtypes,
        shapes and shardings of ``target_state`` (a freshly initialised state of the
        same run), after checking every array against its saved checksum."""
        with self._lock:
            saved = self._everything()
            steps = sorted({s for s, _, _, _ in saved})
            if step is None:
                if not steps:
                    raise CheckpointError(
                        f"{self.name} has no checkpoint in {self.directory}: fix by starting it from step 0"
                    )
                step = steps[-1]
            holders = [(e, f) for s, rank, e, f in saved if s == step and (epoch is None or (rank, e) == (0, epoch))]
            if not holders:
                raise CheckpointError(
                    f"{self.name} has no checkpoint at step {step} (saved: {steps or 'none'}): "
                    "fix by choosing a saved step"
                )
            return self._restore(target_state, step, *holders[-1])

    def _restore(self, target_state, step: int, epoch: int, folder: Path):
        manager = self._reader(folder)
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, target_state)
        try:
            with _orbax_quiet():
                checksummed = epoch >= 0 or _declared_format(manager, step) is not None
                self._check_matches(manager, step, target_state)
                restored = manager.restore(
                    step,
                    args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()),
                )
            state, extra = restored.state, restored.meta
            _check_like(state, target_state)
            if not isinstance(extra, dict):
                raise ValueError(f"metadata is {type(extra).__name__}, not a JSON object")
            extra = dict(extra)
            _verify(state, {k: v for k, v in extra.items() if k != _SUMS}, extra.pop(_SUMS, None),
                    checksummed=checksummed)
        except _Damaged as e:
            raise CheckpointError(
                f"checkpoint at step {step} of {self.name} is damaged ({e}): fix by deleting {folder / str(step)} "
                "(a resume takes the next older checkpoint)"
            ) from None
        except Exception as e:
            if not _orbax_error(e):
                raise  # a bug of ours, with its traceback
            raise CheckpointError(
                f"checkpoint at step {step} of {self.name} is unreadable or not of this run's model "
                f"({_brief(e)}): fix by deleting {folder / str(step)} (a resume takes the next older checkpoint)"
            ) from None
        return state, extra

    @staticmethod
    def _check_matches(manager: ocp.CheckpointManager, step: int, target_state) -> None:
        """Raise ValueError unless the arrays stored at ``step`` have the paths,
        shapes and dtypes of ``target_state``'s (read from orbax's metadata,
        before any array is read)."""
        metadata = manager.item_metadata(step)["state"]
        if metadata is None:  # orbax reads a deleted _METADATA file as no metadata
            raise ValueError("its array metadata is missing")
        stored = _leaf_types(metadata.tree)
        wanted = _leaf_types(ocp.tree.serialize_tree(target_state, keep_empty_nodes=True))
        if stored != wanted:
            path = min(set(stored) ^ set(wanted) or {p for p in wanted if stored[p] != wanted[p]})
            raise ValueError(f"{path} is {stored.get(path, 'absent')} there, {wanted.get(path, 'absent')} here")

    def restore_latest_valid(self, target_state, *, max_step: int | None = None) -> tuple[int, Any, dict, list[str]]:
        """``(step, state, extra, skipped)`` of the newest checkpoint (of any epoch; at
        most ``max_step``, by default ``resume_limit``) that is readable and matches its
        checksums; ``skipped`` holds one message per newer one that was not, each also logged
        as one warning line. Raises ``CheckpointError`` when there is none."""
        max_step = self.resume_limit if max_step is None else max_step
        skipped: list[str] = []
        with self._lock:
            for step, _, epoch, folder in reversed(self._everything()):
                if max_step is not None and step > max_step:
                    continue
                try:
                    state, extra = self._restore(target_state, step, epoch, folder)
                except CheckpointError as e:
                    log.warning("%s; trying the next older checkpoint", e)
                    skipped.append(str(e))
                    continue
                return step, state, extra, skipped
        if skipped:
            raise CheckpointError(
                f"no checkpoint of {self.name} is readable ({len(skipped)} tried; newest: {skipped[0]})"
            )
        below = "" if max_step is None else f" at or before step {max_step}"
        raise CheckpointError(
            f"{self.name} has no checkpoint{below} in {self.directory}: fix by starting it from step 0"
        )

    def delete_all(self) -> None:
        """Delete every checkpoint of the run and its directory."""
        with self._lock:
            self.close()
            shutil.rmtree(self.directory, ignore_errors=True)
            if self.directory.exists():
                raise CheckpointError(
                    f"cannot delete {self.directory}: fix its permissions and delete it by hand"
                )

    def close(self) -> None:
        with self._lock:
            for manager in self._readers.values():
                manager.close()
            self._readers = {}

    def __enter__(self) -> RunCheckpoints:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _epoch_folders(directory: Path) -> list[tuple[int, Path]]:
    """``(epoch, folder)`` of ``directory`` itself (epoch -1: from before epochs) and of
    each ``epoch-<E>`` folder in it, oldest first."""
    found = [(-1, directory)]
    try:
        entries = list(directory.iterdir())
    except OSError:
        entries = []
    for p in entries:
        m = _EPOCH_DIR.fullmatch(p.name)
        if m and p.is_dir():
            found.append((int(m.group(1)), p))
    return sorted(found)


def _declared_format(manager: ocp.CheckpointManager, step: int):
    """The format the checkpoint at ``step`` declares in orbax's step metadata (None:
    none, as before checksums; also when that metadata is unreadable)."""
    try:
        return (manager.metadata(step).custom_metadata or {}).get(_FORMAT)
    except _ORBAX_ERRORS:  # a missing or damaged step metadata declares nothing
        return None


class _Held(logging.Filter):
    """Keeps the records of the loggers it is put on (orbax logs through absl's) while
    a checkpoint is read, and passes them on at DEBUG: a damaged checkpoint is reported
    as one line of ours, not as orbax's tracebacks and warnings."""

    def __init__(self):
        super().__init__()
        self.depth = 0
        self.lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if self.depth <= 0 or record.levelno >= logging.CRITICAL:
            return True
        log.debug("orbax while reading a checkpoint: %s", (record.getMessage().splitlines() or [""])[0])
        return False


_HELD = _Held()
_QUIET_LOGGERS = ("absl", "orbax", "tensorstore")


def _orbax_leftover(unraisable) -> bool:
    """Whether an unraisable exception is what orbax leaves behind when reading a damaged
    checkpoint fails: its other reads still in flight, as coroutines dropped unfinished
    or as tensorstore callbacks into the event loop it has closed."""
    if isinstance(unraisable.exc_value, RuntimeError) and str(unraisable.exc_value) == "Event loop is closed":
        return True
    code = getattr(unraisable.object, "cr_code", None)
    return code is not None and f"{os.sep}orbax{os.sep}" in code.co_filename


def _hold_orbax_leftovers() -> None:
    """Install (once) a ``sys.unraisablehook`` that logs ``_orbax_leftover`` exceptions at
    DEBUG instead of printing their tracebacks (a hundred lines or more, after the read
    has already failed and been reported); any other goes to the hook it replaces."""
    previous = sys.unraisablehook
    if getattr(previous, "_basis_lab", False):
        return

    def hook(unraisable) -> None:
        if _orbax_leftover(unraisable):
            log.debug("orbax after a failed checkpoint read: %s", _brief(unraisable.exc_value))
        else:
            previous(unraisable)

    setattr(hook, "_basis_lab", True)  # a function attribute: the mark of our hook
    sys.unraisablehook = hook


class _orbax_quiet:
    """Context manager: orbax's log records are held back (see ``_Held``) inside it, and
    what its failed reads leave behind is never printed (``_hold_orbax_leftovers``)."""

    def __enter__(self):
        _hold_orbax_leftovers()
        with _HELD.lock:
            if _HELD.depth == 0:
                for name in _QUIET_LOGGERS:
                    logging.getLogger(name).addFilter(_HELD)
            _HELD.depth += 1

    def __exit__(self, *exc):
        with _HELD.lock:
            _HELD.depth -= 1
            if _HELD.depth == 0:
                for name in _QUIET_LOGGERS:
                    logging.getLogger(name).removeFilter(_HELD)


def _check_like(state, target) -> None:
    """Raise ValueError unless ``state`` has ``target``'s tree, shapes and dtypes."""
    got, want = jax.tree.structure(state), jax.tree.structure(target)
    if got != want:  # type: ignore[operator]  # jaxlib's stubs leave PyTreeDef unresolved
        raise ValueError(f"tree {got} differs from the run's {want}")
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(target)):
        if a.shape != b.shape or a.dtype != b.dtype:
            raise ValueError(f"array {a.dtype}{list(a.shape)} where the run has {b.dtype}{list(b.shape)}")


def _leaf_types(tree) -> dict[str, str]:
    """``{path: "float32[3, 4]"}`` of every array leaf of ``tree``."""
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {jax.tree_util.keystr(p): f"{x.dtype}{list(x.shape)}" for p, x in leaves}


def _brief(error: BaseException) -> str:
    """The first line of ``error``'s message, at most 160 characters."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    text = f"{type(error).__name__}: {text}" if text else type(error).__name__
    return text if len(text) <= 160 else text[:157] + "..."
