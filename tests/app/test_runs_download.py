"""The Runs page's CSV download: built only on click, streamed a chunk of metric rows at a
time (``storage.export.export_bytes``), the bytes of ``engine export``'s file."""

import dataclasses

import storage.stream as stream
from engine.config import shape_columns
from storage import long_frame, to_csv_bytes, wide_frame
from tests.support.pages import app, downloads, page, store, url  # noqa: F401 (fixtures)
from tests.support.runs import TINY, fake_run


def test_the_csv_download_streams_the_export_of_the_ticked_runs(url, store, downloads, monkeypatch):
    ids = [fake_run(store, dataclasses.replace(TINY, rank=r, seed=s)) for r in (4, 8) for s in (0, 1)]
    at = page(app(selected=ids).run(), "runs")
    assert "CSV of 4 runs (long)" in [d.label for d in at.get("download_button")]
    monkeypatch.setattr(stream, "CHUNK_ROWS", 7)  # many chunks: the file is still the whole table's
    sizes = []
    made = stream.metrics_frame
    monkeypatch.setattr(stream, "metrics_frame", lambda rows: sizes.append(len(rows)) or made(rows))
    assert downloads["basis-runs-long.csv"]() == to_csv_bytes(long_frame(store, ids, shape_columns))
    assert len(sizes) > 4 and max(sizes) <= 7
    at.radio(key="runs.csv_format").set_value("wide").run()
    assert downloads["basis-runs-wide.csv"]() == to_csv_bytes(wide_frame(store, ids, shape_columns))
