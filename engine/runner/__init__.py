"""Running work against the store: queueing runs, jobs and workers (``jobs``, ``execution``,
``cohorts``), liveness and heartbeats, the write queue, checkpoint paths and files, run logs and
consoles, diagnosis runs, tuning campaigns advanced, what follows a run's end, cancel and resume,
tags edited, the webhook of failures, exports. A change to how work is claimed, trained, kept alive
or written goes here; a read that feeds a page or a report goes to ``engine.reads``. May import
``engine.reads``, ``engine.analysis`` and below, and ``storage``."""
