"""``run``: train one run in the foreground (or queue it for workers)."""

from __future__ import annotations

from engine.cli import arguments
from engine.cli.config_flags import add_config_flags


def register(subparsers) -> None:
    p = subparsers.add_parser("run", parents=[arguments.db_parent()], help="train one run in the foreground",
                              description="Train one run in the foreground. Every run field is a flag.")
    add_config_flags(p, sweep=False)
    arguments.add_launch_options(p)


def run(args) -> int:
    from engine.cli.launch import launch_grid

    return launch_grid(args)
