"""Destination kinds and names, shared by every layer.

On the wire a destination is `/queue/NAME` or `/topic/NAME` (ARCHITECTURE.md, wire contract).
Names are case-sensitive. They may use letters, digits and `.-_$:` characters; `*`, `>` and `#`
are kept for wildcards, white space and control characters are refused, and names beginning with
`mq.` belong to the broker (the dead message queue is `/queue/mq.sys.dmq`).
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
    for prefix, kind in PREFIXES.items():
        if path.startswith(prefix):
            name = path[len(prefix) :]
            validate_name(name)
            return DestinationName(kind, name)
    raise ValueError(
        f"destination {path!r} has an unknown prefix; use /queue/NAME for a queue "
        "or /topic/NAME for a topic"
    )


# The client id prefix of the links between cluster members (cluster.demand): a connection whose
# client id starts with it moves messages between members, so a queue weighs what it sends
# against what this member holds, not the whole cluster's (the message leaves another member).
CLUSTER_LINK_PREFIX: Final = "sluiceway.link."

# The queues a cluster member keeps for subscribers of durable subscriptions that live on
# another member (cluster.durables). Made by the member when such a subscriber attaches, never
# on first use: the links ask every member for them, and only a member that has one serves it.
DURABLE_QUEUE_PREFIX: Final = "sluiceway.durable."
