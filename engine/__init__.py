"""BASIS Lab engine: the sketched layer, the GPT, data, training, jobs and CLI."""

import os

# On a GPU, JAX would otherwise take 75 % of its memory for the first run: several
# runs could not share the device and peak-memory figures would mean nothing.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
