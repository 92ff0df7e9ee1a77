"""Training data: the GPT-2 tokenizer (``tokenizer``), corpora (``sources``: offline
classics, FineWeb-edu, your own files), the token cache with its held-out validation and
test splits (``cache``), and batches (``batches``). A new corpus is a source in ``sources``
(its name in ``engine.core.choices.SOURCES``); a change to how tokens are split or drawn goes
in ``cache`` or ``batches``. May import ``engine.core``."""

from engine.core.choices import SOURCES
from engine.data.batches import BatchSampler, validation_batches
from engine.data.cache import CACHE_ENV, DEFAULT_CACHE_DIR, SPLITS, load_split, load_splits
from engine.data.errors import DataError
from engine.data.sources import (
    DATA_ROOT_ENV,
    FINEWEB_CONFIG,
    FINEWEB_REPO,
    MAX_GLOB_DEPTH,
    MAX_GLOB_ENTRIES,
    MAX_GLOB_SECONDS,
    describe_source,
)
from engine.data.tokenizer import EOT, N_VOCAB, gpt2_encoding

__all__ = [
    "SOURCES", "SPLITS", "CACHE_ENV", "DEFAULT_CACHE_DIR", "DATA_ROOT_ENV", "FINEWEB_CONFIG", "FINEWEB_REPO",
    "MAX_GLOB_DEPTH", "MAX_GLOB_ENTRIES", "MAX_GLOB_SECONDS", "EOT", "N_VOCAB", "BatchSampler", "DataError",
    "describe_source", "gpt2_encoding", "load_split", "load_splits", "validation_batches",
]
