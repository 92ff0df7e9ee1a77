"""Training data: the GPT-2 tokenizer, corpora (offline classics, FineWeb-edu, your own
files), the token cache with its held-out split, and batches. May import ``engine.core``."""

from engine.core.choices import SOURCES
from engine.data.corpus import (
    CACHE_ENV,
    DATA_ROOT_ENV,
    DEFAULT_CACHE_DIR,
    EOT,
    FINEWEB_CONFIG,
    FINEWEB_REPO,
    MAX_GLOB_DEPTH,
    MAX_GLOB_ENTRIES,
    MAX_GLOB_SECONDS,
    N_VOCAB,
    SPLITS,
    BatchSampler,
    DataError,
    describe_source,
    gpt2_encoding,
    load_split,
    load_splits,
    validation_batches,
)
