"""How a configuration property is declared, parsed and documented.

Every property is declared once, on the dataclass field it sets (`prop` for broker properties,
`dest_prop` for physical destination properties): its name, the parser of its text value, its
default and its documentation. The reference (docs/configuration.md) and the error messages are
generated from these declarations.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

from sluiceway.naming import DestinationKind

E = TypeVar("E", bound=enum.Enum)


def parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered == "true":
        return True
    if lowered == "false":
        return False
    raise ValueError("true or false")


def int_parser(minimum: int | None = None, maximum: int | None = None) -> Callable[[str], int]:
    """A parser for a decimal integer within [minimum, maximum]."""

    def parse(text: str) -> int:
        bounds = _describe_bounds(minimum, maximum)
        try:
            value = int(text.strip(), 10)
        except ValueError:
            raise ValueError(f"an integer{bounds}") from None
        if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
            raise ValueError(f"an integer{bounds}")
        return value

    return parse


AUTO_FLOW_LIMIT: Final = -2  # consumerFlowLimit=auto, where a flow limit is an int
AUTO_FLOW_TEXT: Final = "auto"


def flow_limit_parser(text: str) -> int:
    """A consumer flow limit: an integer from -1 (0 or -1: no limit), or auto (AUTO_FLOW_LIMIT:
    a window the broker sizes)."""
    if text.strip().lower() == AUTO_FLOW_TEXT:
        return AUTO_FLOW_LIMIT
    try:
        return int_parser(minimum=-1)(text)
    except ValueError:
        raise ValueError("an integer from -1, or auto") from None


def flow_limit_text(value: Any) -> str:
    """A consumer flow limit as it is written (auto for AUTO_FLOW_LIMIT)."""
    return AUTO_FLOW_TEXT if value == AUTO_FLOW_LIMIT else format_default(value)


def float_parser(minimum: float, maximum: float) -> Callable[[str], float]:
    """A parser for a decimal number within [minimum, maximum]."""

    def parse(text: str) -> float:
        try:
            value = float(text.strip())
        except ValueError:
            raise ValueError(f"a number from {minimum} to {maximum}") from None
        if not minimum <= value <= maximum:
            raise ValueError(f"a number from {minimum} to {maximum}")
        return value

    return parse


_SIZE_UNITS: Final = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3}
_SIZE_RE: Final = re.compile(r"^\s*(-?\d+)\s*([bkmgBKMG]?)\s*$")


def size_parser(
    *, allow_unlimited: bool = False, minus_one: str = "unlimited", minimum: int = 0
) -> Callable[[str], int]:
    """Open MQ's size syntax: a number of bytes, or a number with `b`, `k`, `m` or `g` suffix;
    at least `minimum` bytes (or -1, when `allow_unlimited`)."""

    def parse(text: str) -> int:
        accepted = "a size in bytes such as 2048, 512k, 10m or 1g"
        if minimum:
            accepted = f"a size of at least {minimum} bytes such as 2048, 512k, 10m or 1g"
        if allow_unlimited:
            accepted += f" (-1 for {minus_one})"
        match = _SIZE_RE.match(text)
        if match is None:
            raise ValueError(accepted)
        number = int(match.group(1))
        if number == -1 and allow_unlimited:
            return -1
        size = number * _SIZE_UNITS[match.group(2).lower()]
        if size < max(minimum, 0):
            raise ValueError(accepted)
        return size

    return parse


def enum_parser(enum_type: type[E]) -> Callable[[str], E]:
    """A parser accepting the enum's values, case-insensitively."""

    def parse(text: str) -> E:
        wanted = text.strip().lower()
        for member in enum_type:
            if str(member.value).lower() == wanted:
                return member
        raise ValueError("one of " + ", ".join(str(m.value) for m in enum_type))

    return parse


def enum_text_parser(*choices: str) -> Callable[[str], str]:
    """A parser accepting one of `choices`, case-insensitively."""

    def parse(text: str) -> str:
        value = text.strip().lower()
        if value not in choices:
            raise ValueError("one of " + ", ".join(choices))
        return value

    return parse


def parse_path(text: str) -> str:
    path = text.strip()
    if not path:
        raise ValueError("a directory path")
    return path


def parse_host(text: str) -> str:
    host = text.strip()
    if not host or any(c.isspace() for c in host):
        raise ValueError("a host name or IP address, such as 127.0.0.1")
    return host


def parse_log_level(text: str) -> str:
    level = text.strip().upper()
    if level not in {"DEBUG", "INFO", "WARNING", "ERROR"}:
        raise ValueError("one of DEBUG, INFO, WARNING, ERROR")
    return level


def _describe_bounds(minimum: int | None, maximum: int | None) -> str:
    if minimum is not None and maximum is not None:
        return f" from {minimum} to {maximum}"
    if minimum is not None:
        return f" of at least {minimum}"
    if maximum is not None:
        return f" of at most {maximum}"
    return ""


def format_default(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, tuple):  # a comma-separated list
        return ",".join(str(item) for item in value)
    return str(value)


# --------------------------------------------------------------------------- declarations


class _Same:
    """Marks a destination property whose auto-create default is its ordinary default."""


_SAME: Final = _Same()


@dataclass(frozen=True, slots=True)
class PropertyInfo:
    """How one configuration property is named, parsed and documented."""

    name: str
    parse: Callable[[str], Any]
    doc: str
    # For destination properties: the destination kinds the property applies to, and whether its
    # auto-create default is shared by both kinds (imq.autocreate.destination.*) or per kind.
    kinds: frozenset[DestinationKind] = frozenset()
    shared_autocreate: bool = False
    # The default of destinations created on first use, where it differs from admin-created ones.
    autocreate_default: Any = None
    has_autocreate_default: bool = False
    text: Callable[[Any], str] = format_default  # a value as it is written


def prop(name: str, parse: Callable[[str], Any], default: Any, doc: str) -> Any:
    """A dataclass field that is set by broker property `name`."""
    return field(default=default, metadata={"property": PropertyInfo(name, parse, doc)})


def dest_prop(
    name: str,
    parse: Callable[[str], Any],
    default: Any,
    doc: str,
    *,
    kinds: Iterable[DestinationKind] = tuple(DestinationKind),
    shared_autocreate: bool = False,
    autocreate_default: Any = _SAME,
    text: Callable[[Any], str] = format_default,
) -> Any:
    """A dataclass field that is set by physical destination property `name`."""
    info = PropertyInfo(
        name,
        parse,
        doc,
        frozenset(kinds),
        shared_autocreate,
        None if autocreate_default is _SAME else autocreate_default,
        autocreate_default is not _SAME,
        text,
    )
    return field(default=default, metadata={"property": info})
