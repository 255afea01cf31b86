"""Topics: publish/subscribe, each message to every subscriber present when it was sent.

A topic copies a reference to each message into the pending list of every subscriber present
when it was sent (`TopicSubscription`); a topic with no subscriber discards the message (and
counts it). The topic, its subscribers and its durable subscriptions call each other for every
message, so they live together here.

Durable topic subscriptions: they keep receiving while their subscriber is away.

A durable subscription is identified by the client id its subscriber gives on CONNECT and a
name (`durable-subscription-name`). Its topic keeps a DurableState for it whether or not a
subscriber is attached: a cursor into the topic's log (the next sequence number to read), the
messages given back for delivery again (NACK, disconnect), and how often each unacknowledged
message was delivered. Messages stay in the log until every durable subscription of the topic
has acknowledged them or moved past them (its floor), so the log is also what range reads see.
"""

from __future__ import annotations

import bisect
from collections import deque
from typing import Final

from sluiceway.config import DestinationSettings
from sluiceway.core.containers.seqlog import SeqLog
from sluiceway.core.model.context import Context
from sluiceway.core.model.destination import CursorMark, Destination
from sluiceway.core.model.subscription import MessageFilter, Subscription
from sluiceway.core.values.durable_record import DurableRecord
from sluiceway.core.values.fullness import Fullness
from sluiceway.core.values.message import Message
from sluiceway.naming import DestinationName


class Topic(Destination):
    """Publish/subscribe: each message to every subscriber present when it was sent.

    A topic with durable subscriptions also retains, in its log, every message one of them
    accepts, until all of them have moved past it (see DurableState); a topic with cursors
    (core.features.cursors), every message at or after the position of one of them. Its message
    limits apply to each subscription's backlog and to the log: the fullest decides.
    """

    __slots__ = ("cursors", "durables", "log", "subscribers", "tx_held")

    def __init__(
        self, name: DestinationName, settings: DestinationSettings, context: Context
    ) -> None:
        super().__init__(name, settings, context)
        self.subscribers: list[TopicSubscription] = []
        self.durables: dict[tuple[str, str], DurableState] = {}
        self.cursors: dict[str, CursorMark] = {}  # by group name
        self.log = SeqLog(context.ledger, context.spill)
        # Sequence numbers of logged messages that open transactions acknowledged or refused,
        # and by how many: the log keeps them until each transaction ends.
        self.tx_held: dict[int, int] = {}

    @property
    def subscription_count(self) -> int:
        return len(self.subscribers) + sum(1 for s in self.durables.values() if s.active)

    @property
    def pending_count(self) -> int:
        return sum(len(s.pending) for s in self.subscribers) + len(self.log)

    def fullness(self) -> Fullness:
        count, size = len(self.log), self.log.bytes
        for subscriber in self.subscribers:
            count = max(count, len(subscriber.pending) + subscriber.window.outstanding)
            size = max(size, subscriber.pending.bytes)
        # Staged messages join every backlog once published.
        return Fullness(count + self.staged_count, size + self.staged_bytes)

    def undelivered(self) -> int:
        backlog = max((len(s.pending) + len(s.staged) for s in self.subscribers), default=0)
        head = self.last_seq
        for state in self.durables.values():
            staged = len(state.active.staged) if state.active is not None else 0
            backlog = max(backlog, head - state.cursor + 1 + len(state.redeliver) + staged)
        return backlog

    def publish(self, message: Message) -> None:
        message.seq = self.next_seq()
        retained = self._retains(message)
        if retained and message.persistent:
            self.store.added(message)  # first: a message the store refuses reaches nobody
        self.stats.received(message)
        taken = False
        for subscriber in self.subscribers:
            if subscriber.accepts(message):
                self._took(message)
                subscriber.offer(message)
                taken = True
        if retained:
            self.log.append(message)
            self._took(message)
            for state in self.durables.values():
                if state.active is not None:
                    state.active.fill()
            taken = True
        if not taken:
            self.stats.discarded += 1  # no subscriber, or none whose selector matches

    def _retains(self, message: Message) -> bool:
        """Whether the log keeps `message`: a durable subscription accepts it, or a cursor is at
        or before it."""
        return any(state.accepts(message) for state in self.durables.values()) or any(
            cursor.position <= message.seq for cursor in self.cursors.values()
        )

    def stores(self, message: Message) -> bool:
        return message.persistent and self._retains(message)

    def recovered(self, message: Message) -> None:
        """A retained persistent message read back from the journal at start-up."""
        self.log.append(message)
        self._took(message)

    def consumed(self, message: Message) -> None:
        """A subscriber consumed its copy (durable ones: the log keeps it until trimmed)."""
        super().consumed(message)

    def released(self, message: Message) -> None:
        """A non-durable subscriber's copy left (consumed, expired, dropped with it)."""
        self._let_go(message)

    def expired(self, message: Message) -> None:
        """One subscription's copy expired; the message goes to the dead message queue once,
        whichever subscription finds it first."""
        super().expired(message)
        if not message.dead:
            message.dead = True
            self.dead(message, "EXPIRED", "its expiration time passed before it was delivered")

    def add_durable(self, state: DurableState) -> None:
        self.durables[state.key] = state

    def remove_durable(self, key: tuple[str, str]) -> DurableState | None:
        state = self.durables.pop(key, None)
        if state is not None:
            self.trim()
        return state

    def held_by_transaction(self, messages: list[Message], held: bool) -> None:
        counts = self.tx_held
        for message in messages:
            if held:
                counts[message.seq] = counts.get(message.seq, 0) + 1
            elif counts.get(message.seq, 0) > 1:
                counts[message.seq] -= 1
            else:
                counts.pop(message.seq, None)

    def trim(self) -> int:
        """Drop from the log what no durable subscription or cursor needs any more, nor an open
        transaction that acknowledged it (its ABORT gives it back); return how many."""
        floor = min((state.floor() for state in self.durables.values()), default=2**63)
        floor = min([floor, *(cursor.position for cursor in self.cursors.values())])
        if self.tx_held:
            floor = min(floor, *self.tx_held)
        trimmed = self.log.trim(floor)
        for message in trimmed:
            self._drop_logged(message)
        return len(trimmed)

    def _drop_logged(self, message: Message) -> None:
        if message.persistent:
            self.store.removed(message)
        self._let_go(message)

    def evict_one(self, *, lowest_priority: bool) -> bool:
        """Evict from the fullest backlog: a subscriber's pending list, or the log's oldest."""
        fullest = max(self.subscribers, key=lambda s: len(s.pending), default=None)
        reason = "LOW_PRIORITY" if lowest_priority else "OLDEST"
        comment = f"evicted to make room ({self.settings.limit_behavior.value})"
        if fullest is not None and len(fullest.pending) >= len(self.log):
            victim = fullest.pending.evict(lowest_priority=lowest_priority)
            if victim is not None:
                self.dead(victim, reason, comment)
                self.released(victim)
                return True
        first = self.log.first_seq
        if first is None:
            return False
        for message in self.log.trim(first + 1):
            for state in self.durables.values():
                state.evicted(message)
            with self.store.atomic():
                self.dead(message, reason, comment)
                self._drop_logged(message)
        return True

    def resume_consumers(self) -> None:
        for subscriber in self.subscribers:
            subscriber.fill()
        for state in self.durables.values():
            if state.active is not None:
                state.active.fill()

    def purge(self) -> int:
        count = 0
        for subscriber in self.subscribers:
            while (message := subscriber.pending.pop()) is not None:
                self.released(message)
                count += 1
        return count

    def attach(self, subscriber: TopicSubscription) -> None:
        self.subscribers.append(subscriber)

    def detach(self, subscriber: TopicSubscription) -> None:
        self.subscribers.remove(subscriber)
        while (message := subscriber.pending.pop()) is not None:
            self.released(message)

    def reap_expired(self, now_ms: int) -> int:
        count = 0
        for subscriber in self.subscribers:
            for message in subscriber.pending.remove_expired(now_ms):
                self.expired(message)
                self.released(message)
                count += 1
        return count


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
        batch while one is open (core.model.context.Batch)."""
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


LOOKAHEAD: Final = 256  # messages read from the log at a time, so a spilled chunk is read once


class DurableState:
    """What a topic keeps of one durable subscription."""

    __slots__ = (
        "acked_ahead",
        "active",
        "cursor",
        "deliveries",
        "lookahead",
        "record",
        "redeliver",
        "selector",
    )

    def __init__(self, record: DurableRecord, selector: MessageFilter | None) -> None:
        self.record = record
        self.selector = selector
        self.cursor = record.start_seq  # the next sequence number to read from the log
        self.redeliver: list[Message] = []  # given back, by seq; delivered before the log's
        # Read from the log, not yet given out: at most LOOKAHEAD at a time (refilled only
        # when empty, with at most LOOKAHEAD: the maxlen never drops anything).
        self.lookahead: deque[Message] = deque(maxlen=LOOKAHEAD)
        self.acked_ahead: set[int] = set()  # acknowledged above the cursor (after a restart)
        self.deliveries: dict[int, int] = {}  # seq -> deliveries, while unacknowledged
        self.active: DurableSubscription | None = None

    @property
    def key(self) -> tuple[str, str]:
        return self.record.client_id, self.record.name

    def accepts(self, message: Message) -> bool:
        return message.seq >= self.record.start_seq and (
            self.selector is None or self.selector.matches(message)
        )

    def floor(self) -> int:
        """The lowest sequence number this subscription may still need."""
        floor = self.lookahead[0].seq if self.lookahead else self.cursor
        if self.redeliver:
            floor = min(floor, self.redeliver[0].seq)
        active = self.active
        if active is not None:
            for message in active.staged:
                floor = min(floor, message.seq)
            for message in active.unacked.values():
                floor = min(floor, message.seq)
        return floor

    def evicted(self, message: Message) -> None:
        """The topic evicted `message` from its log: this subscription no longer gets it
        (unless it was already handed out)."""
        if message in self.lookahead:
            self.lookahead.remove(message)
        if message in self.redeliver:
            self.redeliver.remove(message)

    def give_back(self, messages: list[Message]) -> None:
        for message in messages:
            bisect.insort(self.redeliver, message, key=_seq)

    def next_message(self, topic: Topic, now_ms: int) -> Message | None:
        """The next message to deliver: given-back ones first, then the log from the cursor."""
        if self.redeliver:
            return self.redeliver.pop(0)
        while True:
            if not self.lookahead:
                self.lookahead.extend(topic.log.read(self.cursor, LOOKAHEAD))
                if not self.lookahead:
                    return None
            message = self.lookahead.popleft()
            self.cursor = message.seq + 1
            if message.seq in self.acked_ahead:
                self.acked_ahead.discard(message.seq)
            elif message.expired(now_ms):
                topic.expired(message)
            elif self.accepts(message):
                return message


class DurableSubscription(Subscription):
    """A subscriber attached to a durable subscription."""

    __slots__ = ("state", "topic")

    def _setup(self) -> None:
        assert isinstance(self.destination, Topic)
        self.topic = self.destination

    def attach(self, state: DurableState) -> None:
        self.state = state
        state.active = self

    @property
    def sub_id(self) -> int:
        return self.state.record.sub_id

    def refill(self) -> None:
        self.fill()

    def fill(self) -> None:
        state = self.state
        now = self.connection.clock.time_ms()
        while self.ready():
            message = state.next_message(self.topic, now)
            if message is None:
                return
            self.stage(message)

    def count_delivery(self, message: Message) -> int:
        count = self.state.deliveries.get(message.seq, 0) + 1
        self.state.deliveries[message.seq] = count
        return count

    def note_delivery(self, message: Message) -> None:
        if message.persistent:
            self.topic.store.durable_delivered(self.sub_id, message)

    def forget(self, message: Message) -> None:
        """Acknowledged: no longer needed by this subscription."""
        self.state.deliveries.pop(message.seq, None)
        if message.persistent:
            self.topic.store.durable_acked(self.sub_id, message)

    def return_to_source(self, messages: list[Message], *, delivered: bool) -> None:
        self.state.give_back(messages)
        if delivered:
            self.topic.stats.redelivered += len(messages)
        if self.active:
            self.fill()

    def detach(self) -> None:
        """The subscriber left; the durable subscription stays with its topic."""
        if self.state.active is self:
            self.state.active = None


def _seq(message: Message) -> int:
    return message.seq
