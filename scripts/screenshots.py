"""Retake docs/screenshots/: every dashboard page at 1,400 and 420 px wide, in headless
Chromium, on a demo database of stored runs (written as a worker writes them; nothing
trains). Needs the test extra (Playwright) and Chromium (scripts/install_browser.sh).

    PYTHONPATH=. .venv/bin/python scripts/screenshots.py [--out docs/screenshots] [--pages compare,runs]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.reads import reports  # noqa: E402
from storage import RunStore  # noqa: E402
from tests.support.browser import CHROMIUM_ARGS, find_chromium, streamlit_server  # noqa: E402
from tests.support.runs import SWEEP_A, TINY, InSweep, fake_run  # noqa: E402

WIDTHS = (1400, 420)
PAGES = ("launch", "runs", "compare", "detail", "diagnosis", "report")
READY = {"launch": "runs to launch", "runs": "in all", "compare": "Summary (the paper's Table 3 form)",
         "detail": "Validation loss", "diagnosis": "Relative MSE", "report": "Table 3"}


def demo(url: str) -> dict:
    """A finished sweep (exact and BASIS at R = 1, 8, 32, seeds 0-2) with system metrics, a
    diagnosis and a report; Run detail's run (basis R = 8, seed 0) has a log."""
    store = RunStore(url)
    config = dataclasses.replace(TINY, steps=200, eval_interval=20, probe_interval=20, lam=0.0)
    sweep = InSweep(store, SWEEP_A, ["demo"])
    ids = []
    for seed in range(3):
        ids.append(fake_run(sweep, dataclasses.replace(config, estimator="exact", seed=seed), final=6.0, breakdown=True,
                            system=True))
        for rank, final, saved in ((1, 6.9, 6e6), (8, 6.3, 8e6), (32, 6.05, 11e6)):
            noise = 0.012 * ((3 * seed + rank) % 5 - 2)  # seed noise, so Table 3 has a spread to judge
            ids.append(fake_run(sweep, dataclasses.replace(config, rank=rank, seed=seed), final=final + noise,
                                saved=saved, breakdown=True, system=True))
    store.logs.add_run_logs(ids[2], [("info", "claimed by demo:4242 (lease 1)"),  # what a resumed run's log holds
                                ("warning", f"interrupted: disk full: free space on /data and run python -m engine "
                                            f"resume {ids[2]}"),
                                ("info", "claimed by demo:4242 (lease 2)"), ("info", "finished")])
    diag = store.diagnostics.create_diagnostic(ids[-1], 200, {"step": 200, "estimators": ["basis", "countsketch"],  # the newest run:
                                                  "ranks": [1, 8, 32], "lams": [0.0], "keys": 256,  # the page opens on it
                                                  "batches": 2})
    store.diagnostics.claim_diagnostic(diag, "demo")
    rows = []
    for est, scale in (("basis", 1.0), ("countsketch", 1.8)):
        for rank in (1, 8, 32):
            for layer in ("all", "head"):
                var = scale * 4.0 / rank
                rows.append({"layer": layer, "estimator": est, "rank": rank, "lam": 0.0, "bias2": 0.0,
                             "bias2_se": var / 50, "variance": var, "mse": var, "cos_mean": 1 / (1 + var),
                             "keys": 256, "batches": 2})
    store.diagnostics.add_diagnostic_results(diag, rows)
    store.diagnostics.set_diagnostic_status(diag, "finished")
    report = reports.save(store, reports.build(store, {"sweep": SWEEP_A}))
    store.close()
    return {"detail": f"?run={ids[2]}", "report": f"?id={report}", "diagnosis": ""}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshots")
    parser.add_argument("--pages", default=",".join(PAGES))
    parser.add_argument("--hover", type=Path, help="also save close-ups of the hover toolbars in this folder")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    chromium = find_chromium()
    if chromium is None:
        sys.exit("no Chromium: run scripts/install_browser.sh")
    work = Path(tempfile.mkdtemp(prefix="basis-shots-"))
    url = f"sqlite:///{work / 'demo.db'}"
    queries = demo(url)
    env = dict(os.environ, BASIS_LAB_DB_URL=url, BASIS_LAB_CHECKPOINTS=str(work / "checkpoints"),
               PYTHONPATH=str(ROOT))
    args.out.mkdir(parents=True, exist_ok=True)
    if args.hover:
        args.hover.mkdir(parents=True, exist_ok=True)
    with streamlit_server(env, work / "streamlit.log") as port, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            for name in args.pages.split(","):
                for width in WIDTHS:
                    page = browser.new_page(viewport={"width": width, "height": 1000})
                    page.set_default_timeout(120_000)
                    page.goto(f"http://127.0.0.1:{port}/{name}{queries.get(name, '')}")
                    page.get_by_text(READY[name]).first.wait_for()
                    time.sleep(4)  # charts draw after their data arrives
                    tall = page.evaluate("document.querySelector('[data-testid=\"stMain\"]').scrollHeight")
                    page.set_viewport_size({"width": width, "height": min(int(tall) + 40, 16_000)})
                    time.sleep(2)
                    path = args.out / f"{name}-{width}.png"
                    page.screenshot(path=str(path), full_page=True)
                    print(path)
                    if args.hover:  # the toolbars that show on hover, over the first chart and the first grid
                        for what, selector in (("chart", ".js-plotly-plot"), ("grid", '[data-testid="stDataFrame"]')):
                            target = page.locator(selector).first
                            if target.count():
                                target.hover()
                                time.sleep(1)
                                box = target.bounding_box()
                                clip = {"x": 0, "y": max(box["y"] - 80, 0), "width": width, "height": 200}
                                hover = args.hover / f"{name}-{width}-{what}-hover.png"
                                page.screenshot(path=str(hover), clip=clip)
                                print(hover)
                    page.close()
        finally:
            browser.close()
    shutil.rmtree(work, ignore_errors=True)  # the demo database; kept (with streamlit.log) when a page failed


if __name__ == "__main__":
    main()
