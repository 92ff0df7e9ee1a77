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
checkpoints in ``run_dir(root, run) = root / "run-<run>"``, one sub-directory per
saved step::

    <root>/run-12/300/state/...     parameters, optimizer state, step (orbax StandardSave)
    <root>/run-12/300/meta/...      JSON metadata (sampler state, loss window, config, ...)

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
The first ``save`` of a ``RunCheckpoints`` deletes such leftovers; reading never does.

Retention
---------
The newest ``keep`` checkpoints are kept, plus every checkpoint saved with
``final=True`` (the run's last step), which later saves never delete.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from pathlib import Path
from typing import Any, Sequence

import jax
import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers

from engine.core import checks

ENV_DIR = "BASIS_LAB_CHECKPOINTS"
_FINAL = "basis_lab_final"
_TMP_SUFFIX = ocp.path.atomicity_types.TMP_DIR_SUFFIX


class CheckpointError(ValueError):
    """A checkpoint cannot be written or read; the message names the fix."""


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


class RunCheckpoints:
    """The checkpoints of one run in ``directory``: the newest ``keep`` plus the
    final one. One instance per run; instances of different runs may save from
    different threads at once, and one instance serialises its own calls."""

    def __init__(self, directory: str | os.PathLike, *, keep: int, name: str | None = None):
        if not checks.is_whole(keep, 1):
            raise CheckpointError(f"keep must be an integer >= 1 (got {keep!r}): fix by keeping at least one")
        self.directory = Path(directory).expanduser().absolute()
        self.keep = keep
        self.name = name or self.directory.name
        self._lock = threading.RLock()
        self._final = _FinalSteps(set())
        self._cleaned = False
        try:
            self._manager = ocp.CheckpointManager(
                self.directory,
                item_handlers={"state": ocp.StandardCheckpointHandler(), "meta": ocp.JsonCheckpointHandler()},
                options=ocp.CheckpointManagerOptions(
                    enable_async_checkpointing=False,
                    preservation_policy=checkpoint_managers.AnyPreservationPolicy(
                        [checkpoint_managers.LatestN(keep), self._final]
                    ),
                    create=False,
                ),
            )
            for step in self._manager.all_steps():
                if self._step_is_final(step):
                    self._final.steps.add(step)
        except Exception as e:  # orbax raises many types for an unreadable directory
            raise CheckpointError(
                f"cannot open the checkpoints of {self.name} at {self.directory} ({_brief(e)}): "
                f"fix the path or its permissions, or set {ENV_DIR}"
            ) from None

    def _step_is_final(self, step: int) -> bool:
        try:
            return bool((self._manager.metadata(step).custom_metadata or {}).get(_FINAL))
        except Exception:  # unreadable metadata: such a checkpoint is not protected
            return False

    def save(self, step: int, state, extra: dict, *, final: bool = False) -> None:
        """Write ``state`` (a pytree of arrays) and ``extra`` (a JSON dict) as the
        checkpoint of ``step``, replacing one already there; returns once it is
        complete on disk, so the caller may donate ``state``'s buffers afterwards.
        ``final=True`` marks the run's last step, which is then always kept."""
        if not isinstance(extra, dict):
            raise CheckpointError(f"checkpoint metadata must be a dict (got {type(extra).__name__}): fix the caller")
        try:
            json.dumps(extra, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise CheckpointError(
                f"checkpoint metadata at step {step} of {self.name} is not JSON ({_brief(e)}): "
                "fix by passing plain dicts, lists, strings and finite numbers"
            ) from None
        with self._lock:
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
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
                    args=ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(extra)),
                    custom_metadata={_FINAL: bool(final)},
                    force=True,
                )
                self._manager.wait_until_finished()
            except Exception as e:  # orbax/tensorstore raise many types for a full or read-only disk
                self._final.steps.discard(step)
                raise CheckpointError(
                    f"cannot write the checkpoint at step {step} of {self.name} to {self.directory} "
                    f"({_brief(e)}): fix that path, its permissions or the disk space, or set {ENV_DIR}"
                ) from None

    def _remove_unfinished_saves(self) -> None:
        """Delete the temporary directories of saves that never finished (a killed
        process). Done by the writer at its first save only, so opening a run to
        read never removes another process's save in progress."""
        if jax.process_index() != 0:  # under jax.distributed the leader alone tidies the shared directory
            return
        for path in self.directory.glob(f"*{_TMP_SUFFIX}*"):
            shutil.rmtree(path)

    def steps(self) -> list[int]:
        """The steps of the complete checkpoints on disk, oldest first."""
        with self._lock:
            self._manager.reload()
            return sorted(self._manager.all_steps())

    def latest_step(self) -> int | None:
        steps = self.steps()
        return steps[-1] if steps else None

    def restore(self, target_state, step: int | None = None):
        """``(state, extra)`` of the checkpoint at ``step`` (default the newest),
        with the structure, dtypes, shapes and shardings of ``target_state`` (a
        freshly initialised state of the same run)."""
        with self._lock:
            steps = self.steps()
            if step is None:
                if not steps:
                    raise CheckpointError(
                        f"{self.name} has no checkpoint in {self.directory}: fix by starting it from step 0"
                    )
                step = steps[-1]
            elif step not in steps:
                raise CheckpointError(
                    f"{self.name} has no checkpoint at step {step} (saved: {steps or 'none'}): "
                    "fix by choosing a saved step"
                )
            abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, target_state)
            try:
                self._check_matches(step, target_state)
                restored = self._manager.restore(
                    step,
                    args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()),
                )
                state, extra = restored.state, restored.meta
                _check_like(state, target_state)
                if not isinstance(extra, dict):
                    raise ValueError(f"metadata is {type(extra).__name__}, not a JSON object")
            except Exception as e:  # orbax/tensorstore raise many types for damaged files
                raise CheckpointError(
                    f"checkpoint at step {step} of {self.name} is unreadable or not of this run's model "
                    f"({_brief(e)}): fix by deleting {self.directory / str(step)}, or resume from step 0 "
                    "with --from-scratch"
                ) from None
            return state, extra

    def _check_matches(self, step: int, target_state) -> None:
        """Raise ValueError unless the arrays stored at ``step`` have the paths,
        shapes and dtypes of ``target_state``'s (read from orbax's metadata,
        before any array is read)."""
        stored = _leaf_types(self._manager.item_metadata(step)["state"].tree)
        wanted = _leaf_types(ocp.tree.serialize_tree(target_state, keep_empty_nodes=True))
        if stored != wanted:
            path = min(set(stored) ^ set(wanted) or {p for p in wanted if stored[p] != wanted[p]})
            raise ValueError(f"{path} is {stored.get(path, 'absent')} there, {wanted.get(path, 'absent')} here")

    def restore_latest_valid(self, target_state) -> tuple[int, Any, dict, list[str]]:
        """``(step, state, extra, skipped)`` of the newest readable checkpoint;
        ``skipped`` holds one message per newer checkpoint that was unreadable.
        Raises ``CheckpointError`` when there is none."""
        skipped: list[str] = []
        for step in reversed(self.steps()):
            try:
                state, extra = self.restore(target_state, step)
            except CheckpointError as e:
                skipped.append(str(e))
                continue
            return step, state, extra, skipped
        if skipped:
            raise CheckpointError(
                f"no checkpoint of {self.name} is readable ({len(skipped)} tried; newest: {skipped[0]})"
            )
        raise CheckpointError(f"{self.name} has no checkpoint in {self.directory}: fix by starting it from step 0")

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
            self._manager.close()

    def __enter__(self) -> RunCheckpoints:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _check_like(state, target) -> None:
    """Raise ValueError unless ``state`` has ``target``'s tree, shapes and dtypes."""
    got, want = jax.tree.structure(state), jax.tree.structure(target)
    if got != want:
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
