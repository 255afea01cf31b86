"""Recovered messages back into their destinations, at start-up.

The journal's second pass (core.persistence) hands over each live message in journal order.
While memory has room a message is decoded and appended as any other. Beyond the swap point a
queue's pending list would write it to the swap area at once, in chunks: such a message is
packed into its chunk as its ADD record holds it (a chunk holds messages in that encoding, see
core.pending), never decoded into a Message and encoded again. A large recovered backlog is
mostly that: for a journal of 1 GB holding 500 MB of live messages, four in five of them.

The order of each queue is kept as appending one message at a time would keep it: once a level
of a queue starts a packed chunk, every later message of that level joins one (a level that
spills keeps spilling), and a message that does come decoded for that level (a republished
stage's) is preceded by the packed chunk. Topics take their messages decoded.
"""

from __future__ import annotations

from sluiceway.core.containers.pending import PackedChunk
from sluiceway.core.model.queue import Queue
from sluiceway.core.model.registry import DestinationRegistry
from sluiceway.core.model.topic import Topic
from sluiceway.core.values.message import Message
from sluiceway.naming import DestinationName
from sluiceway.persist.records import EncodedMessage


class Restorer:
    """Takes recovered messages for the broker's destinations (JournalStore.recover's two
    callbacks); `finish` files what is still being packed once recovery is over."""

    def __init__(self, registry: DestinationRegistry) -> None:
        self._registry = registry
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
        for queue, priority in list(self._packing):
            self._file(queue, priority)

    def _file(self, queue: Queue, priority: int) -> None:
        packed = self._packing.pop((queue, priority), None)
        if packed is not None:
            if packed is self._recent:
                self._recent = None
            queue.recovered_packed(priority, packed)
