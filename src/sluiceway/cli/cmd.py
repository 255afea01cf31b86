"""`sluiceway cmd`: Open MQ's imqcmd for Sluiceway, over the broker's admin API.

    sluiceway cmd VERB OBJECT [options]      e.g. sluiceway cmd pause dst -t q -n orders

The verbs, objects and flags are imqcmd's (`list dst -t q`, `metrics dst -m rts -int 5`, `-b
host:port`, `-u admin -passfile FILE`); `user add|delete|list` manages the users file as
imqusermgr does. Exit status: 0 done; 1 refused by the broker (or the users file), nothing
changed; 2 usage error; 3 cannot reach the broker's admin API.
"""

from __future__ import annotations

import argparse
import getpass
import os
import sys
from collections.abc import Callable
from typing import Any, Final

from sluiceway.cli import metrics, usermgr, verbs
from sluiceway.cli.adminapi import (
    DEFAULT_ADDRESS,
    PASSWORD_ENV,
    AdminApi,
    CmdError,
    UsageError,
    parse_address,
    password_from_environment,
    read_passfile,
)
from sluiceway.cli.verbs import Context

EXIT_OK: Final = 0
EXIT_REFUSED: Final = 1
EXIT_USAGE: Final = 2
EXIT_UNREACHABLE: Final = 3

# verb -> (objects it takes, options it has, help)
VERBS: Final[dict[str, tuple[tuple[str, ...], str, str]]] = {
    "list": (
        ("dst", "cxn", "dur", "bkr"),
        "t",
        "list destinations, connections, durable subscriptions or the cluster's brokers",
    ),
    "query": (("dst", "bkr"), "tn", "show a destination's or the broker's state and properties"),
    "create": (("dst",), "tno", "create a destination"),
    "update": (("dst", "bkr"), "tno", "change a destination's or the broker's properties"),
    "destroy": (
        ("dst", "dur", "cxn"),
        "tnfcR",
        "destroy a destination, a durable subscription or a connection",
    ),
    "pause": (("dst",), "tnP", "pause one destination, or all"),
    "resume": (("dst",), "tn", "resume one destination, or all"),
    "purge": (("dst",), "tnf", "remove the messages waiting in a destination"),
    "compact": (("dst",), "tn", "reclaim the journal's disk space now"),
    "metrics": (("bkr", "dst", "svc"), "tnmis", "show metrics, once or every -int seconds"),
}
# The options by letter: (attribute, flag as shown in messages).
OPTIONS: Final = {
    "t": ("type", "-t"),
    "n": ("name", "-n"),
    "o": ("properties", "-o"),
    "f": ("force", "-f"),
    "c": ("client_id", "-c"),
    "P": ("pause_target", "-pst"),
    "m": ("metric", "-m"),
    "i": ("interval", "-int"),
    "s": ("samples", "-msp"),
    "R": ("reason", "-reason"),
}
# (verb, object) -> (required options, optional options); "tn?" means -t and -n together or not.
RULES: Final = {
    ("list", "dst"): ("", "t"),
    ("list", "cxn"): ("", ""),
    ("list", "dur"): ("", ""),
    ("list", "bkr"): ("", ""),
    ("query", "dst"): ("tn", ""),
    ("query", "bkr"): ("", ""),
    ("create", "dst"): ("tn", "o"),
    ("update", "dst"): ("tno", ""),
    ("update", "bkr"): ("o", ""),
    ("destroy", "dst"): ("tn", "f"),
    ("destroy", "dur"): ("nc", "f"),
    ("destroy", "cxn"): ("n", "fR"),
    ("pause", "dst"): ("", "tn?P"),
    ("resume", "dst"): ("", "tn?"),
    ("purge", "dst"): ("tn", "f"),
    ("compact", "dst"): ("", "tn?"),
    ("metrics", "bkr"): ("", "mis"),
    ("metrics", "dst"): ("tn", "mis"),
    ("metrics", "svc"): ("", "nmis"),
}
HANDLERS: Final[dict[tuple[str, str], Callable[[Context], None]]] = {
    ("list", "dst"): verbs.list_dst,
    ("list", "cxn"): verbs.list_cxn,
    ("list", "dur"): verbs.list_dur,
    ("list", "bkr"): verbs.list_bkr,
    ("query", "dst"): verbs.query_dst,
    ("query", "bkr"): verbs.query_bkr,
    ("create", "dst"): verbs.create_dst,
    ("update", "dst"): verbs.update_dst,
    ("update", "bkr"): verbs.update_bkr,
    ("destroy", "dst"): verbs.destroy_dst,
    ("destroy", "dur"): verbs.destroy_dur,
    ("destroy", "cxn"): verbs.destroy_cxn,
    ("pause", "dst"): verbs.pause_dst,
    ("resume", "dst"): verbs.resume_dst,
    ("purge", "dst"): verbs.purge_dst,
    ("compact", "dst"): verbs.compact_dst,
    ("metrics", "bkr"): metrics.run,
    ("metrics", "dst"): metrics.run,
    ("metrics", "svc"): metrics.run,
}
METRIC_TYPES: Final = {
    "bkr": ("ttl", "rts", "cxn", "dsk"),
    "dst": ("ttl", "rts", "con"),
    "svc": ("ttl", "rts", "cxn"),
}
EPILOG: Final = (
    "exit status: 0 done; 1 refused by the broker (nothing changed); 2 usage error; "
    "3 cannot reach the broker's admin API. See docs/admin.md."
)


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `cmd` and its verbs to the `sluiceway` command's subcommands."""
    parser = commands.add_parser(
        "cmd",
        help="administer a running broker (Open MQ's imqcmd), manage users",
        description="Administer a running broker over its admin API, with imqcmd's verbs and "
        "flags: sluiceway cmd VERB OBJECT [options], e.g. `sluiceway cmd list dst -t q`.",
        epilog=EPILOG,
    )
    verbs_parsers = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    connection = _connection_options()
    for verb, (objects, letters, help_text) in VERBS.items():
        sub = verbs_parsers.add_parser(
            verb,
            help=help_text,
            description=f"{help_text[0].upper()}{help_text[1:]}: " + _forms(verb),
            parents=[connection],
            allow_abbrev=False,
            epilog=EPILOG,
        )
        sub.add_argument("object", choices=objects, metavar="|".join(objects))
        for letter in letters:
            _add_option(sub, letter)
    usermgr.add_parser(verbs_parsers)


def _forms(verb: str) -> str:
    return "; ".join(_form(name, obj) for name, obj in RULES if name == verb) + "."


def _form(verb: str, obj: str) -> str:
    """`verb obj` with its options, as the help and the usage errors show it."""
    required, optional = RULES[(verb, obj)]
    words = [f"{verb} {obj}"]
    words += [_flag_usage(letter, obj) for letter in required]
    words += [f"[{_flag_usage(letter, obj)}]" for letter in optional.replace("?", "")]
    return " ".join(words)


def _flag_usage(letter: str, obj: str) -> str:
    if letter == "m":
        return "-m " + "|".join(METRIC_TYPES[obj])
    if letter == "n" and obj == "cxn":
        return "-n ID"
    return {
        "t": "-t q|t",
        "n": "-n NAME",
        "o": "-o NAME=VALUE...",
        "f": "-f",
        "c": "-c CLIENT_ID",
        "P": "-pst PRODUCERS|CONSUMERS|ALL",
        "i": "-int SECONDS",
        "s": "-msp COUNT",
        "R": "-reason TEXT",
    }[letter]


def _connection_options() -> argparse.ArgumentParser:
    parent = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    group = parent.add_argument_group("connection")
    group.add_argument(
        "-b",
        dest="broker",
        default=DEFAULT_ADDRESS,
        metavar="HOST:PORT",
        help=f"the broker's admin address (imq.admin.http.port; default {DEFAULT_ADDRESS})",
    )
    group.add_argument("-u", dest="user", metavar="USER", help="an administrator's user name")
    group.add_argument(
        "-passfile",
        metavar="FILE",
        help="file holding the password (imq.imqcmd.password=..., or just the password); "
        f"else ${PASSWORD_ENV}, else a prompt",
    )
    group.add_argument("--tls", action="store_true", help="use HTTPS (imq.admin.tls)")
    group.add_argument("--cafile", metavar="FILE", help="CA certificates to verify the broker")
    group.add_argument(
        "--timeout", type=_positive(float), default=10.0, metavar="SECONDS", help="default 10"
    )
    group.add_argument("--json", action="store_true", help="print the API's JSON answer")
    return parent


def _add_option(parser: argparse.ArgumentParser, letter: str) -> None:
    attribute, flag = OPTIONS[letter]
    parser.add_argument(flag, dest=attribute, **_option_settings()[letter])


def _option_settings() -> dict[str, dict[str, Any]]:
    """argparse settings of each option, by letter."""
    return {
        "t": {"type": _destination_type, "metavar": "q|t", "help": "queue or topic"},
        "n": {
            "metavar": "NAME",
            "help": "destination (dur: subscription; svc: service; cxn: connection ID)",
        },
        "c": {"metavar": "CLIENT_ID", "help": "the durable subscriber's client-id"},
        "o": {"action": "append", "default": [], "metavar": "NAME=VALUE", "help": "repeatable"},
        "f": {"action": "store_true", "help": "do not ask for confirmation"},
        "P": {
            "type": str.upper,
            "choices": ("PRODUCERS", "CONSUMERS", "ALL"),
            "help": "default ALL",
        },
        "m": {"choices": ("ttl", "rts", "cxn", "con", "dsk"), "help": "default ttl"},
        "i": {"type": _positive(int), "metavar": "SECONDS", "help": "default 5"},
        "s": {
            "type": _positive(int),
            "metavar": "COUNT",
            "help": "default 1, or until Ctrl-C when -int is given",
        },
        "R": {"metavar": "TEXT", "help": "why, sent to the client (one line)"},
    }


def _destination_type(text: str) -> str:
    kinds = {"q": "queue", "queue": "queue", "t": "topic", "topic": "topic"}
    kind = kinds.get(text.lower())
    if kind is None:
        raise argparse.ArgumentTypeError(f"{text!r}: use q (queue) or t (topic)")
    return kind


def _positive(kind: Callable[[str], int | float]) -> Callable[[str], int | float]:
    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{text!r}: must be more than 0")
        return value

    return parse


def run(args: argparse.Namespace) -> int:
    """Run the verb; report a failure in one line on stderr and return the exit status."""
    try:
        if args.verb == "user":
            usermgr.run(args, sys.stdout)
        else:
            check_options(args)
            HANDLERS[(args.verb, args.object)](Context(connect(args), args, sys.stdout))
    except CmdError as exc:
        print(f"sluiceway cmd: {exc}", file=sys.stderr)
        return exc.exit_status
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`metrics -int 5 | head`): nothing more to say to it, and the
        # interpreter must not complain either when it flushes stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return EXIT_OK


def check_options(args: argparse.Namespace) -> None:
    """imqcmd's rules: which options each verb and object needs or takes."""
    verb, obj = args.verb, args.object
    required, optional = RULES[(verb, obj)]
    given = {letter for letter in VERBS[verb][1] if _given(args, letter)}
    forms = f" (usage: {_form(verb, obj)})"
    missing = [OPTIONS[letter][1] for letter in required if letter not in given]
    if missing:
        raise UsageError(f"{verb} {obj} needs {' and '.join(missing)}{forms}")
    extra = [OPTIONS[letter][1] for letter in sorted(given - set(required + optional))]
    if extra:
        raise UsageError(f"{verb} {obj} takes no {', '.join(extra)}{forms}")
    if "tn?" in optional and len(given & {"t", "n"}) == 1:
        raise UsageError(
            f"{verb} {obj}: give -t and -n for one destination, or neither for all of them"
        )


def _given(args: argparse.Namespace, letter: str) -> bool:
    value = getattr(args, OPTIONS[letter][0])
    return value not in (None, False, [])


def connect(args: argparse.Namespace) -> AdminApi:
    address = parse_address(args.broker)
    password = None
    if args.user is not None:
        password = _password(args)
    elif args.passfile is not None:
        raise UsageError("-passfile needs -u USER (the administrator it is the password of)")
    return AdminApi(
        address,
        tls=args.tls,
        cafile=args.cafile,
        user=args.user,
        password=password,
        timeout=args.timeout,
    )


def _password(args: argparse.Namespace) -> str:
    if args.passfile is not None:
        return read_passfile(args.passfile)
    password = password_from_environment()
    if password is not None:
        return password
    if sys.stdin.isatty():
        return getpass.getpass(f"Password for {args.user}: ")
    raise UsageError(
        f"no password for {args.user}: give -passfile FILE or set {PASSWORD_ENV} "
        "(there is no terminal to ask on)"
    )
