"""What queues and topics share: identity, settings, sequence numbers, counters, producers,
pause state, and the accounting of the messages they hold.

A queue (core.model.queue) has one pending list shared by its consumers (Open MQ, reference
section 1.4); each message goes to exactly one consumer, chosen by the queue's dispatch policy
(`dispatchPolicy`). A topic (core.model.topic) copies a reference to each message into the
pending list of every subscriber present when it was sent; a topic with no subscriber discards
the message (and counts it).
"""

from __future__ import annotations

from typing import Final, Protocol

from sluiceway.config import DestinationSettings
from sluiceway.core.model.context import Context
from sluiceway.core.values.fullness import Fullness
from sluiceway.core.values.message import Message
from sluiceway.errors import Conflict
from sluiceway.naming import DestinationName

# Sequence numbers are reserved in the store this many at a time, so a restarted broker never
# hands out a number it handed out before, at the cost of one small record per block.
SEQ_BLOCK: Final = 1000


class CursorMark(Protocol):
    """What a topic needs of a cursor on it (core.features.cursors)."""

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
        "late",
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
        self.late = 0  # consumed after their `expires` time (delivered before it)
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
        "remote_bytes",
        "remote_count",
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
        self.held_sends = 0  # SENDs to it held for producers (core.model.holding)
        self.paused_producers = False  # pause dst -pst PRODUCERS
        self.paused_consumers = False  # pause dst -pst CONSUMERS
        self.throttled = False  # JMS IQ Manager throttling (core.values.throttle)
        # Messages staged for it and not yet published (core.features.stages): unseen by consumers,
        # but counted against its limits, so producer flow control sees them.
        self.staged_count = 0
        self.staged_bytes = 0
        # Messages the other members of a cluster hold for it, as they last reported them
        # (cluster.shared_counts): a queue's limits count the whole cluster's.
        self.remote_count = 0
        self.remote_bytes = 0

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

    def local_fullness(self) -> Fullness:
        """As `fullness`, counting only what this broker holds (a queue's fullness counts the
        other cluster members' messages too)."""
        return self.fullness()

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
        store (core.features.transaction writes its record before publishing it)."""
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
        stats = self.stats
        stats.consumed += 1
        if message.expires and self.clock.time_ms() > message.expires:
            stats.late += 1  # delivered in time, consumed past its deadline

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
