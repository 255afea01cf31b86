"""The broker's state back from its journal store, at start-up.

`restore_broker` is what the edge (app.storage) runs once: it makes the store keep the broker's
snapshot, its cursors and leases and its stages (the extensions) from then on, and hands back
into the broker what the journal held, through the store port (core.model.store:
`MessageStore.recover` into a `Restore`, the Restorer here).

Messages: the journal's second pass (persist.replay) hands over each live message in journal
order. While memory has room a message is decoded and appended as any other. Beyond the swap
point a queue's pending list would write it to the swap area at once, in chunks: such a message
is packed into its chunk as its ADD record holds it (a chunk holds messages in that encoding,
see core.values.message_codec), never decoded into a Message and encoded again. A large
recovered backlog is mostly that: for a journal of 1 GB holding 500 MB of live messages, four
in five of them.

The order of each queue is kept as appending one message at a time would keep it: once a level
of a queue starts a packed chunk, every later message of that level joins one (a level that
spills keeps spilling), and a message that does come decoded for that level (a republished
stage's) is preceded by the packed chunk. Topics take their messages decoded.
"""

from __future__ import annotations

from collections.abc import Callable

from sluiceway.core.broker import Broker
from sluiceway.core.containers.pending import PackedChunk
from sluiceway.core.model.queue import Queue
from sluiceway.core.model.topic import Topic
from sluiceway.core.values.durable_record import DurableRecord
from sluiceway.core.values.message import Message
from sluiceway.core.values.message_codec import EncodedMessage
from sluiceway.naming import DestinationName
from sluiceway.persist.journal_store import JournalStore
from sluiceway.persist.lease_extension import LeaseExtension
from sluiceway.persist.replay import Recovery
from sluiceway.persist.stage_extension import StageExtension


def restore_broker(store: JournalStore, broker: Broker) -> Recovery:
    """Keep `broker`'s state in `store` from now on, and read back into it what the journal
    holds. Call once, on a new broker, before any client connects."""
    store.set_snapshot(broker.snapshot)
    max_groups = broker.config.cursor_max_groups
    store.extend(LeaseExtension(store, broker.cursors, broker.leases, cursor_max_groups=max_groups))
    store.extend(StageExtension(store, broker.stages))
    recovery = store.recover(Restorer(broker))
    # Measured before the first SEND: a disk already low holds producers from the start.
    store.watch_disk(broker.disk)
    return recovery


class Restorer:
    """Takes what a store recovers back into the broker (core.model.store.Restore)."""

    def __init__(self, broker: Broker) -> None:
        self._broker = broker
        self._registry = broker.registry
        # Chunks being packed, by queue and priority level.
        self._packing: dict[tuple[Queue, int], PackedChunk] = {}
        # The last of them added to: a backlog's messages mostly follow one another.
        self._recent: PackedChunk | None = None
        self._recent_name: DestinationName | None = None
        self._recent_queue: Queue | None = None
        self._recent_priority = 0

    def message(self, message: Message) -> None:
        """A decoded message."""
        destination = self._registry.recovered(message.destination)
        destination.resume_seq(message.seq)
        if isinstance(destination, Queue):
            self._file(destination, message.priority)  # older than this one
            destination.recovered(message)
        elif isinstance(destination, Topic):
            destination.recovered(message)

    def encoded(self, message: EncodedMessage) -> bool:
        """A message as its record holds it: packed for the swap area (True) when its queue
        would write it there, else left to be decoded (False)."""
        packed, queue = self._recent, self._recent_queue
        if (
            packed is None
            or queue is None
            or message.destination is not self._recent_name
            or message.priority != self._recent_priority
        ):
            destination = self._registry.recovered(message.destination)
            if not isinstance(destination, Queue):
                return False
            queue = destination
            packed = self._packing.get((queue, message.priority))
            if packed is None:
                if not queue.pending.spills(message.priority):
                    return False
                packed = self._packing[queue, message.priority] = PackedChunk()
            self._recent, self._recent_queue = packed, queue
            self._recent_name, self._recent_priority = message.destination, message.priority
        queue.resume_seq(message.seq)
        packed.add(message.encoded(), message.seq, message.size, message.location, message.marks)
        if packed.full:
            self._file(queue, message.priority)
        return True

    def finish(self) -> None:
        """Every message is back: file the chunks still being packed."""
        for queue, priority in list(self._packing):
            self._file(queue, priority)

    def sequence(self, destination: DestinationName, seq: int) -> None:
        self._registry.recovered(destination).resume_seq(seq)

    def durable(self, record: DurableRecord, acked: set[int], delivered: dict[int, int]) -> None:
        self._broker.restore_durable(record, acked, delivered)

    def _file(self, queue: Queue, priority: int) -> None:
        packed = self._packing.pop((queue, priority), None)
        if packed is not None:
            if packed is self._recent:
                self._recent = None
            queue.recovered_packed(priority, packed)


class Delivering:
    """A Restore that gives every recovered message to `deliver` and keeps nothing else (for
    tools that read a journal's messages, and tests)."""

    def __init__(self, deliver: Callable[[Message], None]) -> None:
        self.deliver = deliver

    def message(self, message: Message) -> None:
        self.deliver(message)

    def encoded(self, message: EncodedMessage) -> bool:
        return False  # decoded, and given to `message`

    def sequence(self, destination: DestinationName, seq: int) -> None:
        pass

    def durable(self, record: DurableRecord, acked: set[int], delivered: dict[int, int]) -> None:
        pass

    def finish(self) -> None:
        pass
