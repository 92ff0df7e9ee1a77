"""Which runs shared a machine while they trained: their step times measure the sharing,
not the method (``method_frames.run_time_frame`` marks them; claim (e) leaves them out)."""

from __future__ import annotations

import pandas as pd


def _host(record) -> str:
    """The machine a run trained on: the host of its ``hostname:pid`` owner (or worker id);
    "" when it names none (such runs count as one machine)."""
    owner = getattr(record, "owner", None) or (getattr(record, "worker_id", None) or "").rsplit(":", 1)[0]
    return owner.rsplit(":", 1)[0] if owner else ""


def shared_runs(records) -> set[int]:
    """The ids of runs that trained while another of ``records`` trained on the same
    machine (their [started_at, finished_at] intervals overlap; a run still going ends
    now): their step times measure the sharing, not the method."""
    spans = []
    for r in records:
        start = getattr(r, "started_at", None)
        if start is None:
            continue
        end = getattr(r, "finished_at", None) or pd.Timestamp.now(tz="UTC").to_pydatetime()
        start, end = pd.Timestamp(start), pd.Timestamp(end)
        if start.tzinfo is None:
            start, end = start.tz_localize("UTC"), (end.tz_localize("UTC") if end.tzinfo is None else end)
        elif end.tzinfo is None:
            end = end.tz_localize("UTC")
        spans.append((r.id, _host(r), start, end))
    shared: set[int] = set()
    for i, (a, host_a, start_a, end_a) in enumerate(spans):
        for b, host_b, start_b, end_b in spans[i + 1:]:
            if host_a == host_b and start_a < end_b and start_b < end_a:
                shared.update((a, b))
    return shared
