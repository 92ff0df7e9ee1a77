"""Python's cyclic collector in a process that is a CLI command training here.

``main`` (for ``main_exit``: ``python -m engine`` and the ``basis-lab`` script) calls
``freeze_when_training`` for a command that trains in its own process; the command calls
``training_starts`` just before it trains (``train_here``, ``worker``). Then, and only then,
``gc.freeze`` takes what the process has imported by that point (JAX, Flax, optax, orbax, the
runner: ~2,000 modules, 230,000 objects that live as long as the process) out of the
collector's reach, so that its full passes, frequent while JAX traces a step, no longer
traverse them (0.2–0.3 CPU s of a 10-step paper-preset run; ``bench/startup.py``).

Not before the flags are checked (a refused flag answers without importing JAX), not for a
command that only reads (``tune --list``), and never in any other process: a frozen object is
never collected, which a long-lived server's own objects (the dashboard's, its sessions') and
a script calling the Python API must be. The import-time garbage frozen with them stays for
the process's life (a ``gc.collect`` first would cost a full pass, most of the gain).
"""

from __future__ import annotations

import gc

_when_training = False


def freeze_when_training() -> None:
    """This process is the CLI command and trains here: ``training_starts`` freezes."""
    global _when_training
    _when_training = True


def training_starts() -> None:
    """The command is about to train: ``gc.freeze`` in a process ``freeze_when_training`` named."""
    if _when_training:
        gc.freeze()
