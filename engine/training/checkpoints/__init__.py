"""Checkpoints of training runs, written with orbax-checkpoint: where they live (``folders``), what
one holds and how it is trusted (``integrity``), a run's checkpoints written, read and pruned
(``run_checkpoints``), orbax kept quiet (``quiet``) and the errors (``errors``). A change to what
a checkpoint holds or when one is trusted goes here; when one is taken is the training schedule's.

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
warnings) is kept out of the output and logged at DEBUG: the failure is one line. What it
logs while a save fails (a full disk: a traceback from each of its writer threads) is kept
out of the output too and carried by the error (``CheckpointError.details``), for the run's
log.

Retention
---------
The newest ``keep`` checkpoints are kept, plus every checkpoint saved with
``final=True`` (the run's last step), which later saves never delete. A writer of
epoch E also deletes the checkpoints of older epochs that are not among the newest
``keep`` of all, then the older epoch folders left empty.

The modules
-----------
``run_checkpoints`` (``RunCheckpoints``: save, list, prune, restore), ``folders`` (where
they live: ``run_dir``, epoch folders, the orbax manager of a folder), ``integrity`` (the
checksums and the checks of a restored tree), ``errors`` (``CheckpointError`` and how
orbax's failures read) and ``quiet`` (orbax's log kept out of a failed read's or save's one line).
"""

from engine.training.checkpoints.errors import CheckpointDiskFull, CheckpointError
from engine.training.checkpoints.folders import ENV_DIR, run_dir
from engine.training.checkpoints.integrity import array_checksums
from engine.training.checkpoints.run_checkpoints import RunCheckpoints

__all__ = ["CheckpointDiskFull", "CheckpointError", "ENV_DIR", "RunCheckpoints", "array_checksums", "run_dir"]
