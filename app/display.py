"""How the pages dress plain data: status symbols, user text as plain text (``app.text.plain``), and the one chart-render helper."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path
from typing import Mapping, Sequence

import plotly
import plotly.graph_objects as go
import plotly.io as pio
import streamlit as st
from streamlit.components.v2.manifest_scanner import ComponentConfig, ComponentManifest
from streamlit.runtime import Runtime

from app.text import plain  # noqa: F401  (the one plain-text helper, re-exported for the pages)

STATUS_LABELS = {  # text symbols, not emoji: they render with any font
    "queued": "○ queued",
    "running": "▶ running",
    "finished": "✓ finished",
    "failed": "✗ failed",
    "cancelled": "■ cancelled",
    "interrupted": "⚠ interrupted",
}
WORKER_LABELS = {"active": "▶ active", "stopped": "■ stopped", "gone": "⚠ gone"}
IMAGE_FORMATS = ("png", "svg")
IMAGE_FORMAT = "display.image_format"  # the sidebar's choice of chart download format
CHART = "basis_lab.chart"  # the live chart component (app/chart.js)
PLOTLY_JS = ("basis_lab", "plotly")  # plotly.js is served as the assets of this component name


def status_text(status: str) -> str:
    """``✓ finished``: a status with its symbol."""
    return STATUS_LABELS.get(status, status)


def worker_state_text(state: str) -> str:
    """``⚠ gone``: a worker's state with its symbol."""
    return WORKER_LABELS.get(state, state)


def resume_text(checkpoint_steps: Mapping[int, int | None], moved: Sequence[int]) -> str:
    """What a Resume did: which run continues from which checkpoint step (or from
    step 0), and which of those asked for (the keys) were not resumable."""
    parts = [f"#{i} from checkpoint step {checkpoint_steps.get(i):,}" if checkpoint_steps.get(i)
             else f"#{i} from step 0 (no checkpoint)" for i in moved]
    left = [i for i in checkpoint_steps if i not in set(moved)]
    text = f"Resumed {', '.join(parts)}." if parts else "Nothing was resumed."
    return text + (f" Not resumable now: {', '.join(f'#{i}' for i in left)}." if left else "")


_chart = st.components.v2.component(CHART, js=(Path(__file__).parent / "chart.js").read_text(), isolate_styles=False)


def _plotly_js_url() -> str:
    """Where this server serves the plotly.js of the installed ``plotly`` package
    (``plotly/package_data/plotly.min.js``, the version the figures are built for).

    The file is served as the assets of a component whose asset directory is that
    package folder (Streamlit's ``/_stcore/bidi-components/<name>/<file>`` route, the
    one an installed component's ``asset_dir`` gets), registered on first use: nothing
    is copied and no CDN is asked. A page loads it once (about 1.5 MB gzipped), however
    often it refreshes; a reload fetches it again (the route sends no cache validator)."""
    name = ".".join(PLOTLY_JS)
    manager = Runtime.instance().bidi_component_registry
    if manager.get_component_path(name) is None:
        manifest = ComponentManifest(name=PLOTLY_JS[0], version=plotly.__version__,
                                     components=[ComponentConfig(name=PLOTLY_JS[1], asset_dir="package_data")])
        manager.register_from_manifest(manifest, Path(plotly.__file__).parent)
    base = st.get_option("server.baseUrlPath").strip("/")
    return f"{'/' + base if base else ''}/_stcore/bidi-components/{name}/plotly.min.js"


def _keep_what_the_reader_did(fig) -> go.Figure:
    """A copy of ``fig`` whose Plotly UI state is tied to meaning, not position: each
    trace's ``uid`` comes from its name (a digest, as a uid must be a plain token;
    numbered when a name repeats, as a band's edges do), so a run hidden from the legend
    stays hidden when runs are added before it; ``uirevision`` is the title and what each
    axis shows (title and scale), so a zoom survives new data but not a switch of the x
    axis to wall time or of y to a log scale."""
    fig = go.Figure(fig)
    seen: Counter = Counter()
    for trace in fig.data:
        name = str(trace.name or trace.legendgroup or "")
        trace.uid = f"{hashlib.sha1(name.encode()).hexdigest()[:12]}-{seen[name]}"
        seen[name] += 1
    layout = fig.layout.to_plotly_json()
    axes = sorted((k, str((v.get("title") or {}).get("text")), str(v.get("type")))
                  for k, v in layout.items() if k.startswith(("xaxis", "yaxis")))
    return fig.update_layout(uirevision=json.dumps([str((layout.get("title") or {}).get("text")), axes]))


def plot(fig, key: str) -> None:
    """A chart whose zoom and legend choices survive live refreshes: one component per
    ``key`` (a stable identity, so the browser keeps one plot and updates it in place
    with ``Plotly.react``, and ``layout.uirevision`` keeps what the reader did); its
    toolbar's camera downloads it in the sidebar's format (PNG or SVG).

    ``st.plotly_chart`` would not do: its identity includes the figure, so new data
    mounts a fresh plot and loses the zoom. The component gets the figure as
    ``st.plotly_chart`` would (``spec``: Plotly's JSON) and draws it in the same theme."""
    fmt = st.session_state.get(IMAGE_FORMAT, "png")
    fig = _keep_what_the_reader_did(fig)
    config = {"displaylogo": False, "modeBarButtonsToRemove": ["lasso2d", "select2d", "sendChartToCloud"],
              "toImageButtonOptions": {"format": fmt, "scale": 2 if fmt == "png" else 1, "filename": f"basis-lab-{key}"}}
    if not Runtime.exists():  # a script run without a server (bare mode): nothing serves plotly.js
        st.plotly_chart(fig, width="stretch", config=config, key=key)
        return
    _chart(key=f"plot.{key}", data={"spec": pio.to_json(fig, validate=False), "config": config, "plotly": _plotly_js_url()})
