"""``python -m engine``: the command line (run, sweep, worker, resume, export, summary,
diagnose, ...). Parsing and ``--help`` load no JAX; each command imports what it runs."""
