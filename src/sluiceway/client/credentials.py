"""The names of a client's credentials, and the older names still accepted for them.

Both client APIs call them `username` and `password`, as the rest of the product does: Open MQ's
connection-factory attributes `imqDefaultUsername` and `imqDefaultPassword`, the users file of
`sluiceway-usermgr`, the admin commands. The pipeline client and the Spark connector first named
them after STOMP's CONNECT headers, `login` and `passcode`; those names stay accepted as aliases
everywhere a credential is given. Giving a name and its alias with different values is an error
naming both, rather than a silent choice of one of them.

A password may also be kept out of the settings (and so out of Spark's plans and pickled
tasks): in a file readable by its owner only, or in an environment variable, both read each time
a connection is made, on the machine that makes it.
"""

from __future__ import annotations

import os
import socket
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from sluiceway.errors import ConfigError

# alias -> name
CREDENTIAL_ALIASES: Final = {"login": "username", "passcode": "password"}
SECRET_NAMES: Final = frozenset({"password", "passcode"})


def credential(name: str, value: str | None, alias: str, alias_value: str | None) -> str | None:
    """The credential given as `name` or as its alias; ConfigError naming both if they differ.

    A password's values are never quoted.
    """
    if alias_value is None or alias_value == value:
        return value
    if value is None:
        return alias_value
    shown = f"{value!r} and {alias_value!r}"
    values = "two different values" if name in SECRET_NAMES else shown
    raise ConfigError(
        name,
        f"{name} and {alias} name the same credential ({alias} is the older name of {name}) "
        f"but were given {values}; give only {name}",
    )


# -- credentials kept out of settings: read where the connection is made ---------------------


def one_source(given: Mapping[str, object]) -> None:
    """ConfigError when more than one of `given` (setting name -> value, None: not given) is
    set: a credential comes from one place, never from a silent choice among several."""
    names = [name for name, value in given.items() if value is not None]
    if len(names) > 1:
        raise ConfigError(
            names[0],
            f"{' and '.join(names)} were given together, but a credential comes from one "
            "source only: give one of them",
        )


def read_password_file(path: str, setting: str, what: str = "password file") -> str:
    """The first line of the file at `path` (a password, without its line end); ConfigError
    naming `setting` when it cannot be read or others than its owner may read it."""
    file = Path(path)
    try:
        mode = file.stat().st_mode
        lines = file.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        reason = error.strerror if isinstance(error, OSError) else "not UTF-8 text"
        raise ConfigError(
            setting, f"cannot read the {what} {path} ({setting}): {reason or error}"
        ) from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(
            setting,
            f"the {what} {path} ({setting}) may be read by others (mode "
            f"{stat.S_IMODE(mode):o}): make it readable by its owner only (chmod 600 {path})",
        )
    return lines[0] if lines else ""


def read_environment(variable: str, setting: str) -> str:
    """The value of the environment variable `variable`; ConfigError naming `setting` when it
    is not set in this process, or holds a line end (a CONNECT header cannot carry one)."""
    value = os.environ.get(variable)
    if value is None:
        raise ConfigError(
            setting,
            f"the environment variable {variable} ({setting}) is not set in this process on "
            f"{socket.gethostname()}: set it wherever a connection is made (for Spark: in the "
            "driver's environment and, on a cluster, the executors', e.g. with "
            f"spark.executorEnv.{variable})",
        )
    if "\n" in value or "\r" in value:
        raise ConfigError(
            setting,
            f"the environment variable {variable} ({setting}) holds a line end, which a CONNECT "
            "header cannot carry: give the credential alone",
        )
    return value
