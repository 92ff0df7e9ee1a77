"""``python -m engine``: the command line (run, sweep, worker, resume, export, summary,
diagnose, ...). A new command is a module of ``engine.cli.commands`` (its flags and its
``run``); what several commands share lives beside it (``arguments``: shared flags and their
errors, ``config_flags``: the run schema's flags, ``launch``/``tuning``: queueing a grid or a
campaign, ``foreground``: training here with progress bars and signals, ``output``/``listing``:
what they print). Parsing and ``--help`` load no JAX; each command imports what it runs. May
import every engine package and ``storage``."""
