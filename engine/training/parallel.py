"""One run on several devices and hosts: data parallelism over a ``jax.sharding.Mesh``.

The batch's B sequences are split over the D devices of the mesh axis ``DATA``
(B/D each, ``NamedSharding(mesh, P(DATA))``). The loss and its gradient run inside
``shard_map``: device d computes the mean loss ℓ_d of its own B/D·T rows, and every
sketched layer sketches only those rows, with the step's key folded with the device
index (``fold_in(key, axis_index(DATA))``), so no row ever leaves its device and every
device draws its own S_d. As the shards are equal, the run's loss and gradient are

    ℓ = (1/D) Σ_d ℓ_d,        ∇ℓ = (1/D) Σ_d ∇ℓ_d,

each ∇ℓ_d summed by a ``psum`` (an all-reduce), except, with ``dw_comm="sketch"``, the
kernels of the sketched layers, whose backward pass all-gathered every device's R-row
sketches and already holds Σ_d X̂_dᵀ dŶ_d (``engine.sketch.basis.gathers``). Hence:
``exact`` on D devices is the 1-device step of the same global batch (up to float
summation order); an unbiased estimator stays unbiased (a sum of unbiased per-device
estimates); a sketch is exact once R ≥ B/D·T, the rows on each device.

The optimizer update runs on ∇ℓ outside ``shard_map``, on replicated state or, with
``shard_params``, on parameters and optimizer state sharded over the mesh (FSDP-style:
each array split along its largest dimension that D divides, ``fsdp_spec``; XLA gathers
the parameters for the step, and every device stores 1/D of the state between steps).

Several hosts join through ``jax.distributed`` (``engine.runner.hosts``); then the mesh
spans the devices of every process, every process feeds the same global batch (same seed,
same sampler) with ``jax.make_array_from_callback``, and host-side decisions (stop,
checkpoint) are taken by process 0 and broadcast (``agree``).

One device in one process never comes here: ``engine.training.steps`` runs as it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import jax
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from engine.config import ConfigError, RunConfig
from engine.config.run import check_devices
from engine.core.presets import GPTConfig
from engine.model.gpt import loss_fn
from engine.sketch.basis import gathers
from engine.training.steps import TrainState

DATA = "data"  # the mesh axis the batch's sequences are split along


def device_count(config: RunConfig) -> int:
    """The devices ``config`` spans: ``devices``, or every device JAX sees for 0; a
    ``ConfigError`` naming the fix when there are not that many or they do not divide
    the batch."""
    available = jax.device_count()
    n = config.devices or available
    if n > available:
        raise ConfigError(
            f"devices {n} but JAX sees {available} ({jax.devices()[0].platform}): fix by setting --devices to at "
            f"most {available}, or 0 for all of them"
        )
    if jax.process_count() > 1 and n != available:
        raise ConfigError(
            f"devices {n} but the {jax.process_count()} processes joined by jax.distributed hold {available}: "
            "a run spans every one of them; fix by setting --devices 0"
        )
    check_devices(config.effective_batch_size, n)
    return n


def fsdp_spec(shape: tuple[int, ...], devices: int) -> P:
    """P with ``DATA`` on the largest dimension that ``devices`` divides (the first of
    equals), else replicated: how ``shard_params`` splits one array."""
    best = None
    for axis, size in enumerate(shape):
        if size % devices == 0 and size >= devices and (best is None or size > shape[best]):
            best = axis
    if best is None:
        return P()
    return P(*([None] * best + [DATA]))


@dataclass(frozen=True)
class Layout:
    """The mesh of a run on several devices and where each of its arrays lives."""

    mesh: Mesh
    shard_params: bool = False

    @property
    def size(self) -> int:
        return self.mesh.size

    @property
    def replicated(self) -> NamedSharding:
        return NamedSharding(self.mesh, P())

    def rows(self, leading: int = 0) -> NamedSharding:
        """Sequences split over the devices, along axis ``leading`` of the array."""
        return NamedSharding(self.mesh, P(*([None] * leading + [DATA])))

    def state_shardings(self, state):
        """Replicated, or with ``shard_params`` every array by ``fsdp_spec``."""
        if not self.shard_params:
            return jax.tree.map(lambda _: self.replicated, state)
        return jax.tree.map(lambda a: NamedSharding(self.mesh, fsdp_spec(np.shape(a), self.size)), state)

    def put(self, value, sharding: NamedSharding) -> jax.Array:
        """A global array from a host value every process holds whole (same seed)."""
        value = np.asarray(value)
        return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])

    def put_state(self, state):
        return jax.tree.map(self.put, state, self.state_shardings(state))

    def put_key(self, key: jax.Array) -> jax.Array:
        """A sketch key as replicated raw key data (``train_step`` wraps it again)."""
        return self.put(jax.random.key_data(key), self.replicated)

    def local_rows_of(self, batch: np.ndarray) -> np.ndarray:
        """Device 0's share of a host batch: the rows its memory figures and probe see."""
        return batch[: batch.shape[0] // self.size]


def make_layout(config: RunConfig) -> Layout | None:
    """The run's ``Layout``, or None for one device in one process (the plain path)."""
    n = device_count(config)
    if n == 1 and jax.process_count() == 1:
        return None
    return Layout(Mesh(np.array(jax.devices()[:n]), (DATA,)), shard_params=config.shard_params)


def gathered_kernels(cfg: GPTConfig, params) -> object:
    """A tree like ``params``: True at the kernels whose dW the backward pass
    all-gathers (``cfg.gather_axis`` set, a gathering estimator, a sketched layer)."""
    paths = set(cfg.sketched_kernel_paths()) if cfg.gather_axis and gathers(cfg.estimator) else set()

    def mark(path, _):
        names = tuple(getattr(k, "key", getattr(k, "name", None)) for k in path)
        return names[-1] == "kernel" and names[:-1] in paths

    return jax.tree_util.tree_map_with_path(mark, params)


def device_key(key_data: jax.Array) -> jax.Array:
    """Inside ``shard_map``: this device's sketch key, the step's key folded with its index."""
    return jax.random.fold_in(jax.random.wrap_key_data(key_data), jax.lax.axis_index(DATA))


def local_loss_and_grads(cfg: GPTConfig, size: int) -> Callable:
    """The body of ``shard_map``: ``(params, rows, key data) -> (ℓ, ∇ℓ)`` on one device,
    its key folded with its index, every gradient summed over ``DATA`` and divided by
    D, the all-gathered kernels (already sums) only divided."""

    def body(params, batch, key_data):
        key = device_key(key_data)
        loss, grads = jax.value_and_grad(lambda p: loss_fn(cfg, p, batch, key))(params)
        summed = gathered_kernels(cfg, params)
        grads = jax.tree.map(lambda g, done: (g if done else jax.lax.psum(g, DATA)) / size, grads, summed)
        return jax.lax.pmean(loss, DATA), grads

    return body


def make_train_step(
    cfg: GPTConfig, optimizer: optax.GradientTransformation, layout: Layout, state: TrainState, dw_comm: str
) -> jax.stages.Wrapped:
    """``step(state, batch, key data) -> (state, loss)`` over ``layout``'s mesh, jitted,
    state donated, laid out as ``layout.state_shardings(state)``."""
    if dw_comm == "sketch":
        cfg = cfg.replace(gather_axis=DATA)
    grads_of = jax.shard_map(
        local_loss_and_grads(cfg, layout.size), mesh=layout.mesh,
        in_specs=(P(), P(DATA), P()), out_specs=(P(), P()), check_vma=False,
    )
    shardings = layout.state_shardings(state)

    def step(state: TrainState, batch: jax.Array, key_data: jax.Array):
        loss, grads = grads_of(state.params, batch, key_data)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        return TrainState(params, opt_state, state.step + 1), loss

    return jax.jit(
        step, donate_argnums=0, in_shardings=(shardings, layout.rows(), layout.replicated),
        out_shardings=(shardings, layout.replicated),
    )


def make_eval_step(cfg: GPTConfig, layout: Layout) -> Callable:
    """``engine.training.steps.make_eval_step`` over the mesh: batches (n, B, T+1) split
    along B; each batch's loss is the mean of the devices' means (equal shards), and the
    n losses come back replicated."""
    exact = cfg.replace(estimator="exact")

    def local(params, batches):
        losses = jax.lax.map(lambda b: loss_fn(exact, params, b, None), batches)
        return jax.lax.pmean(losses, DATA)

    losses_of = jax.shard_map(local, mesh=layout.mesh, in_specs=(P(), P(None, DATA)), out_specs=P(),
                              check_vma=False)
    return jax.jit(losses_of, out_shardings=layout.replicated)


def agree(flag: bool) -> bool:
    """Process 0's ``flag`` on every process (a broadcast); ``flag`` itself in one process.
    Host-side choices that change what the processes run (stop, checkpoint) go through it."""
    if jax.process_count() == 1:
        return bool(flag)
    from jax.experimental import multihost_utils

    return bool(multihost_utils.broadcast_one_to_all(np.asarray(bool(flag))))
