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
from collections.abc import Callable, Iterable
from typing import Final, Protocol

from sluiceway.config import DispatchPolicy
from sluiceway.core.containers.pending import PRIORITY_LEVELS
from sluiceway.core.model.destination import Destination, Queue, Topic
from sluiceway.core.values.clock import Clock
from sluiceway.core.values.flow import (
    UNLIMITED_STAGING,
    ConsumerFlow,
    ConsumerWindow,
    destination_window,
)
from sluiceway.core.values.message import Message

# Read on every message: a Final name is a C static when compiled (setup.py says why).
_FAIR: Final = DispatchPolicy.FAIR


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


class Subscription:
    """Base of queue and topic subscriptions."""

    __slots__ = (
        "ack_mode",
        "active",
        "connection",
        "delivered",
        "destination",
        "flow",
        "id",
        "number",
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
        self.flow = flow
        self.window = ConsumerWindow(flow)
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
        if not self.active or self.destination.paused_consumers:
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
        for message in messages:
            ledger.let_go(message)
            self.forget(message)
            self.destination.consumed(message)
            count += 1
        self.timed(count)
        self.release(count)

    def timed(self, count: int) -> None:
        """`count` messages were just consumed (before the window releases them)."""

    def give_back(self, messages: list[Message], *, delivered: bool) -> None:
        """Return `messages` to the destination (NACK, abort, disconnect, reclaim)."""
        if not messages:
            return
        ledger = self.destination.context.ledger
        for message in messages:
            ledger.let_go(message)
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
        selected: list[Message] = []
        for key in list(unacked):
            selected.append(unacked.pop(key))
            if key == message_id:
                break
        return selected

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


PACE_WEIGHT = 0.2  # of each new sample in a consumer's moving average of time per message


class QueueSubscription(Subscription):
    """A consumer of a queue: the queue's shared pending list feeds it."""

    __slots__ = ("backup", "busy_since", "pace", "queue")

    def _setup(self) -> None:
        assert isinstance(self.destination, Queue)
        self.queue = self.destination
        self.backup = False  # beyond maxNumActiveConsumers: receives nothing until promoted
        # Under the `fair` policy (core.dispatch): seconds per message this consumer takes, a
        # moving average measured while it has messages outstanding; None until measured.
        self.pace: float | None = None
        self.busy_since: float | None = None  # monotonic time of its last consumption or start

    def timed(self, count: int) -> None:
        if self.queue.settings.dispatch_policy is not _FAIR or not count:
            return
        now = self.connection.clock.monotonic()
        if self.busy_since is not None:
            sample = (now - self.busy_since) / count
            pace = self.pace
            self.pace = sample if pace is None else pace + PACE_WEIGHT * (sample - pace)
        # Idle once it holds nothing more: the wait for its next message is not its pace.
        self.busy_since = now if self.window.outstanding > count else None

    def release(self, count: int) -> None:
        super().release(count)
        if (
            count
            and self.active
            and self.queue.pending
            and self.queue.settings.dispatch_policy is _FAIR
        ):
            # The policy may have held messages back from this consumer before its window was
            # used up (core.dispatch): each consumption makes room for more.
            self.refill()

    def stage(self, message: Message) -> None:
        if self.busy_since is None and self.queue.settings.dispatch_policy is _FAIR:
            self.busy_since = self.connection.clock.monotonic()
        super().stage(message)

    def ready(self) -> bool:
        return not self.backup and super().ready()

    def refill(self) -> None:
        self.queue.refill(self)

    def return_to_source(self, messages: list[Message], *, delivered: bool) -> None:
        self.queue.give_back(messages, delivered=delivered)

    def detach(self) -> None:
        self.queue.detach(self)

    def count_delivery(self, message: Message) -> int:
        # A queue message belongs to one consumer at a time, so the count lives on the message
        # and follows it to the next consumer after a NACK.
        message.delivery_count += 1
        return message.delivery_count

    def note_delivery(self, message: Message) -> None:
        if message.persistent:
            # So that after a crash it comes back marked redelivered.
            self.queue.store.delivered(message)

    def consuming_removes(self) -> bool:
        return True


class TopicSubscription(Subscription):
    """A subscriber of a topic, with its own pending list (messages sent while it was present)."""

    __slots__ = ("_returned", "pending", "topic")

    def _setup(self) -> None:
        assert isinstance(self.destination, Topic)
        self.topic = self.destination
        self.pending = self.topic.context.pending_list()
        # Message id -> deliveries given back, for the few messages NACKed on this subscription;
        # a topic message is shared by all subscribers, so its own count cannot be used.
        self._returned: dict[str, int] = {}

    def count_delivery(self, message: Message) -> int:
        return self._returned.get(message.id, 0) + 1 if self._returned else 1

    def forget(self, message: Message) -> None:
        if self._returned:
            self._returned.pop(message.id, None)
        self.topic.released(message)

    def drop_expired(self, message: Message) -> None:
        super().drop_expired(message)
        self.topic.released(message)

    def refill(self) -> None:
        self.fill()

    def return_to_source(self, messages: list[Message], *, delivered: bool) -> None:
        if not self.active:
            for message in messages:  # a departing subscriber's messages leave with it
                self.topic.released(message)
            return
        for message in messages:
            self.pending.restore(message)
            if delivered:
                self._returned[message.id] = self._returned.get(message.id, 0) + 1
        if delivered:
            self.topic.stats.redelivered += len(messages)
        self.fill()

    def detach(self) -> None:
        self.topic.detach(self)
        self.pending.clear()

    def offer(self, message: Message) -> None:
        """A new message of the topic: staged now when nothing waits before it and the window
        has room (it skips the pending list), otherwise queued and staged by `fill`, once per
        batch while one is open (core.context.Batch)."""
        if not self.pending and not message.expires and self.ready():
            self.stage(message)
            return
        self.pending.append(message)
        if not self.topic.context.batch.defer(self.fill):
            self.fill()

    def fill(self) -> None:
        """Stage messages from this subscriber's own pending list while its window allows."""
        pending = self.pending
        now = self.connection.clock.time_ms()
        while pending and self.ready():
            message = pending.pop()
            assert message is not None
            if message.expires and message.expired(now):
                self.topic.expired(message)
                self.topic.released(message)
                continue
            self.stage(message)


class _Browser(Subscription):
    """What queue and topic browsers share: a sequence range, the end marker, no consuming.

    The end marker is one message with the headers `browser:end`, `next-sequence` (the sequence
    number after the last message the browse returned: where a following read starts),
    `head-sequence` (the last sequence number the destination has handed out), `first-sequence`
    (the oldest one it retains; head-sequence+1 when it retains none), `message-count` (the
    messages waiting in it) and `consumer-flow-limit` (its effective consumerFlowLimit), then
    whatever `end_extra` adds (a topic cursor's position).
    """

    __slots__ = ("_done", "_from", "_last", "_to", "end_extra")

    def _setup(self) -> None:
        assert self.ack_mode is AckMode.AUTO
        self._done = False
        self._from = 0  # first sequence number wanted
        self._to: int | None = None  # first sequence number not wanted
        self._last = 0  # last sequence number returned
        self.end_extra: Callable[[], list[tuple[str, str]]] | None = None

    def set_range(self, start: int, end: int | None) -> None:
        self._from, self._to = start, end

    def in_range(self, message: Message) -> bool:
        return message.seq >= self._from and (self._to is None or message.seq < self._to)

    @property
    def empty_range(self) -> bool:
        """`to-sequence` at or below `from-sequence`: only the end marker is wanted."""
        return self._to is not None and self._to <= self._from

    def _room(self) -> int:
        return self.window.credit if self.window.limit > 0 else UNLIMITED_STAGING

    def retained(self) -> tuple[int | None, int]:
        """The oldest sequence number the destination retains (None: none), and how many
        messages wait in it."""
        raise NotImplementedError

    def end_headers(self) -> list[tuple[str, str]]:
        head = self.destination.last_seq
        first, count = self.retained()
        limit = destination_window(self.destination.settings.consumer_flow_limit)
        headers = [
            ("browser", "end"),
            ("next-sequence", str(max(self._last + 1, self._from))),
            ("head-sequence", str(head)),
            ("first-sequence", str(first if first is not None else head + 1)),
            ("message-count", str(count)),
            ("consumer-flow-limit", str(limit)),
        ]
        if self.end_extra is not None:
            headers.extend(self.end_extra())
        return headers

    def _finish(self) -> None:
        self._done = True
        self.stage(
            Message(
                id=f"{self.destination.name.name}-browser-end-{self.number}",
                destination=self.destination.name,
                body=b"",
                headers=tuple(self.end_headers()),
                priority=0,
                expires=0,
                persistent=False,
                timestamp=self.connection.clock.time_ms(),
            )
        )

    def stage_seen(self, message: Message) -> None:
        self._last = max(self._last, message.seq)
        self.stage(message)

    def write(self, message: Message) -> Delivery:
        # Browsing consumes nothing: the window is released as the message is written.
        self.destination.context.ledger.let_go(message)
        self.release(1)
        return Delivery(self, message, message.delivery_count)

    def written(self, messages: list[Message]) -> None:
        pass  # released by `write` already

    def return_to_source(self, messages: list[Message], *, delivered: bool) -> None:
        pass  # the messages never left their destination

    def detach(self) -> None:
        pass  # a browser is not one of the destination's consumers


class BrowserSubscription(_Browser):
    """A queue browser: the queue's messages in delivery order, without consuming them.

    A cursor (priority, sequence number) walks the queue's pending list, so browsing holds no copy
    of the backlog; messages that arrive behind the cursor while browsing are seen, ones that
    arrive ahead of it are not (JMS allows a browser either view).
    """

    __slots__ = ("_cursor", "queue")

    def _setup(self) -> None:
        super()._setup()
        assert isinstance(self.destination, Queue)
        self.queue = self.destination
        self._cursor = (PRIORITY_LEVELS, 0)  # before the first message

    def refill(self) -> None:
        self.fill()

    def retained(self) -> tuple[int | None, int]:
        # Delivered and leased messages have left the pending list: they do not count.
        pending = self.queue.pending
        return pending.first_seq, len(pending)

    def fill(self) -> None:
        now = self.connection.clock.time_ms()
        while not self._done and self.ready():
            batch = (
                [] if self.empty_range else self.queue.pending.following(self._cursor, self._room())
            )
            if not batch:
                self._finish()
                return
            for message in batch:
                self._cursor = (message.priority, message.seq)
                if not message.expired(now) and self.in_range(message) and self.accepts(message):
                    self.stage_seen(message)


class TopicBrowserSubscription(_Browser):
    """Reads a topic's log (what it retains for durable subscriptions) by sequence number."""

    __slots__ = ("_next", "topic")

    def _setup(self) -> None:
        super()._setup()
        assert isinstance(self.destination, Topic)
        self.topic = self.destination
        self._next = 0

    def set_range(self, start: int, end: int | None) -> None:
        super().set_range(start, end)
        self._next = start

    def refill(self) -> None:
        self.fill()

    def retained(self) -> tuple[int | None, int]:
        log = self.topic.log
        return log.first_seq, len(log)

    def fill(self) -> None:
        now = self.connection.clock.time_ms()
        while not self._done and self.ready():
            batch = self.topic.log.read(self._next, self._room(), self._to)
            if not batch:
                self._finish()
                return
            for message in batch:
                self._next = message.seq + 1
                if not message.expired(now) and self.accepts(message):
                    self.stage_seen(message)
