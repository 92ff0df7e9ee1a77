"""The webhook of failed runs: with ``BASIS_LAB_WEBHOOK`` set to an http(s) URL, the process
that stores a run's ``failed`` end (its job manager: the dashboard's, ``engine run``/``sweep``
or a worker) POSTs one JSON object about it there, once per such end::

    {"event": "run_failed", "id": 12, "name": "basis-r8-s0", "status": "failed",
     "error": "training diverged: loss is nan at step 5", "sweep_id": "...", "text": "BASIS Lab: run #12 …"}

``text`` is the one-line summary chat webhooks (Slack, Mattermost, Discord's /slack) show.
A POST waits at most ``TIMEOUT_S``; a refusal, a timeout or an unreachable host is logged as
one warning and never stops the worker. The dashboard's own alert (a toast on every open
page) needs no webhook: it reads the run's ``ALERT`` log line (``engine.runner.runlog``).
"""

from __future__ import annotations

import json
import logging
import os
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from storage import StorageError

log = logging.getLogger(__name__)

ENV_WEBHOOK = "BASIS_LAB_WEBHOOK"
TIMEOUT_S = 5.0
ALERT_STATUSES = ("failed",)


def webhook_url() -> str | None:
    """The configured webhook URL, or None."""
    return os.environ.get(ENV_WEBHOOK, "").strip() or None


def payload(run_id: int, name: str, status: str, error: str | None, sweep_id: str | None = None) -> dict[str, Any]:
    """The JSON object posted about the end of run ``run_id``."""
    first = error.splitlines()[0] if error else ""
    return {"event": f"run_{status}", "id": int(run_id), "name": name, "status": status, "error": error,
            "sweep_id": sweep_id, "text": f"BASIS Lab: run #{run_id} {name!r} {status}" + (f": {first}" if first else "")}


def post(url: str, body: dict[str, Any], *, timeout: float = TIMEOUT_S) -> bool:
    """POST ``body`` as JSON to ``url``; True when it answered 2xx. Any failure is logged
    (one warning naming the URL's host and the reason), never raised."""
    if not url.lower().startswith(("http://", "https://")):
        log.warning("%s must be an http:// or https:// URL (got %r); no alert sent", ENV_WEBHOOK, url[:80])
        return False
    request = urllib.request.Request(url, data=json.dumps(body).encode("utf-8"), method="POST",
                                     headers={"Content-Type": "application/json", "User-Agent": "basis-lab"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 — scheme checked above
            return 200 <= response.status < 300
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", None) or e
        log.warning("the alert webhook %s refused or did not answer (%s); the run's end is stored anyway",
                    urllib.parse.urlsplit(url).netloc, reason)
        return False


def notify_end(store: Any, run_id: int, status: str, error: str | None, *, url: str | None = None) -> bool:
    """Post the end of ``run_id`` to the webhook (``url``, default ``webhook_url()``) when it
    is an alert (``ALERT_STATUSES``); False when nothing was sent or the post failed."""
    url = url or webhook_url()
    if url is None or status not in ALERT_STATUSES:
        return False
    try:
        run = store.runs.get_run(run_id)
        name, sweep = run.name, run.sweep_id
    except StorageError as e:  # deleted meanwhile, or the database is away: say what is known
        log.debug("run %s: posting its end without its record (%s)", run_id, e)
        name, sweep = f"run {run_id}", None
    return post(url, payload(run_id, name, status, error, sweep))
