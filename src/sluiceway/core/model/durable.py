"""Durable topic subscriptions: they keep receiving while their subscriber is away.

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

from sluiceway.core.model.destination import Topic
from sluiceway.core.model.subscription import MessageFilter, Subscription
from sluiceway.core.values.durable_record import DurableRecord
from sluiceway.core.values.message import Message

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
