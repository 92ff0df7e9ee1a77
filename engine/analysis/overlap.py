"""Which runs shared a machine while they trained (with a run of any selection, where the
caller passes every stored run): their step times measure the sharing, not the method
(``method_frames.run_time_frame`` marks them; claim (e) leaves them out)."""

from __future__ import annotations

import pandas as pd


def _host(record) -> str:
    """The machine a run trained on: the host of its ``hostname:pid`` owner (or worker id);
    "" when it names none (such runs count as one machine)."""
    owner = getattr(record, "owner", None) or (getattr(record, "worker_id", None) or "").rsplit(":", 1)[0]
    return owner.rsplit(":", 1)[0] if owner else ""


def _span(record):
    """(id, host, start, end) of a run that started (a run still going ends now), else None."""
    start = getattr(record, "started_at", None)
    if start is None:
        return None
    end = getattr(record, "finished_at", None) or pd.Timestamp.now(tz="UTC").to_pydatetime()
    start, end = pd.Timestamp(start), pd.Timestamp(end)
    if start.tzinfo is None:
        start, end = start.tz_localize("UTC"), (end.tz_localize("UTC") if end.tzinfo is None else end)
    elif end.tzinfo is None:
        end = end.tz_localize("UTC")
    return record.id, _host(record), start, end


def shared_runs(records, others=()) -> set[int]:
    """The ids of runs of ``records`` that trained while another run of ``records`` or of
    ``others`` (every stored run, of any selection, where the caller has them) trained on the
    same machine (their [started_at, finished_at] intervals overlap; a run still going ends
    now): their step times measure the sharing, not the method."""
    own = [s for s in map(_span, records) if s is not None]
    mine = {s[0] for s in own}
    spans = own + [s for s in map(_span, others) if s is not None and s[0] not in mine]
    shared: set[int] = set()
    for a, host_a, start_a, end_a in own:
        if any(b != a and host_b == host_a and start_a < end_b and start_b < end_a
               for b, host_b, start_b, end_b in spans):
            shared.add(a)
    return shared
