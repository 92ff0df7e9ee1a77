"""A dashboard safe to share: bounded data globs, a data root, the password gate, and
names shown as plain text."""

import os
import time

import pytest

from app import display, gate
from engine.data import sources


def _tree(tmp_path):
    (tmp_path / "corpus" / "deep").mkdir(parents=True)
    (tmp_path / "corpus" / "a.txt").write_text("one")
    (tmp_path / "corpus" / "deep" / "b.txt").write_text("two")
    os.symlink(tmp_path / "corpus", tmp_path / "corpus" / "deep" / "loop")  # a symlink loop
    os.symlink(tmp_path, tmp_path / "corpus" / "up")
    return tmp_path / "corpus"


def test_a_recursive_glob_through_symlink_loops_ends_and_finds_each_file_once(tmp_path):
    corpus = _tree(tmp_path)
    started = time.monotonic()
    found = sources._match_files(str(corpus / "**" / "*.txt"), "path")
    elapsed = time.monotonic() - started
    assert found == [corpus / "a.txt", corpus / "deep" / "b.txt"]
    assert elapsed < sources.MAX_GLOB_SECONDS  # bounded by construction: symlinked directories are not followed


def test_a_glob_stops_at_its_entry_bound(tmp_path, monkeypatch):
    for i in range(50):
        (tmp_path / f"f{i}.txt").write_text("x")
    monkeypatch.setattr(sources, "MAX_GLOB_ENTRIES", 20)
    with pytest.raises(sources.DataError, match="looks at too many files .* fix by narrowing the glob"):
        sources._match_files(str(tmp_path / "**" / "*.txt"), "path")


def test_a_glob_descends_at_most_max_depth(tmp_path):
    deep = tmp_path.joinpath(*[f"d{i}" for i in range(sources.MAX_GLOB_DEPTH + 2)])
    deep.mkdir(parents=True)
    (deep / "far.txt").write_text("x")
    (tmp_path / "near.txt").write_text("x")
    assert sources._match_files(str(tmp_path / "**" / "*.txt"), "path") == [tmp_path / "near.txt"]


def test_data_root_confines_paths(tmp_path, monkeypatch):
    corpus = _tree(tmp_path)
    monkeypatch.setenv(sources.DATA_ROOT_ENV, str(corpus / "deep"))
    with pytest.raises(sources.DataError, match="outside BASIS_LAB_DATA_ROOT"):
        sources._match_files(str(corpus / "a.txt"), "path")
    with pytest.raises(sources.DataError, match="outside BASIS_LAB_DATA_ROOT"):
        sources._match_files("/etc/passwd", "path")
    with pytest.raises(sources.DataError, match="outside BASIS_LAB_DATA_ROOT"):  # a symlink that leaves the root
        sources._match_files(str(corpus / "deep" / "loop" / "a.txt"), "path")
    assert sources._match_files(str(corpus / "deep" / "*.txt"), "path") == [corpus / "deep" / "b.txt"]


def test_plain_text_escapes_markdown_links_and_images():
    shown = display.plain("![x](http://host/img) [y](http://host) *bold* <b>")
    for raw in ("![", "](", "*bold*", "<b>"):
        assert raw not in shown
    assert shown.replace("\\", "").replace("\u2060", "") == "![x](http://host/img) [y](http://host) *bold* <b>"


def test_password_check_is_exact():
    assert gate.check("s3cret", "s3cret")
    assert not gate.check("s3cre", "s3cret") and not gate.check("s3cret ", "s3cret") and not gate.check("", "s3cret")


def test_chart_legends_show_html_in_run_names_as_text():
    import pandas as pd

    from engine.analysis import charts

    name = "<a href='http://127.0.0.1:9/x'>click</a>"
    frame = pd.DataFrame({"trace": [name, name], "color": ["#404040"] * 2, "dash": ["solid"] * 2, "x": [0, 1],
                          "y": [1.0, 2.0], "lo": [float("nan")] * 2, "hi": [float("nan")] * 2, "n": [1, 1]})
    fig = charts.line_figure(frame, y_title="loss")
    names = [t.name for t in fig.data if t.name]
    assert names and all("<a" not in n and "&lt;a href" in n for n in names)
    bars = charts.memory_figure(pd.DataFrame({"trace": [name], "color": ["#404040"], "quantity": ["Saved for backward"],
                                              "mib": [1.0], "baseline_mib": [2.0], "ratio": [0.5]}))
    labels = [y for t in bars.data for y in t.y]
    assert labels and all("<a" not in y and "&lt;a href" in y for y in labels)  # bar labels too
