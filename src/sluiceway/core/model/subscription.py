"""A subscription: one consumer's window, its staged messages and its unacknowledged ones.

Messages move through a subscription in three steps. The destination *stages* a message (takes
window credit; the message is now the subscription's); the connection *writes* it (a Delivery,
rendered as a MESSAGE frame); the client *consumes* it (ACK, the COMMIT of a transaction that acked
it, or, with `ack:auto`, the write itself). NACK, UNSUBSCRIBE and disconnect give messages back to
the destination.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Iterable
from typing import Protocol

from sluiceway.core.model.destination import Destination
from sluiceway.core.values.clock import Clock
from sluiceway.core.values.flow import (
    AUTO_EVALUATE_S,
    UNLIMITED_STAGING,
    AutoWindow,
    ConsumerFlow,
    ConsumerWindow,
)
from sluiceway.core.values.memory import message_cost
from sluiceway.core.values.message import Message


class AckMode(enum.Enum):
    """STOMP acknowledgement modes (SUBSCRIBE `ack` header)."""

    AUTO = "auto"  # consumed when written to the connection
    CLIENT = "client"  # an ACK acknowledges every earlier message of the subscription too
    CLIENT_INDIVIDUAL = "client-individual"  # an ACK acknowledges one message


class MessageFilter(Protocol):
    """A compiled message selector."""

    text: str

    def matches(self, message: Message) -> bool: ...


class Outlet:
    """The client connection a subscription's messages go out through (core.connection), as the
    subscription sees it: the connection's flow limit and write readiness, and its turn-taking
    among its subscriptions.

    A base class for the connection rather than a Protocol: a subscription calls these for every
    message it is given, and the compiled build calls a base class's methods directly."""

    number: int  # unique within the broker
    clock: Clock

    def can_stage(self) -> bool:
        """Whether any subscription of this connection may be given a message now."""
        raise NotImplementedError

    def staged_one(self, subscription: Subscription) -> None:
        """`subscription` was given one more message."""
        raise NotImplementedError

    def mark_busy(self, subscription: Subscription) -> None:
        """`subscription` has staged messages now (it had none)."""
        raise NotImplementedError

    def released(self, count: int) -> None:
        """`count` messages left this connection's subscriptions (consumed or given back)."""
        raise NotImplementedError


PACE_WEIGHT = 0.2  # of each new sample in a consumer's moving average of time per message


class Subscription:
    """Base of queue and topic subscriptions."""

    __slots__ = (
        "ack_mode",
        "active",
        "auto",
        "busy_since",
        "connection",
        "delivered",
        "destination",
        "flow",
        "id",
        "number",
        "pace",
        "paused_since",
        "selector",
        "staged",
        "unacked",
        "window",
    )

    def __init__(
        self,
        *,
        sub_id: str,
        number: int,
        connection: Outlet,
        destination: Destination,
        ack_mode: AckMode,
        flow: ConsumerFlow,
        selector: MessageFilter | None = None,
    ) -> None:
        self.id = sub_id
        self.selector = selector
        self.number = number  # unique within the connection; part of STOMP 1.2 ack ids
        self.connection = connection
        self.destination = destination
        self.ack_mode = ack_mode
        if flow.auto and ack_mode is AckMode.AUTO:
            flow = flow.fixed()  # nothing is acknowledged: nothing to measure a window by
        self.flow = flow
        self.window = ConsumerWindow(flow)
        # An adaptive window's measurements (consumerFlowLimit=auto), or None.
        self.auto: AutoWindow | None = None
        if flow.auto:
            self.auto = AutoWindow(flow, destination.context.ledger.policy.budget)
        # Seconds per message this consumer takes, a moving average measured while it has
        # messages outstanding (for an adaptive window and the `fair` dispatch policy); None
        # until measured. `busy_since`: monotonic time of its last consumption or start.
        self.pace: float | None = None
        self.busy_since: float | None = None
        self.staged: deque[Message] = deque()  # bounded by the window (or UNLIMITED_STAGING)
        self.unacked: dict[str, Message] = {}  # written, not consumed; in delivery order
        self.active = True
        self.paused_since: float | None = None  # monotonic time the window was used up
        self.delivered = 0  # messages written to it (redeliveries included)
        self._setup()

    def _setup(self) -> None:
        """Per-kind state; called at the end of __init__."""

    # -- readiness ---------------------------------------------------------------------------

    def accepts(self, message: Message) -> bool:
        """Whether this subscription's selector (if any) matches `message`."""
        return self.selector is None or self.selector.matches(message)

    def ready(self) -> bool:
        """May the destination stage another message here now?"""
        return not self.destination.paused_consumers and self.has_room()

    def has_room(self) -> bool:
        """Whether this subscription and its connection may take another message now."""
        if not self.active:
            return False
        window = self.window
        if window.limit > 0:
            if window.credit <= 0:
                return False
        elif len(self.staged) >= UNLIMITED_STAGING:
            return False
        return self.connection.can_stage()

    # -- the three steps ---------------------------------------------------------------------

    def stage(self, message: Message) -> None:
        """The destination gives this subscription `message` (counted in the memory ledger
        until it leaves the subscription)."""
        self.destination.context.ledger.hold(message)
        self.window.take()
        auto = self.auto
        if auto is not None:
            if self.busy_since is None:
                self.busy_since = self.connection.clock.monotonic()
            auto.staged(message_cost(len(message.body)))
        if self.window.paused:
            self.paused_since = self.connection.clock.monotonic()
        self.connection.staged_one(self)
        self.staged.append(message)
        if len(self.staged) == 1:
            self.connection.mark_busy(self)

    def write(self, message: Message) -> Delivery:
        """`message`, taken from `staged`, is being written to the client (with ack:auto,
        `written` consumes it together with the rest of its batch)."""
        count = self.count_delivery(message)
        self.delivered += 1
        self.destination.stats.delivered(message)
        if self.ack_mode is not AckMode.AUTO:
            auto = self.auto
            if auto is not None and auto.probe is None:
                auto.start_probe(message, self.connection.clock.monotonic(), len(self.unacked))
            self.unacked[message.id] = message
            self.note_delivery(message)
        return Delivery(self, message, count)

    def written(self, messages: list[Message]) -> None:
        """With ack:auto, `messages` of one take were written: they are consumed now."""
        self.consumed(messages)

    def consumed(self, messages: Iterable[Message]) -> None:
        """The client consumed `messages` (already removed from `unacked`)."""
        count = 0
        ledger = self.destination.context.ledger
        auto = self.auto
        probe = auto.probe if auto is not None else None
        probed = False
        for message in messages:
            ledger.let_go(message)
            self.forget(message)
            self.destination.consumed(message)
            count += 1
            if message is probe:
                probed = True
        if probed and auto is not None:
            # With the pace as it was: this consumption's own sample of it is not work alone
            # when the probe was the first message of a busy spell.
            auto.end_probe(self.connection.clock.monotonic(), self.pace)
        self.timed(count)
        if auto is not None and count:
            self.adapt(auto, probed)
        self.release(count)

    def measures_pace(self) -> bool:
        """Whether this consumer's pace is measured (an adaptive window; queues: `fair`)."""
        return self.auto is not None

    def timed(self, count: int) -> None:
        """`count` messages were just consumed (before the window releases them): one sample
        of this consumer's pace."""
        if not count or not self.measures_pace():
            return
        now = self.connection.clock.monotonic()
        if self.busy_since is not None:
            sample = (now - self.busy_since) / count
            pace = self.pace
            self.pace = sample if pace is None else pace + PACE_WEIGHT * (sample - pace)
        # Idle once it holds nothing more: the wait for its next message is not its pace.
        self.busy_since = now if self.window.outstanding > count else None

    def adapt(self, auto: AutoWindow, probed: bool) -> None:
        """Messages were consumed: size the adaptive window again (at most every
        AUTO_EVALUATE_S, and whenever a round trip was measured)."""
        now = self.connection.clock.monotonic()
        if not probed and now - auto.evaluated_at < AUTO_EVALUATE_S:
            return
        self.resize(auto.size(self.pace), now)

    def review_window(self, now: float) -> None:
        """The broker's tick: a consumer that has held a message longer than its pace is taken
        to be that slow now (no acknowledgement arrives to say so), and its window is sized
        again."""
        auto = self.auto
        if auto is None or not self.active:
            return
        pace = self.pace
        since = self.busy_since
        if since is not None and self.window.outstanding and pace is not None:
            pace = max(pace, now - since)
        self.resize(auto.size(pace), now)

    def resize(self, limit: int, now: float) -> None:
        """Give the adaptive window `limit` messages (credit again may bring more at once)."""
        auto = self.auto
        assert auto is not None
        auto.evaluated_at = now
        window = self.window
        if window.resize(limit, self.flow.threshold):
            self.paused_since = None
            if self.active:
                self.refill()
        elif window.credit == 0 and self.paused_since is None:
            self.paused_since = now

    def give_back(self, messages: list[Message], *, delivered: bool) -> None:
        """Return `messages` to the destination (NACK, abort, disconnect, reclaim)."""
        if not messages:
            return
        ledger = self.destination.context.ledger
        for message in messages:
            ledger.let_go(message)
        if self.auto is not None:
            self.auto.drop_probe(messages)
        self.return_to_source(messages, delivered=delivered)
        self.release(len(messages))

    def drop_expired(self, message: Message) -> None:
        """A staged message expired before it could be written: never deliver it."""
        self.destination.context.ledger.let_go(message)
        self.destination.expired(message)
        self.release(1)

    def release(self, count: int) -> None:
        """`count` messages left this subscription's window."""
        if count == 0:
            return
        self.connection.released(count)
        if self.window.release(count):
            self.paused_since = None
            if self.active:
                self.refill()

    # -- acknowledgement helpers ---------------------------------------------------------------

    def select(self, message_id: str) -> list[Message] | None:
        """Remove and return the messages an ACK or NACK of `message_id` covers, or None.

        `ack:client` is cumulative: it covers every earlier unacknowledged message of this
        subscription too (STOMP 1.2, "SUBSCRIBE ack Header").
        """
        unacked = self.unacked
        if message_id not in unacked:
            return None
        if self.ack_mode is not AckMode.CLIENT:
            return [unacked.pop(message_id)]
        # The keys first, then the pops: the walk stops at `message_id`, so an ACK per message
        # costs one step, not a copy of every key awaiting acknowledgement.
        covered: list[str] = []
        for key in unacked:
            covered.append(key)
            if key == message_id:
                break
        return [unacked.pop(key) for key in covered]

    def close(self) -> None:
        """Detach; every staged and unacknowledged message goes back to the destination."""
        self.active = False
        staged = list(self.staged)
        self.staged.clear()
        unacked = list(self.unacked.values())
        self.unacked.clear()
        self.give_back(staged, delivered=False)
        self.give_back(unacked, delivered=True)
        self.detach()

    def reclaim_staged(self) -> int:
        """Give staged, unwritten messages back so other consumers can have them."""
        staged = list(self.staged)
        self.staged.clear()
        self.give_back(staged, delivered=False)
        return len(staged)

    # -- per kind ------------------------------------------------------------------------------

    def refill(self) -> None:
        """The window has room again: ask the destination for more."""
        raise NotImplementedError

    def return_to_source(self, messages: list[Message], *, delivered: bool) -> None:
        """Hand `messages` back to where they came from for delivery again."""
        raise NotImplementedError

    def detach(self) -> None:
        """Leave the destination."""
        raise NotImplementedError

    def count_delivery(self, message: Message) -> int:
        """Record one more delivery of `message`; return its delivery number (1 = first)."""
        raise NotImplementedError

    def forget(self, message: Message) -> None:
        """`message` was consumed: drop any per-message bookkeeping."""

    def note_delivery(self, message: Message) -> None:
        """`message` was written and awaits acknowledgement (the store may want to know)."""

    def consuming_removes(self) -> bool:
        """Whether consuming a message here takes it out of the store: a queue's message, not a
        topic's (its log keeps it until every durable subscription is past it)."""
        return False


class Delivery:
    """One message written to one subscription; `delivery_count` is 1 on the first delivery.

    A class, not a named tuple: one is made per delivery, and a named tuple's __new__ is
    interpreted Python even in the compiled build."""

    __slots__ = ("delivery_count", "message", "subscription")

    def __init__(self, subscription: Subscription, message: Message, delivery_count: int) -> None:
        self.subscription = subscription
        self.message = message
        self.delivery_count = delivery_count

    # Written out, as a named tuple had them (tests compare and print these); not per message.
    def __repr__(self) -> str:
        return (
            f"Delivery(subscription={self.subscription.id!r}, message={self.message.id!r}, "
            f"delivery_count={self.delivery_count})"
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Delivery):
            return NotImplemented
        return (self.subscription, self.message, self.delivery_count) == (
            other.subscription,
            other.message,
            other.delivery_count,
        )

    def __hash__(self) -> int:
        return hash((self.subscription, self.message, self.delivery_count))
