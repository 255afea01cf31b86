"""A message held by the broker."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from sluiceway.naming import DestinationName

DEFAULT_PRIORITY = 4  # JMS default priority; STOMP `priority` header, 0 (lowest) to 9 (highest)
MAX_EXPIRES: Final = 2**63 - 1  # `expires` and `timestamp` (ms since the epoch) are kept as an i64


# One message of a packed SEND: body, own headers, priority, expiry (ms; 0: never), persistent.
PackedSend = tuple[bytes, tuple[tuple[str, str], ...], int, int, bool]


@dataclass(slots=True, eq=False, init=False)
class Message:
    """One message, shared (never copied) by every subscription it is delivered to.

    `seq` is the message's position in its destination, increasing in arrival order; it orders
    messages of one priority (FIFO) and puts a returned message back where it was.
    `delivery_count` counts deliveries of a queue message (topic subscriptions count their own).
    """

    id: str
    destination: DestinationName
    body: bytes
    # Application headers as the producer sent them (content-type included), in wire order.
    headers: tuple[tuple[str, str], ...]
    priority: int
    expires: int  # milliseconds since the epoch; 0: never
    persistent: bool
    timestamp: int  # milliseconds since the epoch, when the broker accepted the message
    seq: int = 0
    delivery_count: int = 0
    # Journal bookkeeping (persist.journal_store): the LSN of the record that added the message (0:
    # not in the journal) and the LSNs of records that only matter while the message lives
    # (deliveries, acknowledgements by durable subscriptions).
    location: int = 0
    marks: list[int] | None = None
    dead: bool = False  # a copy went to the dead message queue (a topic's copies share it)
    # The parts of its MESSAGE frame that are the same for every subscriber, encoded once by the
    # server for a topic's fan-out (session.render); None until then.
    wire: tuple[str, bytes] | None = None
    # Pending lists holding this very object in memory (a topic's subscribers share it): the
    # memory ledger counts its cost while this is above 0 (core.containers.pending).
    resident: int = 0

    # Written out, not generated: one is made per message, and a generated __init__ stays
    # interpreted Python in the compiled build (six times the cost of this one compiled).
    def __init__(
        self,
        *,
        id: str,
        destination: DestinationName,
        body: bytes,
        headers: tuple[tuple[str, str], ...],
        priority: int,
        expires: int,
        persistent: bool,
        timestamp: int,
        seq: int = 0,
        delivery_count: int = 0,
        location: int = 0,
        marks: list[int] | None = None,
        dead: bool = False,
        wire: tuple[str, bytes] | None = None,
        resident: int = 0,
    ) -> None:
        self.id = id
        self.destination = destination
        self.body = body
        self.headers = headers
        self.priority = priority
        self.expires = expires
        self.persistent = persistent
        self.timestamp = timestamp
        self.seq = seq
        self.delivery_count = delivery_count
        self.location = location
        self.marks = marks
        self.dead = dead
        self.wire = wire
        self.resident = resident

    @property
    def size(self) -> int:
        """Body size in bytes: what byte limits count."""
        return len(self.body)

    def expired(self, now_ms: int) -> bool:
        return self.expires != 0 and now_ms >= self.expires
