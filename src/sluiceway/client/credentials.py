"""The names of a client's credentials, and the older names still accepted for them.

Both client APIs call them `username` and `password`, as the rest of the product does: Open MQ's
connection-factory attributes `imqDefaultUsername` and `imqDefaultPassword`, the users file of
`sluiceway-usermgr`, the admin commands. The pipeline client and the Spark connector first named
them after STOMP's CONNECT headers, `login` and `passcode`; those names stay accepted as aliases
everywhere a credential is given. Giving a name and its alias with different values is an error
naming both, rather than a silent choice of one of them.
"""

from __future__ import annotations

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
