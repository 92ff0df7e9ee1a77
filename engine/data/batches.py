"""Batches of token windows: ``BatchSampler`` for training, ``validation_batches`` for the fixed validation set.

``BatchSampler`` draws training windows at random offsets from a seeded NumPy
generator; ``validation_batches`` is the fixed validation set. Every bad input
raises ``DataError`` whose message names the problem and the fix.
"""

from __future__ import annotations

import numpy as np

from engine.data.errors import DataError, whole


def _windows(tokens: np.ndarray, starts: np.ndarray, seq_len: int) -> np.ndarray:
    """int32 rows ``tokens[s : s + seq_len + 1]`` for each start ``s``."""
    return np.asarray(tokens[starts[:, None] + np.arange(seq_len + 1)], dtype=np.int32)


class BatchSampler:
    """Training batches: int32 ``(batch_size, seq_len + 1)`` windows of ``tokens``
    at uniformly random offsets (inputs ``[:, :-1]``, targets ``[:, 1:]``).

    Offsets come only from ``np.random.default_rng(seed)``, so for the same
    tokens, shape and seed every method sees the same batch sequence.
    """

    def __init__(self, tokens: np.ndarray, batch_size: int, seq_len: int, seed: int):
        batch_size, seq_len = whole("batch_size", batch_size), whole("seq_len", seq_len)
        if len(tokens) < seq_len + 1:
            raise DataError(
                f"the training split has {len(tokens):,} tokens, fewer than one window of seq_len + 1 = "
                f"{seq_len + 1}: fix by lowering seq_len or using a larger corpus"
            )
        self.tokens = tokens
        self.batch_size = batch_size
        self.seq_len = seq_len
        self._rng = np.random.default_rng(seed)

    def next(self) -> np.ndarray:
        """The next batch of the seeded sequence."""
        starts = self._rng.integers(0, len(self.tokens) - self.seq_len, size=self.batch_size)
        return _windows(self.tokens, starts, self.seq_len)

    __next__ = next

    def __iter__(self) -> BatchSampler:
        return self

    def state(self) -> dict:
        """A JSON-serialisable snapshot: the generator's ``bit_generator.state``
        and the shape it draws for. ``set_state`` of it makes this or a fresh
        sampler of the same tokens and shape yield exactly the batches this one
        yields next."""
        return {
            "rng": self._rng.bit_generator.state,
            "batch_size": self.batch_size,
            "seq_len": self.seq_len,
            "n_tokens": len(self.tokens),
        }

    def set_state(self, state: dict) -> None:
        """Continue from ``state`` (from ``state()``); a snapshot of another shape,
        corpus length or generator is a DataError and changes nothing."""
        mine = {"batch_size": self.batch_size, "seq_len": self.seq_len, "n_tokens": len(self.tokens)}
        if not isinstance(state, dict) or not isinstance(state.get("rng"), dict):
            raise DataError(f"sampler state {state!r:.80} is not a BatchSampler.state() dict: fix by passing one")
        theirs = {k: state.get(k) for k in mine}
        if theirs != mine:
            raise DataError(
                f"sampler state is for {theirs}, this sampler is {mine}: fix by resuming with the run's own "
                "dataset, batch_size and seq_len"
            )
        rng = np.random.default_rng()
        try:
            rng.bit_generator.state = state["rng"]
        except (TypeError, ValueError, KeyError) as e:
            raise DataError(
                f"sampler state holds no valid {type(rng.bit_generator).__name__} state ({e}): "
                "fix by passing a BatchSampler.state() dict"
            ) from None
        self._rng = rng


def validation_batches(tokens: np.ndarray, batch_size: int, seq_len: int, n_batches: int) -> np.ndarray:
    """The fixed validation set: int32 ``(n_batches, batch_size, seq_len + 1)``.

    Its ``n_batches * batch_size`` windows are non-overlapping and evenly
    spaced over the whole split, the same on every call (no randomness).
    """
    batch_size, seq_len = whole("batch_size", batch_size), whole("seq_len", seq_len)
    n_batches = whole("n_batches", n_batches)
    n_windows = n_batches * batch_size
    stride = len(tokens) // n_windows
    if stride < seq_len + 1:
        raise DataError(
            f"the validation split has {len(tokens):,} tokens, fewer than the {n_windows * (seq_len + 1):,} "
            f"that {n_batches} batch(es) of {batch_size} x {seq_len + 1} need: fix by raising val_tokens or "
            "lowering n_batches, batch_size or seq_len"
        )
    starts = np.arange(n_windows) * stride
    return _windows(tokens, starts, seq_len).reshape(n_batches, batch_size, seq_len + 1)
