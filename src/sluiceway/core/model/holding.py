"""Held SENDs: how a producer is slowed without stopping the connection it shares with consumers.

When a destination cannot take a message yet (full under FLOW_CONTROL, throttled, paused, memory
RED), the SEND is *held*: the broker keeps it, and the producer is owed what the SEND asked for (its
RECEIPT) until the message is accepted. Later SENDs of the same connection queue behind it, so one
producer's messages keep their order. The connection's other frames (ACK, NACK, SUBSCRIBE,
UNSUBSCRIBE, COMMIT, DISCONNECT) are processed as usual, so a connection that produces and consumes
keeps consuming, and the consuming is what makes room.

Every held SEND has a reason (the destination, the limit, since when) and a deadline
(`imq.producer.hold.timeout`), after which it is refused with an error that says what it waited
for. What one connection may have held is bounded (`imq.producer.hold.max_messages` and
`max_bytes`); when it is reached the server stops reading that connection until a SEND is
released, which slows a producer that does not wait for receipts by TCP back-pressure.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from sluiceway.core.model.destination import Destination
from sluiceway.core.values.message import Message
from sluiceway.errors import BrokerError

# Upper bounds (seconds) of the buckets of the hold-time histogram; one more bucket is unbounded.
HOLD_BUCKETS: Final = (0.01, 0.1, 1.0, 10.0, 60.0, 300.0)

# Called once when a held SEND is settled: None when the message was accepted, else the error.
Outcome = Callable[[BrokerError | None], None]


class HeldSend:
    """One SEND the broker keeps until its destination can take the message."""

    __slots__ = (
        "deadline",
        "destination",
        "into",
        "message",
        "on_done",
        "reason",
        "report",
        "since",
    )

    def __init__(
        self,
        destination: Destination,
        message: Message,
        *,
        report: bool,
        reason: BrokerError,
        since: float,
        deadline: float,
        into: Callable[[Message], None] | None = None,
    ) -> None:
        self.destination = destination
        self.message = message
        # Where the message goes once admitted, when not into the destination (a stage).
        self.into = into
        self.report = report  # the producer hears of a refusal (receipt asked, or persistent)
        self.reason = reason  # why it waits (names the destination and the limit)
        self.since = since  # monotonic time it was held
        self.deadline = deadline
        self.on_done: Outcome | None = None  # set by the I/O layer

    def settle(self, error: BrokerError | None) -> None:
        on_done, self.on_done = self.on_done, None
        if on_done is not None:
            on_done(error)


class HeldQueue:
    """The SENDs one connection has held, in arrival order, with their totals."""

    __slots__ = ("bytes", "queue")

    def __init__(self) -> None:
        self.queue: deque[HeldSend] = deque()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self.queue)

    def __bool__(self) -> bool:
        return bool(self.queue)

    def append(self, send: HeldSend) -> None:
        self.queue.append(send)
        self.bytes += send.message.size

    def head(self) -> HeldSend:
        return self.queue[0]

    def popleft(self) -> HeldSend:
        send = self.queue.popleft()
        self.bytes -= send.message.size
        return send

    def clear(self) -> list[HeldSend]:
        sends = list(self.queue)
        self.queue.clear()
        self.bytes = 0
        return sends

    def expired(self, now: float) -> list[HeldSend]:
        """Remove and return the sends whose deadline passed (oldest first)."""
        if not self.queue or self.queue[0].deadline > now:
            return []
        kept: deque[HeldSend] = deque()
        gone: list[HeldSend] = []
        for send in self.queue:
            (gone if send.deadline <= now else kept).append(send)
        self.queue = kept
        self.bytes = sum(s.message.size for s in kept)
        return gone


@dataclass(frozen=True, slots=True)
class HeldProducer:
    """What one held connection waits for, for operators (metrics, `list prd`) and tests."""

    connection: int
    destination: str  # of its oldest held SEND
    reason: str  # summary, e.g. "destination full"
    detail: str  # the full explanation: the destination, the limit and its value
    limit: str | None
    since: float  # monotonic time its oldest held SEND was held
    held_sends: int
    held_bytes: int


class HoldTimes:
    """How long held SENDs waited before they were settled: a histogram over HOLD_BUCKETS."""

    __slots__ = ("buckets", "count", "total")

    def __init__(self) -> None:
        self.buckets = [0] * (len(HOLD_BUCKETS) + 1)  # per bucket, not cumulative
        self.count = 0
        self.total = 0.0  # seconds

    def observe(self, seconds: float) -> None:
        self.buckets[bisect.bisect_left(HOLD_BUCKETS, seconds)] += 1
        self.count += 1
        self.total += seconds


class Sent:
    """What became of a SEND: the message, and its HeldSend while it waits (else None).

    A class, not a named tuple: one is made per SEND, and a named tuple's __new__ is
    interpreted Python even in the compiled build."""

    __slots__ = ("held", "message")

    def __init__(self, message: Message, held: HeldSend | None) -> None:
        self.message = message
        self.held = held

    # Written out, as a named tuple had them (tests compare and print these); not per message.
    def __repr__(self) -> str:
        return f"Sent(message={self.message!r}, held={self.held!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sent):
            return NotImplemented
        return (self.message, self.held) == (other.message, other.held)

    def __hash__(self) -> int:
        return hash((self.message, self.held))
