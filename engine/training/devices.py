"""Where a run's arrays live: the device layout the training loop asks, never branches on.

``device_layout(config)`` is ``SingleDevice()`` for one device in one process, where
every method does nothing (an array goes where JAX puts it, a host flag is its own
agreement), and ``Sharded`` over a ``parallel.Layout`` otherwise (the batch's rows split
over the mesh, decisions taken by process 0: ``engine.training.parallel``). Both answer
the same questions, so ``engine.training.loop.train`` reads the same on one device and
on many.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from engine.config import RunConfig
from engine.core.presets import GPTConfig
from engine.training import parallel
from engine.training.steps import make_eval_step, make_train_step


class SingleDevice:
    """One device in one process: the plain steps of ``engine.training.steps``; any block
    size (``train``'s ``max_block``) may run as one compiled block."""

    def put_batch(self, batch: np.ndarray) -> jax.Array:
        return jnp.asarray(batch)

    def put_key(self, key: jax.Array) -> jax.Array:
        return key

    def put_state(self, state):
        return state

    def put_val(self, val: np.ndarray) -> jax.Array:
        return jnp.asarray(val)

    def local_rows(self, batch: np.ndarray) -> np.ndarray:
        return batch

    def local_devices(self) -> list:
        """The devices of this process the run trains on (what its system metrics read)."""
        return jax.local_devices()[:1]

    def agree(self, flag: bool) -> bool:
        return flag

    def block_limit(self, max_block: int) -> int:
        return max_block

    def train_step(self, cfg: GPTConfig, optimizer, state, dw_comm: str) -> jax.stages.Wrapped:
        return _train_step(cfg, optimizer)

    def eval_step(self, cfg: GPTConfig) -> Callable:
        return _eval_step(cfg)

    def probe_inputs(self, batch: np.ndarray, key: jax.Array) -> tuple[jax.Array, jax.Array]:
        """The batch and sketch key the dW probe of a step reads: the step's own."""
        return jnp.asarray(batch), key


@dataclass(frozen=True)
class Sharded:
    """A run over ``layout``'s mesh: batches split by rows, keys and validation batches
    placed on it, host decisions broadcast from process 0 (``parallel.agree``); every step
    is a block of one (the sharded step runs step by step)."""

    layout: parallel.Layout

    def put_batch(self, batch: np.ndarray) -> jax.Array:
        return self.layout.put(batch, self.layout.rows())

    def put_key(self, key: jax.Array) -> jax.Array:
        return self.layout.put_key(key)

    def put_state(self, state):
        return self.layout.put_state(state)

    def put_val(self, val: np.ndarray) -> jax.Array:
        return self.layout.put(val, self.layout.rows(1))

    def local_devices(self) -> list:
        return list(self.layout.mesh.local_devices)

    def local_rows(self, batch: np.ndarray) -> np.ndarray:
        """Device 0's share of a host batch: the rows its memory figures and probe see."""
        return self.layout.local_rows_of(batch)

    def agree(self, flag: bool) -> bool:
        """Process 0's ``flag`` on every process: they stop and checkpoint at the same steps."""
        return parallel.agree(flag)

    def block_limit(self, max_block: int) -> int:
        return 1

    def train_step(self, cfg: GPTConfig, optimizer, state, dw_comm: str) -> jax.stages.Wrapped:
        return parallel.make_train_step(cfg, optimizer, self.layout, state, dw_comm)

    def eval_step(self, cfg: GPTConfig) -> Callable:
        return parallel.make_eval_step(cfg, self.layout)

    def probe_inputs(self, batch: np.ndarray, key: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Device 0's rows and sketch key (the step's key folded with 0), as its step draws them."""
        rows = self.layout.put(self.local_rows(batch), self.layout.replicated)
        return rows, jax.random.wrap_key_data(self.layout.put_key(jax.random.fold_in(key, 0)))


# One jitted step per model and optimizer in a process (``make_optimizer`` gives one
# object per setting): the next run of a sweep, or a resume, traces and lowers nothing again.
_train_step = functools.lru_cache(maxsize=16)(make_train_step)
_eval_step = functools.lru_cache(maxsize=16)(make_eval_step)

DeviceLayout = SingleDevice | Sharded


def device_layout(config: RunConfig) -> DeviceLayout:
    """``SingleDevice()`` for one device in one process, else ``Sharded`` over the run's mesh
    (a ``ConfigError`` naming the fix when the devices do not fit: ``parallel.device_count``)."""
    layout = parallel.make_layout(config)
    return SingleDevice() if layout is None else Sharded(layout)
