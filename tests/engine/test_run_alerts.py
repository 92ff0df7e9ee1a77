"""A run's log (``engine.runner.runlog``) and the webhook of failed runs
(``engine.runner.alerts``): what the run's thread logs and warns is stored with it, a failed
end leaves one alert line and posts one JSON object to ``BASIS_LAB_WEBHOOK``."""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import warnings
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from engine.config import RunConfig
from engine.runner import alerts, runlog
from engine.runner.jobs import JobManager
from engine.runner.runlog import RunLog
from engine.runner.writer import StoreWriter
from storage import ALERT
from tests.support.runs import new_run, wait_for

TINY = RunConfig(preset="tiny", steps=4, eval_interval=2, probe_interval=4, val_batches=2, rank=4)


class Hook:
    """A local HTTP server on a free port that keeps every JSON body POSTed to it."""

    def __init__(self, status: int = 200):
        bodies = self.bodies = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                bodies.append((self.headers["Content-Type"], json.loads(self.rfile.read(int(self.headers["Content-Length"])))))
                self.send_response(status)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def test_the_log_keeps_what_the_runs_thread_logs_and_warns_and_its_end(store):
    run_id = new_run(store, "a")
    epoch = store.queue.claim(run_id, "host:1")
    writer = StoreWriter(store)
    with RunLog(store, writer, run_id, epoch) as run_log:
        logging.getLogger("engine.training.test").warning("slow step %d", 7)
        logging.getLogger("engine.training.test").debug("not let through by the logger")
        other = threading.Thread(target=lambda: logging.getLogger("engine.other").warning("another run's"))
        other.start()
        other.join()
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.warn("careful with lr", UserWarning)
    logging.getLogger("engine.training.test").warning("after the run")
    run_log.end("failed", "training loss became nan at step 5; lower lr\nTraceback: …")
    writer.flush()
    lines = [(x.level, x.text) for x in store.logs.run_logs(run_id)]
    assert lines[0] == ("warning", "engine.training.test: slow step 7")
    assert lines[1][0] == "warning" and lines[1][1].startswith("UserWarning: careful with lr (")
    assert lines[2:] == [(ALERT, "failed: training loss became nan at step 5; lower lr"),
                         ("error", "training loss became nan at step 5; lower lr\nTraceback: …")]


def test_a_finished_end_is_one_info_line_and_no_alert(store):
    run_id = new_run(store, "a")
    epoch = store.queue.claim(run_id, "host:1")
    writer = StoreWriter(store)
    with RunLog(store, writer, run_id, epoch) as run_log:
        pass
    run_log.end("finished", None)
    writer.flush()
    assert [(x.level, x.text) for x in store.logs.run_logs(run_id)] == [("info", "finished")]
    assert store.logs.alerts_after(0) == []


def test_a_line_keeps_the_time_it_was_logged_not_the_time_it_was_stored(store, monkeypatch):
    run_id = new_run(store, "a")
    epoch = store.queue.claim(run_id, "host:1")
    writer = StoreWriter(store)
    with RunLog(store, writer, run_id, epoch) as run_log:
        with monkeypatch.context() as m:
            m.setattr(runlog.time, "time", lambda: 1_000_000.0)  # the claim, long before the run ends
            run_log.add("info", "claimed by host:1 (lease 1)")
    run_log.end("finished", None)
    writer.flush()
    claimed, end = store.logs.run_logs(run_id)
    assert claimed.time == datetime.fromtimestamp(1_000_000.0, timezone.utc)
    assert end.text == "finished" and end.time > claimed.time


def test_a_training_runs_log_reaches_the_database_while_it_trains(store):
    """Run detail shows the log of a run that is still training: its held lines are
    stored by the worker's heartbeat, not only when it ends (or every 50 lines)."""
    seen = []

    def on_step(run_id, step, loss):
        if step == 2 and not seen:  # the run waits here, mid-training, until its claim line is stored
            seen.append(wait_for(lambda: [x.text for x in store.logs.run_logs(run_id)], timeout=120,
                                 what="the claim line of a run still training"))

    manager = JobManager(store, on_step=on_step)
    [run_id] = manager.submit(TINY)
    manager.wait()
    manager.shutdown()
    assert store.runs.get_run(run_id).status == "finished"
    assert seen[0][0] == f"claimed by {manager.owner} (lease 1)"  # stored before the run ended (progress may follow)


def test_a_failed_run_logs_an_alert_and_posts_the_webhook_once(store, monkeypatch):
    with Hook() as hook:
        monkeypatch.setenv(alerts.ENV_WEBHOOK, hook.url)
        manager = JobManager(store)
        [bad] = manager.submit(dataclasses.replace(TINY, dataset="files", dataset_options={"path": "/nonexistent/*.txt"}))
        manager.wait()
        manager.shutdown()
    run = store.runs.get_run(bad)
    assert run.status == "failed"
    texts = [(x.level, x.text) for x in store.logs.run_logs(bad)]
    assert texts[0][0] == "info" and texts[0][1].startswith(f"claimed by {manager.owner} (lease ")
    [alert] = store.logs.alerts_after(0)
    assert alert.run_id == bad and alert.text == f"failed: {run.error.splitlines()[0]}"
    [(kind, body)] = hook.bodies
    assert kind == "application/json"
    assert body["id"] == bad and body["name"] == run.name and body["status"] == "failed"
    assert body["error"] == run.error and "no file matches" in body["error"]
    assert body["text"].startswith(f"BASIS Lab: run #{bad} {run.name!r} failed: ")


def test_a_webhook_that_fails_is_logged_not_raised(caplog):
    with Hook(status=500) as hook:
        with caplog.at_level(logging.WARNING, logger="engine.runner.alerts"):
            assert alerts.post(hook.url, {"x": 1}, timeout=2) is False
    assert "refused or did not answer" in caplog.text and "127.0.0.1" in caplog.text
    closed = hook.url  # the server is gone: nothing listens on its port any more
    assert alerts.post(closed, {"x": 1}, timeout=2) is False
    assert alerts.post("file:///etc/passwd", {"x": 1}) is False and "must be an http" in caplog.text


@pytest.mark.parametrize("status,sent", [("failed", True), ("finished", False), ("cancelled", False)])
def test_only_failed_ends_are_posted(store, status, sent):
    run_id = new_run(store, "r")
    with Hook() as hook:
        assert alerts.notify_end(store, run_id, status, "boom" if status == "failed" else None, url=hook.url) is sent
    assert len(hook.bodies) == int(sent)
