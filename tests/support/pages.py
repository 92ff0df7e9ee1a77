"""The dashboard under Streamlit's AppTest: the per-test database URL (its job manager
shut down afterwards) and a store on it, the app, a page of it, its figures and buttons.
Test modules import the fixtures they use by name."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import numpy as np
import pytest
from streamlit.runtime.media_file_manager import MediaFileManager
from streamlit.testing.v1 import AppTest

from app import state
from app.display import CHART
from engine.core.text import WORD_JOINER
from storage import RunStore

APP = Path(__file__).resolve().parents[2] / "app" / "main.py"


@pytest.fixture
def url():
    """The test's database URL; its job manager is shut down afterwards."""
    url = os.environ["BASIS_LAB_DB_URL"]
    yield url
    state._lab(url).close(cancel_running=True)
    state._lab.clear()


@pytest.fixture
def store(url):
    s = RunStore(url)
    yield s
    s.close()


def app(selected=None) -> AppTest:
    at = AppTest.from_file(str(APP), default_timeout=120)
    if selected is not None:
        at.session_state[state.SELECTED] = list(selected)
    return at


def page(at: AppTest, name: str) -> AppTest:
    at.switch_page(f"views/{name}.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert not at.warning, [w.value for w in at.warning]
    return at


def plots(at: AppTest) -> list[dict]:
    """The charts on the page (``app.display.plot``), in order: each its ``spec`` (the
    figure as Plotly's JSON text, as ``st.plotly_chart`` sends it) and its Plotly ``config``."""
    out = []
    for element in at.get("bidi_component"):
        if element.proto.component_name == CHART:
            data = json.loads(element.proto.json)
            out.append({"spec": data["spec"], "config": data["config"]})
    return out


def figures(at: AppTest) -> dict[str, dict]:
    """Plotly figures on the page by title, their arrays decoded."""
    out = {}
    for chart in plots(at):
        spec = json.loads(chart["spec"])
        for trace in spec["data"]:
            for axis in ("x", "y"):
                v = trace.get(axis)
                if isinstance(v, dict) and "bdata" in v:
                    trace[axis] = np.frombuffer(base64.b64decode(v["bdata"]), dtype=np.dtype(v["dtype"])).tolist()
        out[(spec["layout"].get("title") or {}).get("text", "")] = spec
    return out


def read(markdown: str) -> str:
    """Text as a reader sees it: markdown escapes and the invisible word joiners
    (``engine.core.text``) that keep autolinks and ``>=`` typesetting off it removed."""
    return markdown.replace("\\", "").replace(WORD_JOINER, "")


def button(at: AppTest, prefix: str):
    return next(b for b in at.button if b.label.startswith(prefix))


@pytest.fixture
def downloads(monkeypatch):
    """File name → the bytes a click on that download button would fetch."""
    files = {}
    add = MediaFileManager.add_deferred

    def spy(self, fn, mimetype, coordinates, file_name=None, **kwargs):
        files[file_name] = fn
        return add(self, fn, mimetype, coordinates, file_name=file_name, **kwargs)

    monkeypatch.setattr(MediaFileManager, "add_deferred", spy)
    return files
