"""Random draws of the hash and Gaussian sketches S ∈ R^{R×B}.

A sketch is a pure function of its key: ``draw_sketch(key, kind, B, R)`` (a PRNG key,
fresh each step) gives the same S in the forward and the backward pass, on every
backend. Hash sketches have S[r, b] = s(b)·[h(b) = r] with Rademacher signs s:

- balanced: h(b) = π(b) mod R for a uniform random permutation π of [0, B), so every bin
  holds ⌊B/R⌋ or ⌈B/R⌉ rows;
- uniform: h(b) ~ U{0..R−1} iid;

and Gaussian sketches have iid N(0, 1/R) entries. The numbers are those of ``jax.random``
(``split`` into a hash and a sign key, ``bits`` for the order of π, ``rademacher`` for s,
``randint`` for a uniform h, ``normal``); for the default key (Threefry-2x32, counters
that JAX can partition) the bits and signs are computed here by ``threefry_bits``, the
same Threefry-2x32 function written out round by round. JAX itself runs Threefry on a CPU
as a rolled loop of five iterations, each a few dozen tiny operations, once per call; the
written-out rounds are one elementwise pass that XLA fuses into one loop.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_PARITY = np.uint32(0x1BD11BDA)


class Sketch(NamedTuple):
    """Everything that defines S ∈ R^{R×B}; rebuilt from the key in the backward pass."""

    kind: str  # "balanced", "uniform" or "gaussian"
    rank: int
    bins: jax.Array | None  # hash sketches: h(b) ∈ [0, R)
    signs: jax.Array | None  # hash sketches: s(b) ∈ {−1, +1}
    dense: jax.Array | None  # gaussian: S itself, entries N(0, 1/R)
    # balanced: the rows in bin order, ⌈B/R⌉·R slots; slot k·R + r holds the k-th row
    # of bin r, or B (no row) where bin r has only ⌊B/R⌋ rows
    members: jax.Array | None = None

    def hashed(self) -> tuple[jax.Array, jax.Array]:
        """(bins, signs) of a hash sketch (balanced or uniform)."""
        if self.bins is None or self.signs is None:
            raise ValueError(f"a {self.kind} sketch has no bins")
        return self.bins, self.signs

    def matrix(self) -> jax.Array:
        """S itself, of a gaussian sketch."""
        if self.dense is None:
            raise ValueError(f"a {self.kind} sketch is not dense")
        return self.dense


def threefry2x32(k0: jax.Array, k1: jax.Array, x0: jax.Array, x1: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Threefry-2x32 with 20 rounds (Salmon et al., SC 2011), uint32 in and out:
    key (k0, k1), counter words (x0, x1) of any one shape. Key schedule
    ks = (k0, k1, k0 ⊕ k1 ⊕ 0x1BD11BDA); a round is x0 += x1, x1 = rotl(x1, r) ⊕ x0;
    after every four rounds (i = 1..5) x0 += ks[i mod 3], x1 += ks[(i + 1) mod 3] + i.
    Equal to ``jax.extend.random.threefry_2x32`` bit for bit (tested)."""
    ks = (k0, k1, k0 ^ k1 ^ _PARITY)
    x0, x1 = x0 + ks[0], x1 + ks[1]
    for i in range(1, 6):
        for r in _ROTATIONS[(i - 1) % 2]:
            x0 = x0 + x1
            x1 = ((x1 << np.uint32(r)) | (x1 >> np.uint32(32 - r))) ^ x0
        x0 = x0 + ks[i % 3]
        x1 = x1 + ks[(i + 1) % 3] + np.uint32(i)
    return x0, x1


def _written_out(key: jax.Array) -> bool:
    """Whether ``threefry_bits`` reproduces ``jax.random`` for this key: a typed
    Threefry-2x32 key with partitionable counters (JAX's default)."""
    typed = jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
    return typed and str(jax.random.key_impl(key)) == "threefry2x32" and bool(getattr(jax.config, "jax_threefry_partitionable"))


def threefry_bits(key: jax.Array, n: int) -> tuple[jax.Array, jax.Array]:
    """The two Threefry words (uint32, shape (n,)) of counters (0, i), i < n, under ``key``:
    ``jax.random.bits(key, (n,))`` is their xor, and for n = 2 the i-th pair is the
    i-th key of ``jax.random.split(key)``."""
    k0, k1 = jax.random.key_data(key)
    return threefry2x32(k0, k1, jnp.zeros(n, jnp.uint32), jnp.arange(n, dtype=jnp.uint32))


def _split(key: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``jax.random.split(key)``: (hash key, sign key)."""
    if not _written_out(key):
        k_hash, k_sign = jax.random.split(key)
        return k_hash, k_sign
    w0, w1 = threefry_bits(key, 2)
    impl = jax.random.key_impl(key)
    wrap = lambda i: jax.random.wrap_key_data(jnp.stack([w0[i], w1[i]]), impl=impl)
    return wrap(0), wrap(1)


def _bits_and_signs(k_hash: jax.Array, k_sign: jax.Array, shape: tuple[int, ...]) -> tuple[jax.Array, jax.Array]:
    """(``jax.random.bits(k_hash, shape)``, ``jax.random.rademacher(k_sign, shape)`` as
    float32): a sign is +1 when the top bit of its 32 random bits is 0 (a uniform in
    [0, 1) made of the top 23 bits is below ½)."""
    if not _written_out(k_sign):
        bits = jax.random.bits(k_hash, shape, jnp.uint32)
        return bits, jax.random.rademacher(k_sign, shape, jnp.float32)
    n = math.prod(shape)
    bits = jnp.bitwise_xor(*threefry_bits(k_hash, n)).reshape(shape)
    sign_bits = jnp.bitwise_xor(*threefry_bits(k_sign, n)).reshape(shape)
    return bits, jnp.where(sign_bits >> np.uint32(31) == 0, 1.0, -1.0).astype(jnp.float32)


def draw_sketch(key: jax.Array, kind: str, rows: int, rank: int, layer: int = 0, layers: int = 1) -> Sketch:
    """Draw S for ``rows`` = B input rows and ``rank`` = R ≤ B bins.

    Balanced: h(b) = π(b) mod R for a uniform random permutation π of [0, B), so bin r
    holds the rows π⁻¹(r), π⁻¹(r + R), …: ``members`` lists π⁻¹ padded with B (no row)
    to ⌈B/R⌉·R slots. Uniform: h(b) ~ U{0..R−1} iid. Balanced and uniform sketches of
    one key share their signs.

    ``layers`` = L > 1 (hash sketches): the sketches of L layers with the same B and R
    are drawn together from one key, their bits and signs as one (L, B) array and their
    permutations by one sort along B, and this is layer ``layer``'s. Each layer's S has
    the law of a draw from its own key, independently of the others; for L = 1 it is
    that draw. Inside one jit the L layers' calls are the same computation on the same
    key, which XLA computes once (common-subexpression elimination): one draw per step
    instead of one per layer.
    """
    if not 0 <= layer < layers:
        raise ValueError(f"layer {layer} is not one of the {layers} layers drawn together")
    k_hash, k_sign = _split(key)
    if kind == "gaussian":
        dense = jax.random.normal(k_hash, (rank, rows), jnp.float32) / math.sqrt(rank)
        return Sketch(kind, rank, None, None, dense)
    bits, signs = _bits_and_signs(k_hash, k_sign, (layers, rows))
    if kind == "uniform":
        bins = jax.random.randint(k_hash, (layers, rows), 0, rank, dtype=jnp.int32)
        return Sketch(kind, rank, bins[layer], signs[layer], None)
    # argsort of iid 32-bit keys is a uniform permutation (one sort, where
    # jax.random.permutation does two); a tie (chance ≈ B²/2³³) only keeps two
    # rows in order, and bins stay balanced whatever the order
    order = _argsort(bits)[layer]
    slots = -(-rows // rank) * rank
    members = jnp.full(slots, rows, jnp.int32).at[order].set(jnp.arange(rows, dtype=jnp.int32), unique_indices=True)
    return Sketch(kind, rank, order % rank, signs[layer], None, members)


def hashings_agree(rank: int) -> bool:
    """Whether balanced and uniform hashing draw S from the same distribution at ``rank``:
    at R = 1 both put every row in the one bin (h ≡ 0) with the same signs. At R ≥ 2
    (and B ≥ 2) they differ: uniform hashing can put all rows in one bin, balanced never."""
    return int(rank) == 1


def _argsort(keys: jax.Array) -> jax.Array:
    """``jnp.argsort(keys, axis=-1)`` (stable, as int32) of keys of shape (..., n).

    The keys alone are sorted, each key's rank found by binary search, and the order
    is the inverse of the ranks: 0.25 ms against 0.70 ms for the key-and-index sort of
    ``jnp.argsort`` at 4096 keys on the 2-core CPU. Tied keys (in any row) share a rank,
    so then ``jnp.argsort`` itself runs. Off the CPU ``jnp.argsort`` always runs: a GPU
    sorts key-index pairs in one radix sort, and a ``lax.cond`` there waits for its
    predicate.
    """
    if jax.default_backend() != "cpu":
        return jnp.argsort(keys, axis=-1, stable=True).astype(jnp.int32)
    n = keys.shape[-1]
    flat = keys.reshape(-1, n)
    ordered = jnp.sort(flat, axis=-1)

    def invert_ranks(flat):
        rank = jax.vmap(jnp.searchsorted)(ordered, flat).astype(jnp.int32)
        index = jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), flat.shape)
        row = jnp.arange(flat.shape[0], dtype=jnp.int32)[:, None]
        return jnp.zeros(flat.shape, jnp.int32).at[row, rank].set(index, unique_indices=True)

    tie = jnp.any(ordered[:, 1:] == ordered[:, :-1])
    stable = lambda k: jnp.argsort(k, axis=-1, stable=True).astype(jnp.int32)
    return jax.lax.cond(tie, stable, invert_ranks, flat).reshape(keys.shape)
