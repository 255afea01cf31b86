"""`sluiceway dbmgr`: the jdbc store's tables, as Open MQ's imqdbmgr manages them.

    sluiceway dbmgr create tbl     create the tables in an empty database
    sluiceway dbmgr upgrade tbl    upgrade an older schema (a broker does it when it starts, too)
    sluiceway dbmgr show version   the schema version the database holds, and this Sluiceway's
    sluiceway dbmgr show tbl       the version and the rows in each table
    sluiceway dbmgr delete tbl     drop every table, with every cluster's state (asks first; -f)

The database is named as the broker is told of it: `imq.persist.jdbc.postgresql.property.url`,
`.user` and `.password.file`, from `--config FILE` and `-D NAME=VALUE` (which wins), so the
cluster's properties file serves both. Exit status: 0 done; 1 the database refused (unreachable,
a schema newer than this Sluiceway, no tables to upgrade) or deletion was not confirmed; 2 a
usage or configuration error.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Final, TextIO

from sluiceway.config import load_config
from sluiceway.errors import ConfigError

if TYPE_CHECKING:
    from sluiceway.persist.database import Database

URL_PROPERTY: Final = "imq.persist.jdbc.postgresql.property.url"
# Left out of what dbmgr checks: it needs the database, not a broker's identity or store choice.
NOT_CHECKED: Final = ("imq.persist.store=memory", "imq.cluster.ha=false")
VERBS: Final = {
    "create": ("tbl",),
    "upgrade": ("tbl",),
    "show": ("version", "tbl"),
    "delete": ("tbl",),
}


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `dbmgr` to the `sluiceway` command's subcommands."""
    parser = commands.add_parser(
        "dbmgr",
        help="create, upgrade, show or delete the jdbc store's tables (Open MQ's imqdbmgr)",
        description="Manage the jdbc store's tables in PostgreSQL. The database comes from the "
        "broker's properties (imq.persist.jdbc.postgresql.property.url, .user, .password.file), "
        "given with --config and -D. See docs/cli.md.",
    )
    parser.add_argument("verb", choices=list(VERBS), help="create, upgrade, show or delete")
    parser.add_argument("target", choices=["tbl", "version"], help="tbl, or version (show)")
    parser.add_argument("--config", metavar="FILE", help="properties file (Java-properties syntax)")
    parser.add_argument(
        "-D",
        dest="overrides",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="set a property, overriding the file (repeatable), as for `sluiceway broker`",
    )
    parser.add_argument(
        "-f", dest="force", action="store_true", help="delete: do not ask for confirmation"
    )


def run(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    out, err = out or sys.stdout, err or sys.stderr
    targets = VERBS[args.verb]
    if args.target not in targets:
        known = " or ".join(f"`{args.verb} {target}`" for target in targets)
        print(f"sluiceway dbmgr: `{args.verb} {args.target}` is not a command: {known}", file=err)
        return 2
    try:
        database = _database(args)
    except ConfigError as exc:
        print(f"sluiceway dbmgr: configuration error: {exc}", file=err)
        return 2
    # Imported here: the driver and the schema are loaded only when a database is used.
    from sluiceway.persist.database import DatabaseError  # noqa: PLC0415  (late: see above)

    try:
        return _VERB_RUNNERS[args.verb](args, database, out, err)
    except DatabaseError as exc:
        print(f"sluiceway dbmgr: {exc}", file=err)
        return 1


def _database(args: argparse.Namespace) -> Database:
    from sluiceway.persist.database import Database  # noqa: PLC0415  (late: see run)

    config = load_config(args.config, [*args.overrides, *NOT_CHECKED])
    if not config.jdbc_url:
        raise ConfigError(
            URL_PROPERTY,
            f"name the database: -D {URL_PROPERTY}=postgresql://USER@HOST:5432/DATABASE, or "
            "--config FILE with that property",
        )
    return Database.from_config(
        config.jdbc_url, config.jdbc_user, config.jdbc_password_file, config.jdbc_connect_timeout
    )


def _create(args: argparse.Namespace, database: Database, out: TextIO, err: TextIO) -> int:
    from sluiceway.persist.schema import ensure_schema  # noqa: PLC0415  (late: see run)

    before, now = ensure_schema(database)
    if before == now:
        print(f"the tables in {database.shown} are there already (schema version {now})", file=out)
    elif before:
        print(f"upgraded the tables in {database.shown} from version {before} to {now}", file=out)
    else:
        print(f"created the tables in {database.shown} (schema version {now})", file=out)
    return 0


def _upgrade(args: argparse.Namespace, database: Database, out: TextIO, err: TextIO) -> int:
    from sluiceway.persist.schema import ensure_schema  # noqa: PLC0415  (late: see run)

    before, now = ensure_schema(database, create=False)
    if before == now:
        print(f"the tables in {database.shown} are current (schema version {now})", file=out)
    else:
        print(f"upgraded the tables in {database.shown} from version {before} to {now}", file=out)
    return 0


def _show(args: argparse.Namespace, database: Database, out: TextIO, err: TextIO) -> int:
    from sluiceway.persist.schema import SCHEMA_VERSION, show_schema  # noqa: PLC0415  (late)

    state = show_schema(database)
    if not state.version:
        print(f"{database.shown} has no Sluiceway tables (create them: dbmgr create tbl)", file=out)
        return 0
    note = "current" if state.current else f"this Sluiceway's is {SCHEMA_VERSION}"
    print(f"schema version {state.version} in {database.shown} ({note})", file=out)
    if args.target == "tbl":
        width = max(len(table) for table in state.rows)
        for table, rows in state.rows.items():
            print(f"  {table:<{width}}  {rows:>10,} rows", file=out)
    return 0


def _delete(args: argparse.Namespace, database: Database, out: TextIO, err: TextIO) -> int:
    from sluiceway.persist.schema import delete_schema  # noqa: PLC0415  (late: see run)

    if not args.force:
        print(
            f"Delete every Sluiceway table in {database.shown}, with the persistent messages and "
            "state of every broker of every cluster kept there? [y/N] ",
            end="",
            file=out,
            flush=True,
        )
        answer = sys.stdin.readline().strip().lower()
        if answer not in ("y", "yes"):
            print("sluiceway dbmgr: not deleted (confirm with y, or give -f)", file=err)
            return 1
    version = delete_schema(database)
    if version:
        print(f"deleted the tables of {database.shown} (schema version {version})", file=out)
    else:
        print(f"{database.shown} had no Sluiceway tables", file=out)
    return 0


_VERB_RUNNERS: Final = {"create": _create, "upgrade": _upgrade, "show": _show, "delete": _delete}
