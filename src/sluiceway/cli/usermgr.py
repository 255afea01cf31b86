"""`sluiceway cmd user add|delete|list`: the users file, as Open MQ's imqusermgr manages it.

It works on the file directly (security/users.py), with no broker needed; a running broker
re-reads the file when it changes. Which file: --file PATH, else passwd in --data-dir DIR, else
the one the broker's --config FILE names (imq.user_repository.file.filename), else
./sluiceway-data/passwd, the broker's default.
"""

from __future__ import annotations

import argparse
import getpass
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Final, TextIO

from sluiceway.cli.adminapi import Refused, UsageError
from sluiceway.cli.tables import Column, json_or_text, render

if TYPE_CHECKING:
    from sluiceway.security.users import UserFile

DEFAULT_GROUP: Final = "user"  # imqusermgr's default group; `admin` may use the admin API


def add_parser(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    user = verbs.add_parser(
        "user",
        help="add, delete or list users in the users file (Open MQ's imqusermgr)",
        description="Manage the users file (user names, password hashes, groups). A running "
        "broker re-reads it when it changes. Users in the group admin may use the admin API.",
    )
    actions = user.add_subparsers(dest="action", required=True, metavar="ACTION")
    add = actions.add_parser("add", help="add a user", allow_abbrev=False)
    add.add_argument("-u", dest="user_name", required=True, metavar="NAME")
    add.add_argument(
        "-p",
        dest="password",
        metavar="PASSWORD",
        help="the password (else asked for on a terminal, or read from standard input)",
    )
    add.add_argument(
        "-g",
        dest="groups",
        action="append",
        metavar="GROUP",
        help=f"a group (repeatable; default {DEFAULT_GROUP}); admin may administer the broker",
    )
    add.add_argument(
        "--replace", action="store_true", help="replace the user's password and groups if it exists"
    )
    delete = actions.add_parser("delete", help="delete a user", allow_abbrev=False)
    delete.add_argument("-u", dest="user_name", required=True, metavar="NAME")
    listing = actions.add_parser("list", help="list users and their groups", allow_abbrev=False)
    for parser in (add, delete, listing):
        _location_options(parser)


def _location_options(parser: argparse.ArgumentParser) -> None:
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--file", metavar="PATH", help="the users file")
    where.add_argument("--data-dir", metavar="DIR", help="the broker's data directory (DIR/passwd)")
    where.add_argument("--config", metavar="FILE", help="the broker's properties file")
    parser.add_argument("--json", action="store_true", help="print JSON")


def users_file(args: argparse.Namespace) -> UserFile:
    # Imported here: `sluiceway cmd` talking to a broker needs none of the broker's modules.
    from sluiceway.config import build_config, load_config  # noqa: PLC0415  (late: see above)
    from sluiceway.errors import ConfigError  # noqa: PLC0415  (late: see above)
    from sluiceway.security.users import UserFile, users_path  # noqa: PLC0415  (late)

    if args.file is not None:
        return UserFile(Path(args.file))
    try:
        if args.data_dir is not None:
            config = build_config({"imq.persist.file.directory": args.data_dir})
        else:
            config = load_config(args.config) if args.config is not None else build_config({})
    except ConfigError as exc:
        raise UsageError(f"cannot tell where the users file is: {exc}") from None
    return UserFile(users_path(config))


def run(args: argparse.Namespace, out: TextIO) -> None:
    from sluiceway.errors import ConfigError  # noqa: PLC0415  (late, as in users_file)

    users = users_file(args)
    try:
        if args.action == "list":
            _list(users, args.json, out)
        elif args.action == "add":
            _add(users, args, out)
        else:
            if not users.delete(args.user_name):
                raise Refused(f"no user {args.user_name!r} in {users.path}")
            answer = {"deleted": args.user_name, "file": str(users.path)}
            _done(out, args.json, answer, f"Deleted user {args.user_name} from {users.path}.")
    except (ConfigError, OSError) as exc:
        raise Refused(f"users file {users.path}: {exc}") from None


def _list(users: UserFile, as_json: bool, out: TextIO) -> None:
    rows = [{"name": u.name, "groups": list(u.groups)} for u in users.load().values()]

    def text() -> str:
        if not rows:
            return f"No users in {users.path}."
        columns = (
            Column("User Name", "name", numeric=False),
            Column("Groups", "groups", numeric=False),
        )
        return render(columns, rows)

    json_or_text(out, as_json, rows, text)


def _add(users: UserFile, args: argparse.Namespace, out: TextIO) -> None:
    name = args.user_name
    if name in users.load() and not args.replace:
        raise Refused(f"user {name!r} already exists in {users.path}; add --replace to replace it")
    groups = tuple(dict.fromkeys(args.groups or [DEFAULT_GROUP]))
    password = args.password if args.password is not None else _ask_password(name)
    try:
        users.add(name, password, groups)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    answer = {"added": name, "groups": list(groups), "file": str(users.path)}
    text = f"Added user {name} (groups: {', '.join(groups)}) to {users.path}."
    _done(out, args.json, answer, text)


def _done(out: TextIO, as_json: bool, answer: dict[str, object], text: str) -> None:
    json_or_text(out, as_json, answer, lambda: text, indent=None)


def _ask_password(name: str) -> str:
    """On a terminal, ask twice; otherwise read the first line of standard input."""
    if not sys.stdin.isatty():
        password = sys.stdin.readline().rstrip("\r\n")
        if not password:
            raise UsageError("no password: give -p PASSWORD, or one line on standard input")
        return password
    first = getpass.getpass(f"Password for {name}: ")
    if getpass.getpass("Again: ") != first:
        raise UsageError("the two passwords differ; nothing was changed")
    return first
