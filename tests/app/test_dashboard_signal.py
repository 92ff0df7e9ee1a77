"""The dashboard process checkpoints its runs when it is stopped, as the CLI does: a run
the dashboard trains, SIGTERM to `streamlit run`, and the run has a checkpoint at the step
it had reached and ends ``interrupted`` (resumable)."""

import dataclasses
import os
import signal
import subprocess
import sys
import time

import pytest

from engine.config import RunConfig
from engine.runner.paths import checkpoint_root
from engine.training.checkpoints import RunCheckpoints, run_dir
from storage import RunStore
from tests.support.browser import ROOT, free_port, wait_healthy

LONG = RunConfig(preset="tiny", steps=100_000, eval_interval=50_000, probe_interval=0, val_batches=1, name="long")


def test_sigterm_to_the_dashboard_leaves_a_checkpoint_at_the_current_step(tmp_path, token_cache):
    db = f"sqlite:///{tmp_path / 'signal.db'}"
    store = RunStore(db)
    config = dataclasses.replace(LONG)
    # queued with no owner: an orphan the dashboard adopts on its first Runs page draw ("Resume all")
    run_id = store.runs.create_run(name=config.label(), config=config.to_dict(), estimator=config.estimator,
                              rank=config.rank, lam=config.lam, seed=config.seed, preset=config.preset,
                              steps=config.steps)
    env = dict(os.environ, BASIS_LAB_DB_URL=db, BASIS_LAB_CACHE=str(token_cache), HF_HUB_OFFLINE="1",
               BASIS_LAB_CHECKPOINTS=str(tmp_path / "checkpoints"))
    env.pop("BASIS_LAB_PASSWORD", None)
    port = free_port()
    log = open(tmp_path / "streamlit.log", "w")
    server = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", "app/main.py", "--server.headless", "true", "--server.port",
         str(port), "--server.address", "127.0.0.1"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_healthy(port, server)
        from playwright.sync_api import sync_playwright

        from tests.support.browser import CHROMIUM_ARGS, find_chromium

        chromium = find_chromium()
        if chromium is None:
            pytest.skip("no Chromium to press Resume all with")
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.set_default_timeout(60_000)
            page.goto(f"http://127.0.0.1:{port}/runs")
            page.get_by_role("button", name="Resume all").click()  # the dashboard trains the orphan itself
            page.get_by_text("orphaned queued run").first.wait_for()
            browser.close()
        deadline = time.monotonic() + 600
        while store.runs.get_run(run_id).steps_done < 5:
            assert time.monotonic() < deadline, "the dashboard did not start training"
            assert server.poll() is None
            time.sleep(0.5)
        run = store.runs.get_run(run_id)
        assert run.status == "running" and run.owner.endswith(f":{server.pid}")
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=120) is not None
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
        log.close()
    run = store.runs.get_run(run_id)
    assert run.status == "interrupted", (run.status, run.error)
    assert 5 <= run.steps_done < config.steps
    with RunCheckpoints(run_dir(checkpoint_root(db), run.uid), keep=3) as ckpt:
        assert ckpt.steps()[-1] == run.steps_done == run.checkpoint_step  # the step it had reached
    store.close()
