"""The token cache: each source tokenized once per host, split by document, on disk.

``load_split`` tokenizes a source once with GPT-2's BPE and splits its D documents,
of lengths n_d, into three disjoint sets of whole documents by one permutation π of
0..D-1 drawn from ``default_rng(split_seed)``, with prefix sums S_k = Σ_{j<k} n_π(j):

- ``val``: π(0..v-1), v the least k with S_k >= ``val_tokens``;
- ``test``: π(v..v+t-1), t the least k with S_{v+k} − S_v >= ``test_tokens``
  (none when ``test_tokens`` is 0: the layout of versions before the test split,
  whose train and val are exactly what they were);
- ``train``: every other document (at least one, else a ``DataError``).

It joins each split's documents with ``<|endoftext|>`` and caches each split as a
uint16 ``.npy`` file, written atomically and memory-mapped on every load. A split
depends only on the corpus, ``val_tokens``, ``test_tokens`` and ``split_seed``: the
same tokens for every run, seed and machine. The cache key covers the source, its
options (and the size and mtime of local files), the split settings and the
tokenizer's hash (``test_tokens`` only when it is > 0, so a cache written before the
test split keeps its name and is reused).

One process builds a cache at a time: the build holds a file lock (``filelock``) named
after the cache key, so a second process (or thread) on the host waits for it and
then memory-maps what the first wrote instead of tokenizing the corpus again. The
operating system drops the lock of a process that dies, so a crashed build blocks
nothing; its half-written files were never renamed into place.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from pathlib import Path

import numpy as np
from filelock import FileLock

from engine.data.errors import DataError, whole
from engine.data.sources import Source, resolve
from engine.data.tokenizer import EOT, TOKENIZER_HASH, tokenize

SPLITS = ("train", "val", "test")
CACHE_ENV = "BASIS_LAB_CACHE"
DEFAULT_CACHE_DIR = "~/.cache/basis-lab"
# Bump when cleaning, splitting or the file layout changes, so old caches are not trusted.
_CACHE_FORMAT = 1


def _split_masks(lengths: np.ndarray, val_tokens: int, test_tokens: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(is_val, is_test) of the documents: validation is the shortest prefix of a
    ``default_rng(seed)`` permutation of the documents holding ``>= val_tokens``
    tokens, test the shortest run of it right after that prefix holding
    ``>= test_tokens`` (no document when ``test_tokens`` is 0). At least one
    document always stays for training."""
    order = np.random.default_rng(seed).permutation(len(lengths))
    held = np.cumsum(lengths[order])
    n_val = int(np.searchsorted(held, val_tokens)) + 1
    n_test = 0
    if test_tokens and n_val < len(lengths):
        n_test = int(np.searchsorted(held[n_val:] - held[n_val - 1], test_tokens)) + 1
    if n_val + n_test >= len(lengths):
        test = f" and test_tokens={test_tokens:,}" if test_tokens else ""
        raise DataError(
            f"the corpus has {int(lengths.sum()):,} tokens in {len(lengths)} document(s), too few to hold "
            f"out val_tokens={val_tokens:,}{test} and keep a training split: fix by lowering val_tokens"
            f"{' or test_tokens' if test_tokens else ''} or adding documents"
        )
    is_val, is_test = np.zeros(len(lengths), dtype=bool), np.zeros(len(lengths), dtype=bool)
    is_val[order[:n_val]] = True
    is_test[order[n_val:n_val + n_test]] = True
    return is_val, is_test


def _join(documents: list[np.ndarray]) -> np.ndarray:
    """``documents`` joined by ``<|endoftext|>``: d0 EOT d1 EOT ... d_last."""
    separator = np.array([EOT], dtype=np.uint16)
    parts = [part for doc in documents for part in (separator, doc)][1:]
    return np.concatenate(parts)


def _cache_root(cache_dir: str | os.PathLike | None) -> Path:
    return Path(cache_dir or os.environ.get(CACHE_ENV) or DEFAULT_CACHE_DIR).expanduser()


def _cache_name(source: Source, val_tokens: int, test_tokens: int, split_seed: int) -> str:
    """``source-digest``: the cache's files are ``name-train.npy``, ``name-val.npy``,
    ``name-test.npy`` (when ``test_tokens`` > 0) and the build lock ``.name.lock``; the
    digest covers everything the tokens depend on (``test_tokens`` only when > 0: the
    names of the caches written before the test split)."""
    identity = {
        "format": _CACHE_FORMAT,
        "tokenizer": TOKENIZER_HASH,
        "source": source.name,
        "key": source.key,
        "val_tokens": val_tokens,
        "split_seed": split_seed,
    }
    if test_tokens:
        identity["test_tokens"] = test_tokens
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
    return f"{source.name}-{digest}"


def _write_atomic(path: Path, array: np.ndarray) -> None:
    """Write ``array`` as ``.npy`` at ``path`` so that ``path`` either does not
    exist or holds the whole array: write a temp file, fsync, rename."""
    temp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        with temp.open("wb") as f:
            np.save(f, array)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
    finally:
        temp.unlink(missing_ok=True)


def _build(source: Source, val_tokens: int, test_tokens: int, split_seed: int, paths: dict[str, Path],
           root: Path) -> None:
    """Tokenize ``source``, split it by document and write the cache of each split of ``paths``
    (``train`` last: a cache whose train file exists holds every split)."""
    documents = tokenize(source.documents(root / "huggingface"), source.name)
    if not documents:
        raise DataError(f"{source.description} holds no text: fix by pointing it at non-empty documents")
    lengths = np.array([len(d) for d in documents])
    is_val, is_test = _split_masks(lengths, val_tokens, test_tokens, split_seed)
    root.mkdir(parents=True, exist_ok=True)
    for split, keep in (("val", is_val), ("test", is_test), ("train", ~(is_val | is_test))):
        if split in paths:
            _write_atomic(paths[split], _join([d for d, k in zip(documents, keep) if k]))


def load_split(
    source: str,
    split: str,
    *,
    val_tokens: int = 65536,
    test_tokens: int | None = None,
    split_seed: int = 0,
    cache_dir: str | os.PathLike | None = None,
    **source_options,
) -> np.ndarray:
    """GPT-2 tokens (uint16, read-only memmap) of the ``train``, ``val`` or ``test`` split of ``source``.

    Whole documents are held out (the module's split): ``val`` holds at least
    ``val_tokens`` tokens and ``test`` at least ``test_tokens`` (None: as many as
    ``val_tokens``; 0: no test split, and train and val exactly as before the test
    split), from documents chosen by ``split_seed``, and no document is in two
    splits. Documents keep the source's order within a split and are joined by
    ``<|endoftext|>`` (50256). The first call for a (source, options, val_tokens,
    test_tokens, split_seed) tokenizes the source and caches every split under
    ``cache_dir`` (default ``$BASIS_LAB_CACHE`` or ``~/.cache/basis-lab``); later
    calls only memory-map the cache.

    ``source_options``: fineweb-edu takes ``max_documents`` (default 20,000) and
    ``data_files`` (a local path, glob or list instead of the Hub); files takes
    ``path`` (required), ``text_field`` (default ``"text"``, for .jsonl/.parquet)
    and ``sample_by`` (``"line"``, ``"paragraph"`` (default) or ``"document"``, for .txt).
    """
    if split not in SPLITS:
        raise DataError(f"unknown split {split!r}: fix by choosing 'train', 'val' or 'test'")
    val_tokens = whole("val_tokens", val_tokens)
    test_tokens = val_tokens if test_tokens is None else whole("test_tokens", test_tokens, minimum=0)
    split_seed = whole("split_seed", split_seed, minimum=0)
    if split == "test" and not test_tokens:
        raise DataError("this split has no test set (test_tokens=0): fix by setting test_tokens > 0")
    resolved = resolve(source, source_options)
    root = _cache_root(cache_dir)
    name = _cache_name(resolved, val_tokens, test_tokens, split_seed)
    paths = {s: root / f"{name}-{s}.npy" for s in SPLITS if s != "test" or test_tokens}
    if not paths[split].is_file():
        root.mkdir(parents=True, exist_ok=True)
        with FileLock(root / f".{name}.lock"):
            if not paths[split].is_file():  # another process may have built it while this one waited
                _build(resolved, val_tokens, test_tokens, split_seed, paths, root)
    return np.load(paths[split], mmap_mode="r")


def load_splits(source: str, **options) -> tuple[np.ndarray, np.ndarray]:
    """``(train, val)``: ``load_split`` of both splits with the same options (the test
    split, where there is one: ``load_split(source, "test", **options)``)."""
    return load_split(source, "train", **options), load_split(source, "val", **options)
