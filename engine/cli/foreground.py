"""Training in this process: progress bars, the signals that stop runs resumably, and the
summary printed at the end (``run``, ``sweep``, ``reproduce``, ``resume``; ``worker`` shares
the signal handling)."""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time
from contextlib import contextmanager

from engine.cli.output import print_summary
from engine.core.loggers import held_below


class Signals:
    """SIGINT, SIGTERM and SIGHUP end the runs of this process the same way: each
    running run writes a checkpoint and ends ``interrupted`` (resumable), then the
    process exits with 128 + the signal number. Outside the main thread (a caller of
    ``engine.api`` training from a thread of its own) it handles none."""

    NAMES = ("SIGINT", "SIGTERM", "SIGHUP")

    def __init__(self, on_signal):
        self.received: int | None = None
        self._on_signal = on_signal
        self._previous = {}

    def __enter__(self):
        if threading.current_thread() is not threading.main_thread():
            return self  # Python lets only the main thread handle signals (``engine.api`` may train in another)
        for name in self.NAMES:
            if hasattr(signal, name):
                sig = getattr(signal, name)
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.received is None:
            self.received = signum
            print(f"\n{signal.Signals(signum).name}: checkpointing and stopping (runs end interrupted; "
                  "`python -m engine resume --all` continues them)...", file=sys.stderr)
            self._on_signal()

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def exit_code(self, default: int) -> int:
        return 128 + self.received if self.received is not None else default


class _Bars:
    """tqdm progress bars per run, updated from worker threads."""

    def __init__(self):
        self._bars: dict = {}
        self._lock = threading.Lock()

    def on_step(self, run_id, step, loss) -> None:
        with self._lock:
            bar = self._bars.get(run_id)
            if bar is None:
                return
            bar.update(step - bar.n)
            if loss is not None:
                bar.set_postfix(loss=f"{loss:.3f}", refresh=False)

    def on_resume(self, run_id: int, note: str, skipped: list[str]) -> None:
        """One line when a run trained before continues, once its checkpoint is read: the step
        it actually resumed from (``note``; a refused newer checkpoint is not it) and the
        newest checkpoint refused, if any."""
        from tqdm import tqdm

        refused = f"; refused: {skipped[0].splitlines()[0]}" if skipped else ""
        more = f" (and {len(skipped) - 1} more)" if len(skipped) > 1 else ""
        with self._lock:
            tqdm.write(f"run {run_id}: {note}{refused}{more}", file=sys.stderr)

    def add(self, run_id: int, total: int, label: str, done: int = 0) -> None:
        from tqdm import tqdm

        with self._lock:
            self._bars[run_id] = tqdm(total=total, initial=done, desc=f"#{run_id} {label}", position=len(self._bars),
                                      unit="step", leave=True)

    def close(self) -> None:
        for bar in self._bars.values():
            bar.close()


@contextmanager
def _ends_said_here():
    """Hold back the job manager's log line of each run's end (``engine.runner.jobs.ENDS``)
    while ``train_here`` trains: it prints each end itself, once (the summary's failed runs,
    the interrupted ones' one line), after the progress bars."""
    with held_below("engine.runner.jobs.ends", logging.ERROR):
        yield


def train_here(store, start_runs, concurrent: int = 1, then=None) -> int:
    """Train in this process what ``start_runs(manager)`` queues (its run ids), ``concurrent``
    at a time, with progress bars, a line naming the checkpoint step each run trained before
    actually resumes from, and signal handling; print the summary. ``then(manager)``, when
    given, is asked for the runs to wait for next each time those waited for have ended (a
    campaign's next stage; [] ends the wait). Exit 0 when every run finished, 1 when one did
    not, 128 + N after signal N."""
    from engine.cli.process import training_starts
    from engine.runner.jobs import JobManager

    training_starts()
    bars = _Bars()
    manager = JobManager(store, max_concurrent=concurrent, on_step=bars.on_step, on_resume=bars.on_resume)
    if manager.interrupted:
        print(f"marked interrupted (left running by a process that died): {manager.interrupted}", file=sys.stderr)
    start = time.perf_counter()
    with Signals(manager.interrupt) as signals, _ends_said_here():
        try:
            ids, batch = [], start_runs(manager)
            while batch:
                ids += batch
                for run_id in batch:
                    r = store.runs.get_run(run_id)
                    bars.add(run_id, r.steps or 0, r.name, r.steps_done if r.status == "queued" else 0)
                manager.wait(batch)
                batch = [] if then is None or signals.received is not None else \
                    [i for i in then(manager) if i not in ids]
        finally:
            manager.shutdown(cancel_running=False)
            bars.close()
    print(f"\nwall time {time.perf_counter() - start:.1f} s")
    if ids:
        print_summary(store, ids)
    for run_id in ids:  # stopped by a fault (a full disk), not by a signal: the one line that says what to do
        outcome = manager.outcomes.get(run_id)
        if outcome is not None and outcome.status == "interrupted" and signals.received is None:
            print(f"run {run_id} interrupted: {(outcome.error or '').splitlines()[0]}", file=sys.stderr)
    statuses = {store.runs.get_run(i).status for i in ids}
    return signals.exit_code(0 if statuses <= {"finished"} and not manager.lost else 1)
