"""One module per command, each with ``register(subparsers)`` (its flags and help) and
``run(args)`` (its exit status). ``COMMANDS`` is the order ``--help`` lists them in: a new
command is a module here and its line there. A
module imports at its top only what parsing needs (no JAX); ``run`` imports what it runs."""

from . import (
    backup,
    cancel,
    db,
    delete,
    diagnose,
    export,
    logs,
    report,
    reproduce,
    resume,
    run,
    show,
    summary,
    sweep,
    tag,
    tune,
    worker,
    workers,
)
from . import list as list_runs

COMMANDS = {
    "run": run, "sweep": sweep, "tune": tune, "reproduce": reproduce, "resume": resume, "worker": worker, "workers": workers,
    "list": list_runs, "show": show, "export": export, "summary": summary, "backup": backup, "report": report,
    "delete": delete, "cancel": cancel, "diagnose": diagnose, "tag": tag, "logs": logs, "db": db,
}
