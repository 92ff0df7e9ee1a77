"""``backup``: a consistent copy of the database, while runs keep writing."""

from __future__ import annotations

from engine.cli import arguments


def register(subparsers) -> None:
    p = subparsers.add_parser("backup", parents=[arguments.db_parent()],
                              help="a consistent copy of the database, while runs keep writing",
                              description="Copy the whole database into OUT in one consistent snapshot: SQLite with its "
                                          "backup API (WAL included; open the copy with --db OUT), PostgreSQL with "
                                          "pg_dump (restore with pg_restore). Runs may keep training meanwhile.")
    p.add_argument("out", help="file to write")
    arguments.add_force(p, "OUT")


def run(args) -> int:
    from storage.backup import backup

    store = arguments.open_store(args.db, create=False)
    done = backup(store, args.out, force=args.force)
    print(f"backed up {store.url} to {done.path}: {done.describe()}")
    return 0
