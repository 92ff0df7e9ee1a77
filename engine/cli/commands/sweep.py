"""``sweep``: train (or queue) a grid of runs, estimators × ranks × λs × seeds."""

from __future__ import annotations

from engine.cli import arguments
from engine.cli.config_flags import add_config_flags


def register(subparsers) -> None:
    p = subparsers.add_parser("sweep", parents=[arguments.db_parent()], help="a grid over estimators × ranks × λ × seeds",
                              description="Train a grid of runs: estimators × ranks × λs × seeds, exact once per seed.")
    add_config_flags(p, sweep=True)
    arguments.add_concurrent(p)
    arguments.add_launch_options(p)


def run(args) -> int:
    from engine.cli.launch import launch_grid

    return launch_grid(args)
