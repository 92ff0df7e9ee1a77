"""A real browser against a real server: ``streamlit run app/main.py`` on a free
localhost port (``streamlit_server``) and Debian's headless Chromium (``find_chromium``,
installed by ``scripts/install_browser.sh`` when missing; ``CHROMIUM_ARGS``)."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]


def find_chromium() -> str | None:
    """Debian's Chromium, once the project's script has installed it where it was missing:
    the script returns at once when Chromium is there and no install of it is under way
    (``make test`` starts one in the background), else it waits for that install or runs one."""
    subprocess.run(["bash", str(ROOT / "scripts" / "install_browser.sh")], check=False, timeout=900)
    return shutil.which("chromium") or shutil.which("chromium-browser") or (
        "/usr/bin/chromium" if os.access("/usr/bin/chromium", os.X_OK) else None)


def playwright_and_chromium():
    """(Playwright's ``sync_playwright``, the Chromium executable), or skip the test
    saying which is missing."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("Playwright for Python is not installed (pip install playwright)")
    chromium = find_chromium()
    if chromium is None:
        pytest.skip("no Chromium: scripts/install_browser.sh needs root and apt-get to install Debian's chromium")
    return sync_playwright, chromium


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(port: int, server: subprocess.Popen, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise AssertionError(f"streamlit exited with {server.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise AssertionError("streamlit did not become healthy")


@contextlib.contextmanager
def streamlit_server(env: dict, log_path: Path):
    """``streamlit run app/main.py`` on a free localhost port with ``env``; yields the port
    once the server is healthy, and stops it (its output in ``log_path``)."""
    port = free_port()
    with open(log_path, "w") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "streamlit", "run", "app/main.py", "--server.headless", "true",
             "--server.port", str(port), "--server.address", "127.0.0.1"],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
        )
        try:
            wait_healthy(port, server)
            yield port
        finally:
            server.terminate()
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


@contextlib.contextmanager
def dashboard_page(url: str, token_cache: Path, log_path: Path, *, width: int = 1400, height: int = 1100):
    """The dashboard on database ``url`` (offline, the session's token cache) in headless
    Chromium: yields (port, page), the page ``width`` × ``height`` px with a 120 s default
    timeout; the browser and the server stop after."""
    sync_playwright, chromium = playwright_and_chromium()
    env = dict(os.environ, BASIS_LAB_DB_URL=url, BASIS_LAB_CACHE=str(token_cache), HF_HUB_OFFLINE="1")
    with streamlit_server(env, log_path) as port, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            page.set_default_timeout(120_000)
            yield port, page
        finally:
            browser.close()


def choose(page, testid: str, label: str, option: str, attempts: int = 4) -> None:
    """Open the ``testid`` widget (``stSelectbox``, ``stMultiSelect``) labelled ``label``
    and pick ``option``. A click that lands while the page is still re-rendering opens
    nothing, so the opening click is tried again until the option shows."""
    wanted = page.get_by_role("option", name=option)
    for _ in range(attempts):
        page.locator(f'[data-testid="{testid}"]').filter(has_text=label).click()
        try:
            wanted.wait_for(timeout=10_000)
            break
        except Exception:  # noqa: BLE001 — playwright's TimeoutError: the list did not open
            page.keyboard.press("Escape")
    wanted.click()


# how many levels above the "interrupted" notice the element is that holds Resume all too (null: none near)
BESIDE = """() => {
  let e = Array.from(document.querySelectorAll('[data-testid="stAlert"]')).find(a => a.innerText.includes('interrupted'));
  for (let up = 0; e && up < 6; up++, e = e.parentElement) {
    if (Array.from(e.querySelectorAll('button')).some(b => b.innerText.includes('Resume all'))) return up;
  }
  return null;
}"""
