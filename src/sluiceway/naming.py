"""Destination kinds and names, shared by every layer.

On the wire a destination is `/queue/NAME` or `/topic/NAME` (ARCHITECTURE.md, wire contract).
Names are case-sensitive. They may use letters, digits and `.-_$:` characters; `*`, `>` and `#`
are kept for wildcards, white space and control characters are refused, and names beginning with
`mq.` belong to the broker (the dead message queue is `/queue/mq.sys.dmq`). A pattern
(`parse_pattern`) names several destinations of one kind: `*` stands for one segment of a name
(the parts between dots), `>` for one or more trailing segments.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Final


class DestinationKind(enum.Enum):
    """A point-to-point queue or a publish/subscribe topic."""

    QUEUE = "queue"
    TOPIC = "topic"


MAX_NAME_LENGTH: Final = 200  # long enough for dotted hierarchical names, short enough for logs
_NAME_RE: Final = re.compile(r"^[A-Za-z0-9_$.:\-]+$")
SYSTEM_PREFIX: Final = "mq."
PREFIXES: Final = {"/queue/": DestinationKind.QUEUE, "/topic/": DestinationKind.TOPIC}


def validate_name(name: str) -> None:
    """Raise ValueError saying what is wrong with destination name `name`."""
    if not name:
        raise ValueError("a destination name must not be empty")
    if len(name) > MAX_NAME_LENGTH:
        raise ValueError(
            f"destination name of {len(name)} characters is longer than {MAX_NAME_LENGTH}"
        )
    if _NAME_RE.match(name) is None:
        raise ValueError(
            f"destination name {name!r} may contain only letters, digits and the characters "
            ". - _ $ :"
        )


@dataclass(frozen=True, slots=True)
class DestinationName:
    """A destination's kind and name; `path` is its wire form, e.g. `/queue/orders`."""

    kind: DestinationKind
    name: str
    path: str = field(init=False, repr=False, compare=False)  # written on every MESSAGE: kept

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", f"/{self.kind.value}/{self.name}")

    def __hash__(self) -> int:
        # The path names kind and name together, and a string keeps its hash: a name is a key
        # of many dictionaries on every message's way through the broker.
        return hash(self.path)

    @property
    def is_system(self) -> bool:
        return self.name.startswith(SYSTEM_PREFIX)

    def __str__(self) -> str:
        return self.path


@lru_cache(maxsize=4096)  # every SEND names one; a few names carry most traffic
def parse_destination(path: str) -> DestinationName:
    """Parse `/queue/NAME` or `/topic/NAME`; raise ValueError saying what is accepted."""
    kind, name = _split_path(path)
    validate_name(name)
    return DestinationName(kind, name)


def _split_path(path: str) -> tuple[DestinationKind, str]:
    """The kind a destination's prefix names, and the rest of it."""
    for prefix, kind in PREFIXES.items():
        if path.startswith(prefix):
            return kind, path[len(prefix) :]
    raise ValueError(
        f"destination {path!r} has an unknown prefix; use /queue/NAME for a queue "
        "or /topic/NAME for a topic"
    )


# Wildcards of a destination pattern (`/queue/orders.*`): each stands for whole segments of a
# name, the parts between its dots. `#` is reserved and means nothing yet.
ONE_SEGMENT: Final = "*"  # exactly one segment
REST: Final = ">"  # one or more trailing segments: only as the last segment
_RESERVED: Final = "#"


@dataclass(frozen=True, slots=True)
class DestinationPattern:
    """A destination name, or one with wildcards, of one kind: `/topic/orders.*`,
    `/queue/orders.>`. A wildcard never matches a name of the broker's own (`mq.`): only a
    pattern whose first segment is `mq` does."""

    kind: DestinationKind
    name: str
    path: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", f"/{self.kind.value}/{self.name}")

    @property
    def is_wildcard(self) -> bool:
        return ONE_SEGMENT in self.name or REST in self.name

    def matches(self, name: DestinationName) -> bool:
        if name.kind is not self.kind:
            return False
        if not self.is_wildcard:
            return name.name == self.name
        wanted, found = self.name.split("."), name.name.split(".")
        if name.is_system and wanted[0] != "mq":
            return False
        if wanted[-1] == REST:
            wanted = wanted[:-1]
            if len(found) <= len(wanted):
                return False
            found = found[: len(wanted)]
        elif len(found) != len(wanted):
            return False
        return all(w in (ONE_SEGMENT, f) for w, f in zip(wanted, found, strict=True))

    def __str__(self) -> str:
        return self.path


def parse_pattern(path: str) -> DestinationPattern:
    """Parse `/queue/NAME` or `/topic/NAME` where NAME may have wildcard segments (`*`: one
    segment, `>`: the rest, last only); raise ValueError saying what is wrong."""
    kind, name = _split_path(path)
    _validate_pattern(name)
    return DestinationPattern(kind, name)


def _validate_pattern(name: str) -> None:
    if _RESERVED in name:
        raise ValueError(
            f"destination {name!r}: '#' is reserved; use * for one segment of a name, > for "
            "the rest"
        )
    segments = name.split(".")
    for index, segment in enumerate(segments):
        wild = ONE_SEGMENT in segment or REST in segment
        if wild and segment not in (ONE_SEGMENT, REST):
            raise ValueError(
                f"destination {name!r}: a wildcard stands for a whole segment between dots, "
                f"as in orders.* or orders.>; got {segment!r}"
            )
        if segment == REST and index != len(segments) - 1:
            raise ValueError(f"destination {name!r}: > stands for the rest of a name: last only")
    # The literal parts follow the rules of names: checked with each wildcard as one letter.
    validate_name(".".join("x" if s in (ONE_SEGMENT, REST) else s for s in segments))


# The client id prefix of the links between cluster members (cluster.demand): a connection whose
# client id starts with it moves messages between members, so a queue weighs what it sends
# against what this member holds, not the whole cluster's (the message leaves another member).
CLUSTER_LINK_PREFIX: Final = "sluiceway.link."

# The queues a cluster member keeps for subscribers of durable subscriptions that live on
# another member (cluster.durables). Made by the member when such a subscriber attaches, never
# on first use: the links ask every member for them, and only a member that has one serves it.
DURABLE_QUEUE_PREFIX: Final = "sluiceway.durable."
