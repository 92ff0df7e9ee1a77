"""``db``: the database's schema: ``db current`` says where it stands, ``db upgrade`` migrates it.

Opening a database migrates a SQLite file by itself; a PostgreSQL database at an older
schema is refused (every process of every user opens it) until ``db upgrade`` backs it up
and migrates it (:mod:`storage.upgrade`)."""

from __future__ import annotations

from engine.cli import arguments


def register(subparsers) -> None:
    p = subparsers.add_parser("db", help="the database's schema revision: show it, or upgrade it (backup first)",
                              description="Show the schema revision of the database (db current) or migrate it to "
                                          "this BASIS Lab's (db upgrade), after a backup. A SQLite file migrates "
                                          "itself when opened; a shared PostgreSQL database is migrated only here.")
    commands = p.add_subparsers(dest="db_command", required=True)
    commands.add_parser("current", parents=[arguments.db_parent()], help="the schema revision, and whether it is behind",
                        description="Print the database's schema revision and whether it is current, behind this "
                                    "BASIS Lab (run db upgrade) or newer (upgrade BASIS Lab); changes nothing.")
    up = commands.add_parser("upgrade", parents=[arguments.db_parent()],
                             help="back the database up, then migrate it to this BASIS Lab's schema",
                             description="Back the database up (SQLite: beside its file; PostgreSQL: pg_dump into the "
                                         "working directory; or --backup OUT), then run every missing schema revision "
                                         "in one transaction. A failed upgrade changes nothing and removes its backup.")
    up.add_argument("--backup", metavar="OUT", help="file the backup is written to (default: beside a SQLite file, "
                                                     "or <database>.before-<revision>.dump here)")
    up.add_argument("--no-backup", action="store_true", help="migrate without a backup (one you took yourself)")
    arguments.add_force(up, "--backup OUT")


def run(args) -> int:
    from storage.upgrade import schema_status, upgrade

    if args.db_command == "current":
        print(schema_status(args.db).describe())
        return 0
    print(upgrade(args.db, args.backup, force=args.force, keep_backup=not args.no_backup).describe())
    return 0
