"""The held-out test split (issue 40): disjoint from train and validation by whole documents,
fixed for a corpus (the same tokens in every process), absent with ``test_tokens=0`` (where
train and validation are byte for byte what they were before it), and evaluated by a run at
its last step (with ``test_every_eval``: at every eval), its per-batch losses stored.

Every cache lives in a temporary directory; nothing reaches the network."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from engine.config import RunConfig
from engine.data import EOT, DataError, cache, load_split
from engine.data.sources import resolve
from engine.runner.jobs import JobManager
from engine.training.inputs import load_data
from engine.training.loop import train
from storage import RunStore

WORDS = "the quick brown fox jumps over a lazy dog while seven wizards quietly hex jolly books".split()
WINDOW = 64  # tokens of the windows the test split must not share with the others
TINY = RunConfig(preset="tiny", steps=4, eval_interval=2, probe_interval=0, val_tokens=4096, val_batches=2, rank=4)


def _corpus(tmp_path: Path, n: int = 60) -> str:
    """A ``files`` corpus of ``n`` distinct short documents (one JSON line each)."""
    rng = np.random.default_rng(0)
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps({"text": f"Document {i}. {' '.join(rng.choice(WORDS, size=rng.integers(20, 60)))}."})
                            + "\n" for i in range(n)), encoding="utf-8")
    return str(path)


CORPORA = {"classics": lambda tmp_path: {}, "files": lambda tmp_path: {"path": _corpus(tmp_path), "val_tokens": 300}}


def _documents(tokens: np.ndarray) -> Counter:
    """The documents of a split (its tokens cut at ``<|endoftext|>``), as a multiset of their bytes."""
    tokens = np.asarray(tokens)
    parts = np.split(tokens, np.flatnonzero(tokens == EOT))
    return Counter([parts[0].tobytes(), *(part[1:].tobytes() for part in parts[1:])])


def _splits(source: str, cache_dir: Path, **options) -> dict[str, np.ndarray]:
    return {s: np.asarray(load_split(source, s, cache_dir=cache_dir, **options)) for s in ("train", "val", "test")}


def _window_hashes(tokens: np.ndarray) -> np.ndarray:
    """A 64-bit polynomial hash of every ``WINDOW``-token window of ``tokens``, in order."""
    t = np.asarray(tokens, dtype=np.uint64)
    n = len(t) - WINDOW + 1
    out = np.zeros(n, np.uint64)
    for j in range(WINDOW):
        out = out * np.uint64(1_000_003) + t[j:j + n]
    return out


def _shared_windows(a: np.ndarray, b: np.ndarray) -> set[bytes]:
    """Every ``WINDOW``-token window that occurs in both ``a`` and ``b``, exactly (hashes pick
    the candidates, their bytes decide)."""
    ha, hb = _window_hashes(a), _window_hashes(b)
    both = np.intersect1d(ha, hb)
    rows = lambda t, h: {np.asarray(t[i:i + WINDOW]).tobytes() for i in np.flatnonzero(np.isin(h, both))}  # noqa: E731
    return rows(a, ha) & rows(b, hb)


@pytest.mark.parametrize("source", sorted(CORPORA))
def test_the_three_splits_partition_the_corpus_by_whole_documents(tmp_path, source):
    """The documents of train, val and test are disjoint and together are the corpus's (the
    documents of the layout without a test split); each held-out split holds its tokens."""
    options = CORPORA[source](tmp_path)
    splits = _splits(source, tmp_path / "cache", **options)
    old = [np.asarray(load_split(source, s, cache_dir=tmp_path / "cache", test_tokens=0, **options))
           for s in ("train", "val")]
    docs = {s: _documents(t) for s, t in splits.items()}
    assert not docs["train"] & docs["val"] and not docs["train"] & docs["test"] and not docs["val"] & docs["test"]
    assert docs["train"] + docs["val"] + docs["test"] == _documents(old[0]) + _documents(old[1])
    val_tokens = options.get("val_tokens", 65536)
    assert len(splits["val"]) >= val_tokens and len(splits["test"]) >= val_tokens  # test_tokens: as many by default
    np.testing.assert_array_equal(splits["val"], old[1])  # validation is what it was; test came out of train
    assert all(t.dtype == np.uint16 for t in splits.values())


def test_classics_test_windows_occur_elsewhere_only_where_the_corpus_repeats_itself(tmp_path):
    """No 64-token window of the test split that crosses a document boundary occurs in train
    or val, and the few that do occur there lie inside one document: passages the King James
    Bible itself repeats in another chapter (2 Kings 14:9 is 2 Chronicles 25:18; Job 2:2-3
    repeats Job 1:7-8), not a leak of the split."""
    splits = _splits("classics", tmp_path / "cache")
    test_windows = len(splits["test"]) - WINDOW + 1
    for other in ("train", "val"):
        shared = _shared_windows(splits["test"], splits[other])
        assert all(EOT not in np.frombuffer(w, np.uint16) for w in shared)
        assert len(shared) <= test_windows // 1000, (other, len(shared))


def test_no_test_split_is_the_layout_before_it(tmp_path):
    """``test_tokens=0``: train and val byte for byte what the split before the test split gave
    (validation the shortest prefix of the seeded permutation holding val_tokens, the rest
    train), under the cache name it had, and asking for the test split is a one-line error."""
    path, cache_dir = _corpus(tmp_path), tmp_path / "cache"
    train = load_split("files", "train", path=path, val_tokens=300, test_tokens=0, cache_dir=cache_dir)
    val = load_split("files", "val", path=path, val_tokens=300, test_tokens=0, cache_dir=cache_dir)

    source = resolve("files", {"path": path})
    documents = cache.tokenize(source.documents(cache_dir / "huggingface"), source.name)
    lengths = np.array([len(d) for d in documents])
    order = np.random.default_rng(0).permutation(len(lengths))
    is_val = np.zeros(len(lengths), bool)
    is_val[order[:int(np.searchsorted(np.cumsum(lengths[order]), 300)) + 1]] = True
    eot = np.array([EOT], np.uint16)
    join = lambda docs: np.concatenate([p for d in docs for p in (eot, d)][1:])  # noqa: E731
    assert train.tobytes() == join([d for d, v in zip(documents, is_val) if not v]).tobytes()
    assert val.tobytes() == join([d for d, v in zip(documents, is_val) if v]).tobytes()

    identity = {"format": cache._CACHE_FORMAT, "tokenizer": cache.TOKENIZER_HASH, "source": "files", "key": source.key,
                "val_tokens": 300, "split_seed": 0}  # the cache name's identity before the test split
    name = f"files-{hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]}"
    assert sorted(p.name for p in cache_dir.glob("*.npy")) == [f"{name}-train.npy", f"{name}-val.npy"]
    with pytest.raises(DataError, match="no test set.*fix by setting test_tokens > 0") as refused:
        load_split("files", "test", path=path, val_tokens=300, test_tokens=0, cache_dir=cache_dir)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize(("options", "message"), [
    ({"val_tokens": 300, "test_tokens": 10**6}, "too few to hold out val_tokens=300 and test_tokens=1,000,000 .*fix by "
                                                "lowering val_tokens or test_tokens or adding documents"),
    ({"test_tokens": -1}, "test_tokens=-1 is not a whole number >= 0: fix by"),
])
def test_a_test_split_the_corpus_cannot_hold_is_a_one_line_error(tmp_path, options, message):
    with pytest.raises(DataError, match=message) as refused:
        load_split("files", "train", path=_corpus(tmp_path), cache_dir=tmp_path / "cache", **options)
    assert "\n" not in str(refused.value)


CHILD = """
import hashlib, sys
import numpy as np
from engine.data import load_split
tokens = load_split("classics", "test", cache_dir=sys.argv[1])
print(hashlib.sha256(np.asarray(tokens).tobytes()).hexdigest())
"""


def test_the_test_split_is_the_same_in_another_process(tmp_path):
    """A fresh process, tokenizing into its own cache, gets the same test tokens byte for byte."""
    mine = np.asarray(load_split("classics", "test", cache_dir=tmp_path / "mine"))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2]), "PYTHONHASHSEED": "123"}
    child = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "child")], env=env, capture_output=True,
                           text=True, timeout=300)
    assert child.returncode == 0, child.stderr[-2000:]
    assert child.stdout.strip() == hashlib.sha256(mine.tobytes()).hexdigest()


def test_a_run_without_a_test_split_loads_and_records_none():
    config = TINY.replace(test_tokens=0, test_every_eval=True)
    assert load_data(config)[2] is None
    records = list(train(config))
    assert not any("test_loss" in r.values or "test" in r.batch_losses for r in records)


def test_a_run_records_its_test_loss_at_its_last_step_or_at_every_eval():
    """``test_loss`` (the mean of the per-batch test losses) and ``test_loss_se`` at the last
    step only; with ``test_every_eval`` at step 0 and every eval, with the same training."""
    test = load_data(TINY)[2]
    assert test is not None and test.shape == (2, TINY.effective_batch_size, TINY.effective_seq_len + 1)
    last = {r.step: r for r in train(TINY)}
    every = {r.step: r for r in train(TINY.replace(test_every_eval=True))}
    assert [s for s, r in last.items() if "test_loss" in r.values] == [4]
    assert [s for s, r in every.items() if "test_loss" in r.values] == [0, 2, 4]
    for records in (last, every):
        for r in records.values():
            assert ("test" in r.batch_losses) == ("test_loss" in r.values) == ("test_loss_se" in r.values)
            if "test" in r.batch_losses:
                losses = r.batch_losses["test"]
                assert losses.shape == (2,) and losses.dtype == np.float32
                assert r.values["test_loss"] == pytest.approx(float(np.mean(losses.astype(np.float64))))
                assert r.values["test_loss_se"] == pytest.approx(float(np.std(losses, ddof=1) / np.sqrt(2)), rel=1e-5)
    assert every[4].values["test_loss"] == pytest.approx(last[4].values["test_loss"], rel=1e-5)
    assert every[4].values["val_loss"] == pytest.approx(last[4].values["val_loss"], rel=1e-5)
    assert last[4].values["test_loss"] != pytest.approx(last[4].values["val_loss"], rel=1e-6)  # another split


def test_a_stored_run_keeps_its_per_batch_test_losses(tmp_path):
    store = RunStore(f"sqlite:///{tmp_path / 'lab.db'}")
    manager = JobManager(store)
    try:
        [run_id] = manager.submit(TINY)
        assert manager.wait([run_id], timeout=600)
    finally:
        manager.shutdown()
    assert store.runs.get_run(run_id).status == "finished"
    assert store.runs.get_run(run_id).config["test_tokens"] is None
    test_loss = store.metrics([run_id], names=["test_loss", "test_loss_se"])
    assert sorted(zip(test_loss["name"], test_loss["step"])) == [("test_loss", 4), ("test_loss_se", 4)]
    losses = store.eval_losses([run_id], split="test").set_index("step")["losses"]
    assert list(losses.index) == [4] and losses[4].shape == (2,)
    assert losses[4].mean() == pytest.approx(test_loss.set_index("name").loc["test_loss", "value"], rel=1e-6)
    assert list(store.eval_losses([run_id]).set_index("step").index) == [0, 2, 4]  # validation as before
    store.close()
