"""Queues and topics: where messages wait and how they are shared out.

A queue has one pending list shared by its consumers (Open MQ, reference section 1.4); each message
goes to exactly one consumer, chosen by the queue's dispatch policy (`dispatchPolicy`). A topic
copies a reference to each message into the pending list of every subscriber present when it was
sent; a topic with no subscriber discards the message (and counts it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sluiceway.config import DestinationSettings
from sluiceway.core import dispatch
from sluiceway.core.clock import Clock
from sluiceway.core.message import Message
from sluiceway.core.pending import PendingList
from sluiceway.core.store import MessageStore
from sluiceway.naming import DestinationName

if TYPE_CHECKING:
    from sluiceway.core.subscription import QueueSubscription, TopicSubscription


class DestinationStats:
    """Counters of one destination since it was created (messages and body bytes)."""

    __slots__ = (
        "bytes_in",
        "bytes_out",
        "consumed",
        "discarded",
        "expired",
        "msgs_in",
        "msgs_out",
        "redelivered",
    )

    def __init__(self) -> None:
        self.msgs_in = 0  # accepted from producers
        self.bytes_in = 0
        self.msgs_out = 0  # written to consumers (redeliveries included)
        self.bytes_out = 0
        self.consumed = 0  # acknowledged
        self.redelivered = 0  # given back after delivery (NACK, abort, disconnect)
        self.expired = 0  # removed unconsumed because their `expires` time passed
        self.discarded = 0  # sent to a topic that had no subscriber

    def received(self, message: Message) -> None:
        self.msgs_in += 1
        self.bytes_in += len(message.body)

    def delivered(self, message: Message) -> None:
        self.msgs_out += 1
        self.bytes_out += len(message.body)


class Destination:
    """What queues and topics share: identity, settings, sequence numbers, counters."""

    __slots__ = ("_seq", "clock", "name", "settings", "stats", "store")

    def __init__(
        self,
        name: DestinationName,
        settings: DestinationSettings,
        clock: Clock,
        store: MessageStore,
    ) -> None:
        self.name = name
        self.settings = settings
        self.clock = clock
        self.store = store
        self.stats = DestinationStats()
        self._seq = 0

    def next_seq(self) -> int:
        self._seq += 1
        return self._seq

    @property
    def subscription_count(self) -> int:
        raise NotImplementedError

    @property
    def pending_count(self) -> int:
        """Messages waiting for a consumer (not yet staged to one)."""
        raise NotImplementedError

    def publish(self, message: Message) -> None:
        raise NotImplementedError

    def reap_expired(self, now_ms: int) -> int:
        """Remove expired pending messages; return how many."""
        raise NotImplementedError

    def consumed(self, message: Message) -> None:
        self.stats.consumed += 1

    def expired(self, message: Message) -> None:
        self.stats.expired += 1


class Queue(Destination):
    """Point to point: each message to exactly one consumer."""

    __slots__ = ("_selective", "consumers", "pending", "rotation")

    def __init__(
        self,
        name: DestinationName,
        settings: DestinationSettings,
        clock: Clock,
        store: MessageStore,
    ) -> None:
        super().__init__(name, settings, clock, store)
        self.pending = PendingList()
        self.consumers: list[QueueSubscription] = []
        self.rotation = 0  # where the fair policy starts looking, so ties rotate
        self._selective = 0  # consumers with a selector

    @property
    def subscription_count(self) -> int:
        return len(self.consumers)

    @property
    def pending_count(self) -> int:
        return len(self.pending)

    def publish(self, message: Message) -> None:
        message.seq = self.next_seq()
        self.stats.received(message)
        if message.persistent:
            self.store.message_added(message)
        self.pending.append(message)
        if self.consumers:
            self.dispatch()

    @property
    def selective(self) -> bool:
        """True while some consumer has a selector (dispatch must then scan)."""
        return self._selective > 0

    def attach(self, consumer: QueueSubscription) -> None:
        self.consumers.append(consumer)
        if consumer.selector is not None:
            self._selective += 1

    def detach(self, consumer: QueueSubscription) -> None:
        self.consumers.remove(consumer)
        if consumer.selector is not None:
            self._selective -= 1

    def refill(self, consumer: QueueSubscription) -> None:
        """`consumer` can take more messages: give it what the policy allows."""
        dispatch.refill(self, consumer)

    def give_back(self, messages: list[Message], *, delivered: bool) -> None:
        """Take back messages for delivery again, each at its place in the pending list."""
        for message in messages:
            self.pending.restore(message)
        if delivered:
            self.stats.redelivered += len(messages)
        self.dispatch()

    def consumed(self, message: Message) -> None:
        super().consumed(message)
        if message.persistent:
            self.store.message_removed(message)

    def expired(self, message: Message) -> None:
        super().expired(message)
        if message.persistent:
            self.store.message_removed(message)

    def reap_expired(self, now_ms: int) -> int:
        removed = self.pending.remove_expired(now_ms)
        for message in removed:
            self.expired(message)
        return len(removed)

    def dispatch(self) -> None:
        """Stage pending messages to ready consumers (see `core.dispatch`)."""
        dispatch.dispatch(self)


class Topic(Destination):
    """Publish/subscribe: each message to every subscriber present when it was sent."""

    __slots__ = ("subscribers",)

    def __init__(
        self,
        name: DestinationName,
        settings: DestinationSettings,
        clock: Clock,
        store: MessageStore,
    ) -> None:
        super().__init__(name, settings, clock, store)
        self.subscribers: list[TopicSubscription] = []

    @property
    def subscription_count(self) -> int:
        return len(self.subscribers)

    @property
    def pending_count(self) -> int:
        return sum(len(s.pending) for s in self.subscribers)

    def publish(self, message: Message) -> None:
        message.seq = self.next_seq()
        self.stats.received(message)
        taken = False
        for subscriber in self.subscribers:
            if subscriber.accepts(message):
                subscriber.pending.append(message)
                subscriber.fill()
                taken = True
        if not taken:
            self.stats.discarded += 1  # no subscriber, or none whose selector matches

    def attach(self, subscriber: TopicSubscription) -> None:
        self.subscribers.append(subscriber)

    def detach(self, subscriber: TopicSubscription) -> None:
        self.subscribers.remove(subscriber)

    def reap_expired(self, now_ms: int) -> int:
        count = 0
        for subscriber in self.subscribers:
            for message in subscriber.pending.remove_expired(now_ms):
                self.expired(message)
                count += 1
        return count
