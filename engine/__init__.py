"""BASIS Lab engine: the sketched layer, the GPT, data, training, jobs, reads and the CLI.

Packages by concern, each importing only those below it (``lint-imports`` checks this,
with the contracts in pyproject.toml, in ``make test``):

    cli > runner > reads > analysis > training > model | data > sketch > config > core

``model`` and ``data`` are independent siblings. ``sketch`` sits above ``config`` only in
the order: neither imports the other. Only ``cli``, ``runner``, ``reads`` and ``api`` touch
``storage``; ``config`` and ``core`` load no JAX or Flax. No package imports ``app``.

Where a change goes, package by package (each ``__init__`` says more):

- ``core``: plain-Python foundations every layer shares: value checks, the names of choices,
  presets, paired statistics, units, the estimator family as data (``core.estimators``).
- ``config``: the run schema; a new run field, sweep axis or config rule.
- ``sketch``: the sketch math in JAX (sketched matmul, fused head, attention); a new sketch
  family or a change to a backward pass.
- ``model`` / ``data``: the Flax GPT and memory accounting / tokenizer, corpora, token cache
  and batches.
- ``training``: one run trained in this process: steps, loop, schedule, checkpoints, timing,
  devices and parallelism; nothing of the database.
- ``analysis``: pure functions of records and frames: diagnoses, Table 3, charts, claims,
  reports as documents; a new statistic, figure or claim.
- ``reads``: what the CLI, the API and the pages read from the database (summaries, Table 3,
  reports, campaigns, estimates); a new query or report selection.
- ``runner``: work against the database: queueing, jobs, workers, liveness, the write queue,
  campaigns advanced, diagnoses run, exports; a change to how runs are claimed or kept alive.
- ``cli``: ``python -m engine``, one module per command (``cli.commands``); a new command or
  flag. ``api``: ``engine.api.Lab``, the same operations from Python.
"""

import os

# On a GPU, JAX would otherwise take 75 % of its memory for the first run: several
# runs could not share the device and peak-memory figures would mean nothing.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
