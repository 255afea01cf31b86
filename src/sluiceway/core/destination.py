"""Queues and topics: where messages wait and how they are shared out.

A queue has one pending list shared by its consumers (Open MQ, reference section 1.4); each message
goes to exactly one consumer, chosen by the queue's dispatch policy (`dispatchPolicy`). A topic
copies a reference to each message into the pending list of every subscriber present when it was
sent; a topic with no subscriber discards the message (and counts it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from sluiceway.config import DestinationSettings
from sluiceway.core import dispatch
from sluiceway.core.context import Context
from sluiceway.core.message import Message
from sluiceway.core.seqlog import SeqLog
from sluiceway.naming import DestinationName

# Sequence numbers are reserved in the store this many at a time, so a restarted broker never
# hands out a number it handed out before, at the cost of one small record per block.
SEQ_BLOCK: Final = 1000

if TYPE_CHECKING:
    from sluiceway.core.durable import DurableState
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

    __slots__ = ("_reserved", "_seq", "clock", "context", "name", "settings", "stats", "store")

    def __init__(
        self, name: DestinationName, settings: DestinationSettings, context: Context
    ) -> None:
        self.name = name
        self.settings = settings
        self.context = context
        self.clock = context.clock
        self.store = context.store
        self.stats = DestinationStats()
        self._seq = 0  # the last sequence number handed out
        self._reserved = 0  # handed out up to here without a new reservation

    def next_seq(self) -> int:
        self._seq += 1
        if self._seq > self._reserved:
            self._reserved = self._seq + SEQ_BLOCK - 1
            self.store.seq_reserved(self.name, self._reserved)
        return self._seq

    @property
    def last_seq(self) -> int:
        """The last sequence number handed out (the head of the destination)."""
        return self._seq

    @property
    def reserved_seq(self) -> int:
        return self._reserved

    def resume_seq(self, reserved: int) -> None:
        """After a restart: continue above everything reserved before."""
        self._seq = max(self._seq, reserved)
        self._reserved = max(self._reserved, reserved)

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
        self, name: DestinationName, settings: DestinationSettings, context: Context
    ) -> None:
        super().__init__(name, settings, context)
        self.pending = context.pending_list()
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
            self.store.added(message)
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

    def recovered(self, message: Message) -> None:
        """A persistent message read back from the journal at start-up."""
        self.pending.append(message)

    def consumed(self, message: Message) -> None:
        super().consumed(message)
        if message.persistent:
            self.store.removed(message)

    def expired(self, message: Message) -> None:
        super().expired(message)
        if message.persistent:
            self.store.removed(message)

    def reap_expired(self, now_ms: int) -> int:
        removed = self.pending.remove_expired(now_ms)
        for message in removed:
            self.expired(message)
        return len(removed)

    def dispatch(self) -> None:
        """Stage pending messages to ready consumers (see `core.dispatch`)."""
        dispatch.dispatch(self)


class Topic(Destination):
    """Publish/subscribe: each message to every subscriber present when it was sent.

    A topic with durable subscriptions also retains, in its log, every message one of them
    accepts, until all of them have moved past it (see core.durable).
    """

    __slots__ = ("durables", "log", "subscribers")

    def __init__(
        self, name: DestinationName, settings: DestinationSettings, context: Context
    ) -> None:
        super().__init__(name, settings, context)
        self.subscribers: list[TopicSubscription] = []
        self.durables: dict[tuple[str, str], DurableState] = {}
        self.log = SeqLog(context.ledger, context.spill)

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
        if any(state.accepts(message) for state in self.durables.values()):
            if message.persistent:
                self.store.added(message)
            self.log.append(message)
            for state in self.durables.values():
                if state.active is not None:
                    state.active.fill()
            taken = True
        if not taken:
            self.stats.discarded += 1  # no subscriber, or none whose selector matches

    def recovered(self, message: Message) -> None:
        """A retained persistent message read back from the journal at start-up."""
        self.log.append(message)

    def add_durable(self, state: DurableState) -> None:
        self.durables[state.key] = state

    def remove_durable(self, key: tuple[str, str]) -> DurableState | None:
        state = self.durables.pop(key, None)
        if state is not None:
            self.trim()
        return state

    def trim(self) -> int:
        """Drop from the log what no durable subscription needs any more; return how many."""
        floor = min((state.floor() for state in self.durables.values()), default=2**63)
        trimmed = self.log.trim(floor)
        for message in trimmed:
            if message.persistent:
                self.store.removed(message)
        return len(trimmed)

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
