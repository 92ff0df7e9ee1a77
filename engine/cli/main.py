"""``python -m engine``: run, sweep, reproduce, report, resume, worker, workers, list, show, export, summary,
delete, cancel and diagnose BASIS runs, and back up the database.

Every command takes ``--db URL`` (default ``$BASIS_LAB_DB_URL`` or the SQLite
file in ``storage.db.DEFAULT_DB_PATH``), the same database the dashboard reads.

Each command is a module of ``engine.cli.commands``; the parser is built from them and the
run schema alone (``engine.config``: no JAX), and each command imports what it runs, so
``--help`` and bad flags answer at once.

Exit status: 0 done; 2 bad input (a :class:`~engine.errors.UserError`, printed as one line
``error: …`` naming the fix, nothing written) or a disk or path the OS refused; 1 a run that
did not finish, or a bug (an unexpected exception, with its traceback); 128 + N after signal N.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
from typing import NoReturn

from engine.cli.arguments import EXIT_BAD_INPUT, CliError, closing_stores
from engine.cli.commands import COMMANDS
from engine.cli.process import freeze_when_training
from engine.errors import UserError

EXIT_BROKEN_PIPE = 128 + 13  # what a shell reports for a process a SIGPIPE ended (`cmd | head`)
# Commands that train, and so run on several hosts when ``engine.runner.hosts`` says so.
_TRAINING = ("run", "sweep", "resume", "worker")
# Commands that train in their own process (unless given --queue-only), so the process entry
# point sets its malloc for training (``engine.training.allocator``).
_TRAINS_HERE = (*_TRAINING, "tune", "reproduce")


class _Parser(argparse.ArgumentParser):
    """argparse whose refusal of a flag is one line naming the fix (the command's ``--help``),
    exit 2, instead of the command's whole usage (40 lines for ``run``) above the error.
    Subcommand parsers are made of the same class."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message}; see {self.prog} --help\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m engine", description="BASIS Lab: sketched-backprop training runs.")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS.values():
        command.register(subparsers)
    return parser


def _on_hosts(args) -> int:
    """A training command, on several hosts when ``engine.runner.hosts``' variables say so:
    process 0 runs it (and alone writes the database), every other process follows it."""
    from engine.runner import hosts

    run = COMMANDS[args.command].run
    if not hosts.initialize():
        return run(args)
    if getattr(args, "concurrent", 1) != 1:
        raise CliError("--concurrent must be 1 on several hosts: every process trains the same run at once")
    if not hosts.is_leader():
        return hosts.follow()  # the leader validates the flags (and announces the end if they are bad)
    try:
        return run(args)
    finally:
        hosts.announce(None)


def main(argv=None, *, process: bool = False) -> int:
    """Run the command ``argv`` (default: the command line) and return the exit status.
    ``process``: this call is the whole process (``main_exit``), whose malloc a command that
    trains here sets first (``engine.training.allocator.for_training``)."""
    args = build_parser().parse_args(argv)
    with closing_stores():
        try:
            queued = getattr(args, "queue_only", False)
            if process and args.command in _TRAINS_HERE and not queued:
                from engine.training.allocator import for_training

                for_training()
                freeze_when_training()
            if args.command in _TRAINING and not queued:
                return _on_hosts(args)
            return COMMANDS[args.command].run(args)
        except UserError as e:
            from storage import RunNotFoundError

            text = str(e)
            if isinstance(e, RunNotFoundError):  # "no run …; list the runs …": name the command that lists them
                text = text.split(";")[0] + "; `python -m engine list` shows the ids and names"
            print(f"error: {text}", file=sys.stderr)
            return EXIT_BAD_INPUT
        except BrokenPipeError:  # the reader went away (`engine show 1 | head`): not an error of ours
            return _quiet_broken_pipe()
        except OSError as e:
            where = f" ({e.filename})" if getattr(e, "filename", None) else ""
            print(f"error: {e.strerror or e}{where}; check that the disk has space and the path is writable, "
                  "or point BASIS_LAB_DB_URL / BASIS_LAB_CHECKPOINTS elsewhere", file=sys.stderr)
            return EXIT_BAD_INPUT


def _quiet_broken_pipe() -> int:
    """Exit status after stdout's reader closed the pipe, with nothing printed: stdout is
    pointed at /dev/null so the interpreter's own flush at exit does not fail again
    (Python's documented handling of SIGPIPE, ``signal`` module notes)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout without a file descriptor (an in-process caller's buffer)
        pass
    return EXIT_BROKEN_PIPE


def main_exit() -> None:
    """The ``basis-lab`` console script and ``python -m engine``: ``main()`` as the process
    exit status, in a process whose malloc reuses freed memory when it trains
    (``engine.training.allocator``: it must come before JAX starts its threads).

    Once the command has returned, everything it wrote is flushed and closed and the process
    exits: the objects still alive are ``gc.freeze``d first, so that the interpreter's
    finalization does not traverse them in its collections (0.6–0.9 CPU s after a run, whose
    process holds ~2,000 modules; their memory goes back with the process). ``atexit``
    handlers, the standard streams' flush and thread joins still run."""
    code = main(process=True)
    gc.freeze()
    sys.exit(code)
