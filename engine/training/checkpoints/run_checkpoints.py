"""``RunCheckpoints``: the checkpoints of one run, written, listed, pruned and restored
(``engine.training.checkpoints`` says where they live, what they hold and how they are kept)."""

from __future__ import annotations

import logging
import os
import shutil
import threading
from pathlib import Path
from typing import Any, Callable, Sequence

import jax
import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers

from engine.core import checks
from engine.training.checkpoints.errors import (
    ORBAX_ERRORS,
    CheckpointDiskFull,
    CheckpointError,
    brief,
    disk_full,
    orbax_error,
)
from engine.training.checkpoints.folders import ENV_DIR, TMP_SUFFIX, epoch_folders, open_manager
from engine.training.checkpoints.integrity import (
    CHECKSUMMED,
    FORMAT,
    SUMS,
    Damaged,
    array_checksums,
    check_like,
    declared_format,
    leaf_types,
    meta_digest,
    verify,
)
from engine.training.checkpoints.quiet import details, orbax_held, orbax_quiet

log = logging.getLogger("engine.training.checkpoints")  # one logger for the package, as before its split
_FINAL = "basis_lab_final"


class _FinalSteps:
    """Orbax preservation policy: keep the checkpoints whose steps are in ``steps``."""

    def __init__(self, steps: set[int]):
        self.steps = steps

    def should_preserve(self, checkpoints: Sequence[Any], *, context: Any) -> Sequence[bool]:
        return [c.step in self.steps for c in checkpoints]


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
            self._manager = open_manager(
                self.write_dir,
                checkpoint_managers.AnyPreservationPolicy([checkpoint_managers.LatestN(keep), self._final]),
            )
            self._readers[self.write_dir] = self._manager
            for step in self._manager.all_steps():
                if self._step_is_final(step):
                    self._final.steps.add(step)
        except ORBAX_ERRORS as e:  # an unreadable directory
            raise CheckpointError(
                f"cannot open the checkpoints of {self.name} at {self.directory} ({brief(e)}): "
                f"fix the path or its permissions, or set {ENV_DIR}"
            ) from None
        if epoch is not None:
            self._remove_unfinished_saves()
            self._cleaned = True

    def _step_is_final(self, step: int) -> bool:
        try:
            with orbax_quiet():
                return bool((self._manager.metadata(step).custom_metadata or {}).get(_FINAL))
        except ORBAX_ERRORS:  # unreadable metadata: such a checkpoint is not protected
            return False

    # ------------------------------------------------------------------ where they are

    def _folders(self) -> list[tuple[int, Path]]:
        """``(epoch, folder)`` of every folder of ``directory`` that may hold steps, oldest
        epoch first; the run folder itself (checkpoints from before epochs) counts as epoch -1."""
        found = epoch_folders(self.directory)
        if self.epoch is not None and all(e != self.epoch for e, _ in found):
            found.append((self.epoch, self.write_dir))
        return sorted(found)

    def _reader(self, folder: Path) -> ocp.CheckpointManager:
        manager = self._readers.get(folder)
        if manager is None:
            manager = self._readers[folder] = open_manager(folder)
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
            out += [(step, -1 - i, epoch, folder) for step, epoch, folder in self._list(epoch_folders(other))]
        return sorted(out)

    def _list(self, folders: list[tuple[int, Path]]) -> list[tuple[int, int, Path]]:
        out = []
        for epoch, folder in folders:
            try:
                with orbax_quiet():
                    manager = self._reader(folder)
                    manager.reload()
                    out += [(int(step), epoch, folder) for step in manager.all_steps()]
            except ORBAX_ERRORS as e:  # an unreadable folder of another epoch is skipped, not fatal
                log.warning("checkpoints of %s in %s are unreadable (%s); skipping them", self.name, folder,
                            brief(e))
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
            meta[SUMS] = {**array_checksums(state), "meta": meta_digest(extra)}
        except (TypeError, ValueError) as e:
            raise CheckpointError(
                f"checkpoint metadata at step {step} of {self.name} is not JSON ({brief(e)}): "
                "fix by passing plain dicts, lists, strings and finite numbers"
            ) from None
        held: list[logging.LogRecord] = []  # what orbax logs while it saves: the run's log's if the save fails
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
                with orbax_held(held):
                    self._manager.save(
                        step,
                        args=ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)),
                        custom_metadata={_FINAL: bool(final), FORMAT: CHECKSUMMED},
                        force=True,
                    )
                    self._manager.wait_until_finished()
            except Exception as e:  # a full or read-only disk
                if not orbax_error(e):
                    raise  # a bug of ours, with its traceback
                self._final.steps.discard(step)
                self._remove_unfinished_saves(step)
                if disk_full(e):
                    raise CheckpointDiskFull(
                        f"cannot write the checkpoint at step {step} of {self.name} to {self.write_dir}: the disk is "
                        f"full ({brief(e)})", self.write_dir, details(held)) from None
                error = CheckpointError(
                    f"cannot write the checkpoint at step {step} of {self.name} to {self.write_dir} "
                    f"({brief(e)}): fix that path, its permissions or the disk space, or set {ENV_DIR}")
                error.details = details(held)
                raise error from None
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
            for path in folder.glob(f"*{TMP_SUFFIX}*" if step is None else f"{step}{TMP_SUFFIX}*"):
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
            with orbax_quiet():
                checksummed = epoch >= 0 or declared_format(manager, step) is not None
                self._check_matches(manager, step, target_state)
                restored = manager.restore(
                    step,
                    args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()),
                )
            state, extra = restored.state, restored.meta
            check_like(state, target_state)
            if not isinstance(extra, dict):
                raise ValueError(f"metadata is {type(extra).__name__}, not a JSON object")
            extra = dict(extra)
            verify(state, {k: v for k, v in extra.items() if k != SUMS}, extra.pop(SUMS, None),
                    checksummed=checksummed)
        except Damaged as e:
            raise CheckpointError(
                f"checkpoint at step {step} of {self.name} is damaged ({e}): fix by deleting {folder / str(step)} "
                "(a resume takes the next older checkpoint)"
            ) from None
        except Exception as e:
            if not orbax_error(e):
                raise  # a bug of ours, with its traceback
            raise CheckpointError(
                f"checkpoint at step {step} of {self.name} is unreadable or not of this run's model "
                f"({brief(e)}): fix by deleting {folder / str(step)} (a resume takes the next older checkpoint)"
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
        stored = leaf_types(metadata.tree)
        wanted = leaf_types(ocp.tree.serialize_tree(target_state, keep_empty_nodes=True))
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
