"""Queues and topics: where messages wait and how they are shared out.

A queue has one pending list shared by its consumers (Open MQ, reference section 1.4); each message
goes to exactly one consumer, chosen by the queue's dispatch policy (`dispatchPolicy`). A topic
copies a reference to each message into the pending list of every subscriber present when it was
sent; a topic with no subscriber discards the message (and counts it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, Protocol

from sluiceway.config import DestinationSettings
from sluiceway.core.containers.pending import PackedChunk
from sluiceway.core.containers.seqlog import SeqLog
from sluiceway.core.model import dispatch
from sluiceway.core.model.context import Context
from sluiceway.core.values.fullness import Fullness
from sluiceway.core.values.message import Message
from sluiceway.errors import Conflict
from sluiceway.naming import DestinationName

# Sequence numbers are reserved in the store this many at a time, so a restarted broker never
# hands out a number it handed out before, at the cost of one small record per block.
SEQ_BLOCK: Final = 1000

if TYPE_CHECKING:
    from sluiceway.core.model.durable import DurableState
    from sluiceway.core.model.subscription import QueueSubscription, TopicSubscription


class CursorMark(Protocol):
    """What a topic needs of a cursor on it (core.cursors)."""

    @property
    def position(self) -> int:
        """The first sequence number the cursor still needs: the log keeps it and what follows."""
        ...


class DestinationStats:
    """Counters of one destination since it was created (messages and body bytes)."""

    __slots__ = (
        "bytes_in",
        "bytes_out",
        "consumed",
        "dead",
        "discarded",
        "dropped",
        "expired",
        "largest",
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
        self.dead = 0  # expired, evicted or delivered too often (to the DMQ with useDMQ)
        self.dropped = 0  # refused without telling the producer (non-persistent, no receipt)
        self.largest = 0  # bytes of the largest body accepted

    def received(self, message: Message) -> None:
        size = len(message.body)
        self.msgs_in += 1
        self.bytes_in += size
        self.largest = max(self.largest, size)

    def delivered(self, message: Message) -> None:
        self.msgs_out += 1
        self.bytes_out += len(message.body)


class Destination:
    """What queues and topics share: identity, settings, sequence numbers, counters, producers,
    pause state."""

    __slots__ = (
        "_reserved",
        "_seq",
        "clock",
        "context",
        "held_bytes",
        "held_count",
        "held_sends",
        "name",
        "paused_consumers",
        "paused_producers",
        "producers",
        "settings",
        "staged_bytes",
        "staged_count",
        "stats",
        "store",
        "throttled",
    )

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
        # Messages held and not consumed: a queue's; a topic's copies (one per subscription or
        # log holding it). A queue's limits count these; a topic's, its fullest backlog.
        self.held_count = 0
        self.held_bytes = 0
        self.producers: set[int] = set()  # connection numbers that sent to it
        self.held_sends = 0  # SENDs to it held for producers (core.holding)
        self.paused_producers = False  # pause dst -pst PRODUCERS
        self.paused_consumers = False  # pause dst -pst CONSUMERS
        self.throttled = False  # JMS IQ Manager throttling (core.throttle)
        # Messages staged for it and not yet published (core.stages): unseen by consumers, but
        # counted against its limits, so producer flow control sees them.
        self.staged_count = 0
        self.staged_bytes = 0

    @property
    def is_dmq(self) -> bool:
        return self.name.is_system

    def next_seq(self) -> int:
        self._seq += 1
        if self._seq > self._reserved:
            self.reserve(self._seq)
        return self._seq

    def reserve(self, seq: int) -> None:
        """Make sure sequence numbers up to `seq` are reserved in the store (a COMMIT reserves
        what its messages will take before it writes them, so publishing writes nothing)."""
        if seq > self._reserved:
            self._reserved = seq + SEQ_BLOCK - 1
            self.store.seq_reserved(self.name, self._reserved)

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

    # -- producers ---------------------------------------------------------------------------

    def add_producer(self, connection: int) -> None:
        """Connection `connection` sends to this destination (maxNumProducers)."""
        if connection in self.producers:
            return
        limit = self.settings.max_num_producers
        if 0 <= limit <= len(self.producers):
            raise Conflict(
                "too many producers",
                f"{self.name} already has {len(self.producers)} producers, its maxNumProducers "
                f"limit; a connection stops being a producer when it closes",
                destination=self.name.path,
                limit="maxNumProducers",
                limit_value=str(limit),
            )
        self.producers.add(connection)

    def remove_producer(self, connection: int) -> None:
        self.producers.discard(connection)

    # -- accounting ----------------------------------------------------------------------------

    def _took(self, message: Message) -> None:
        """One more message held (a queue's, or one topic subscription's or log's copy)."""
        self.held_count += 1
        self.held_bytes += len(message.body)
        self.context.system.add(len(message.body))

    def _let_go(self, message: Message) -> None:
        """A held message left: room for producers held by the limits."""
        self.held_count -= 1
        self.held_bytes -= len(message.body)
        self.context.system.remove(len(message.body))
        self.context.room.raised = True

    def fullness(self) -> Fullness:
        """Messages and bytes measured against maxNumMsgs / maxTotalMsgBytes."""
        raise NotImplementedError

    def undelivered(self) -> int:
        """Messages not yet written to a consumer (for a topic: its slowest subscriber's
        backlog, the messages read from its publishers minus those sent to it)."""
        raise NotImplementedError

    def evict_one(self, *, lowest_priority: bool) -> bool:
        """REMOVE_OLDEST / REMOVE_LOW_PRIORITY: give up one waiting message; False if none."""
        raise NotImplementedError

    @property
    def subscription_count(self) -> int:
        raise NotImplementedError

    @property
    def pending_count(self) -> int:
        """Messages waiting for a consumer (not yet staged to one)."""
        raise NotImplementedError

    def publish(self, message: Message) -> None:
        raise NotImplementedError

    def stores(self, message: Message) -> bool:
        """Whether publishing `message`, numbered with its sequence number, keeps it in the
        store (core.transaction writes its record before publishing it)."""
        raise NotImplementedError

    def purge(self) -> int:
        """Remove every message waiting for a consumer; return how many (`purge dst`)."""
        raise NotImplementedError

    def reap_expired(self, now_ms: int) -> int:
        """Remove expired pending messages; return how many."""
        raise NotImplementedError

    def resume_consumers(self) -> None:
        """Consumers were paused and are resumed: deliver what waits."""
        raise NotImplementedError

    def consumed(self, message: Message) -> None:
        self.stats.consumed += 1

    def held_by_transaction(self, messages: list[Message], held: bool) -> None:
        """An open transaction acknowledged (or refused) `messages` (`held`), or no longer holds
        them: it committed or was rolled back. A topic keeps them in its log meanwhile."""

    def expired(self, message: Message) -> None:
        self.stats.expired += 1

    def dead(self, message: Message, reason: str, comment: str) -> None:
        """The message will never be delivered: to the dead message queue when useDMQ."""
        self.stats.dead += 1
        if self.settings.use_dmq and not self.is_dmq:
            self.context.dead_end.dead(self.name, message, reason, comment)


class Queue(Destination):
    """Point to point: each message to exactly one consumer.

    Consumers beyond maxNumActiveConsumers are backups: they receive nothing until an active
    consumer leaves (the oldest backup is promoted); beyond maxNumBackupConsumers a SUBSCRIBE is
    refused with status 409.
    """

    __slots__ = ("_selective", "backups", "consumers", "pending", "rotation")

    def __init__(
        self, name: DestinationName, settings: DestinationSettings, context: Context
    ) -> None:
        super().__init__(name, settings, context)
        self.pending = context.pending_list()
        self.consumers: list[QueueSubscription] = []  # the active ones
        self.backups: list[QueueSubscription] = []
        self.rotation = 0  # where the fair policy starts looking, so ties rotate
        self._selective = 0  # consumers with a selector

    @property
    def subscription_count(self) -> int:
        return len(self.consumers) + len(self.backups)

    @property
    def pending_count(self) -> int:
        return len(self.pending)

    def fullness(self) -> Fullness:
        return Fullness(self.held_count + self.staged_count, self.held_bytes + self.staged_bytes)

    def undelivered(self) -> int:
        return len(self.pending) + sum(len(c.staged) for c in self.consumers)

    def publish(self, message: Message) -> None:
        message.seq = self.next_seq()
        if message.persistent:
            self.store.added(message)  # first: a message the store refuses changes nothing
        self.stats.received(message)
        self._took(message)
        if dispatch.stage_at_once(self, message):
            return
        self.pending.append(message)
        if self.consumers and not self.context.batch.defer(self.dispatch):
            self.dispatch()

    def stores(self, message: Message) -> bool:
        return message.persistent

    def finished(self, message: Message) -> None:
        """The message leaves the queue for good (consumed, dead, purged)."""
        if message.persistent:
            self.store.removed(message)
        self._let_go(message)

    @property
    def selective(self) -> bool:
        """True while some consumer has a selector (dispatch must then scan)."""
        return self._selective > 0

    def attach(self, consumer: QueueSubscription) -> None:
        settings = self.settings
        if not 0 <= settings.max_num_active_consumers <= len(self.consumers):
            self.consumers.append(consumer)
            if consumer.selector is not None:
                self._selective += 1
        elif not 0 <= settings.max_num_backup_consumers <= len(self.backups):
            consumer.backup = True
            self.backups.append(consumer)
        else:
            raise Conflict(
                "too many consumers",
                f"{self.name} has {len(self.consumers)} active consumers (maxNumActiveConsumers "
                f"{settings.max_num_active_consumers}) and {len(self.backups)} backups "
                f"(maxNumBackupConsumers {settings.max_num_backup_consumers})",
                destination=self.name.path,
                limit="maxNumBackupConsumers",
                limit_value=str(settings.max_num_backup_consumers),
            )

    def detach(self, consumer: QueueSubscription) -> None:
        if consumer.backup:
            self.backups.remove(consumer)
            return
        self.consumers.remove(consumer)
        if consumer.selector is not None:
            self._selective -= 1
        self.promote_backups()

    def promote_backups(self) -> None:
        """While there is room among the active consumers, the oldest backup becomes active."""
        limit = self.settings.max_num_active_consumers
        while self.backups and not 0 <= limit <= len(self.consumers):
            promoted = self.backups.pop(0)
            promoted.backup = False
            self.consumers.append(promoted)
            if promoted.selector is not None:
                self._selective += 1
            promoted.refill()

    def resume_consumers(self) -> None:
        self.dispatch()

    def refill(self, consumer: QueueSubscription) -> None:
        """`consumer` can take more messages: give it what the policy allows."""
        dispatch.refill(self, consumer)

    def give_back(self, messages: list[Message], *, delivered: bool) -> None:
        """Take back messages for delivery again, each at its place in the pending list; one
        delivered maxDeliveryCount times is dead instead."""
        limit = self.settings.max_delivery_count
        for message in messages:
            if delivered and 0 < limit <= message.delivery_count:
                self._dead_and_gone(
                    message,
                    "UNDELIVERABLE",
                    f"delivered {message.delivery_count} times (maxDeliveryCount {limit}) "
                    "without being acknowledged",
                )
            else:
                self.pending.restore(message)
        if delivered:
            self.stats.redelivered += len(messages)
        self.dispatch()

    def recovered(self, message: Message) -> None:
        """A persistent message read back from the journal at start-up."""
        self.pending.append(message)
        self._took(message)

    def recovered_packed(self, priority: int, packed: PackedChunk) -> None:
        """Persistent messages read back at start-up, packed for the swap area as they were
        (core.restoring), behind every message of `priority`."""
        self.pending.append_packed(priority, packed)
        self.held_count += packed.count
        self.held_bytes += packed.body_bytes
        self.context.system.add_all(packed.count, packed.body_bytes)

    def consumed(self, message: Message) -> None:
        super().consumed(message)
        self.finished(message)

    def expired(self, message: Message) -> None:
        super().expired(message)
        self._dead_and_gone(
            message, "EXPIRED", "its expiration time passed before it was delivered"
        )

    def _dead_and_gone(self, message: Message, reason: str, comment: str) -> None:
        # One journal transaction: the dead copy is kept if and only if the original is gone.
        with self.store.atomic():
            self.dead(message, reason, comment)
            self.finished(message)

    def evict_one(self, *, lowest_priority: bool) -> bool:
        victim = self.pending.evict(lowest_priority=lowest_priority)
        if victim is None:
            return False
        reason = "LOW_PRIORITY" if lowest_priority else "OLDEST"
        self._dead_and_gone(
            victim, reason, f"evicted to make room ({self.settings.limit_behavior.value})"
        )
        return True

    def purge(self) -> int:
        count = 0
        while (message := self.pending.pop()) is not None:
            self.finished(message)
            count += 1
        return count

    def reap_expired(self, now_ms: int) -> int:
        removed = self.pending.remove_expired(now_ms)
        for message in removed:
            self.expired(message)
        return len(removed)

    def dispatch(self) -> None:
        """Stage pending messages to ready consumers (see `core.dispatch`)."""
        if not self.paused_consumers:
            dispatch.dispatch(self)


class Topic(Destination):
    """Publish/subscribe: each message to every subscriber present when it was sent.

    A topic with durable subscriptions also retains, in its log, every message one of them
    accepts, until all of them have moved past it (see core.durable); a topic with cursors
    (core.cursors), every message at or after the position of one of them. Its message limits
    apply to each subscription's backlog and to the log: the fullest decides.
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
