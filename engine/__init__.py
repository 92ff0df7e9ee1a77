"""BASIS Lab engine: the sketched layer, the GPT, data, training, jobs and CLI.

Packages by concern, each importing only those below it (``lint-imports`` checks this,
with the contracts in pyproject.toml, in ``make test``):

    cli > runner > analysis > training > model | data > sketch > config > core

``model`` and ``data`` are independent siblings. ``sketch`` sits above ``config`` only in
the order: neither imports the other. Only ``runner`` and ``cli`` touch ``storage``;
``config`` and ``core`` load no JAX or Flax. No package imports ``app``.
"""

import os

# On a GPU, JAX would otherwise take 75 % of its memory for the first run: several
# runs could not share the device and peak-memory figures would mean nothing.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
