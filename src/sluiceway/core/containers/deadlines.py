"""Pending messages in earliest-deadline-first order: a queue's `deliveryOrder=deadline`.

A message with an expiration time (`expires`) goes before every message without one; among
those with one, the earliest deadline first; ties by priority (higher first), then arrival
(sequence number). Messages without an expiration time keep the ordinary order of a pending list
(priority, then arrival), after all those with one.

JMS asks a provider to deliver the messages of one session to a destination in the order they
were sent, within a priority; this order relaxes that rule further than priority does: two
messages of one producer with different deadlines may be delivered in either order. A queue with
`deliveryOrder=fifo` (the default) keeps the JMS order.

Messages with a deadline are held in memory, in a heap, and never go to the swap area: taking the
earliest needs them all at hand. They are counted in the memory ledger like any other, so the
memory levels (YELLOW swapping the others, RED holding producers) and the destination's limits
bound them. Messages without one spill as in any pending list.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator

from sluiceway.core.containers.pending import PendingList, Spill
from sluiceway.core.values.memory import MemoryLedger
from sluiceway.core.values.message import Message

# (expires, -priority, seq, message): the seq is unique, so the message is never compared.
_Entry = tuple[int, int, int, Message]


def _entry(message: Message) -> _Entry:
    return (message.expires, -message.priority, message.seq, message)


class DeadlineList(PendingList):
    """A pending list whose messages with an expiration time come first, earliest first."""

    __slots__ = ("_heap", "_heap_bytes")

    def __init__(self, ledger: MemoryLedger | None = None, spill: Spill | None = None) -> None:
        super().__init__(ledger, spill)
        self._heap: list[_Entry] = []
        self._heap_bytes = 0

    def __len__(self) -> int:
        return super().__len__() + len(self._heap)

    def __bool__(self) -> bool:
        return bool(self._heap) or super().__bool__()

    @property
    def bytes(self) -> int:
        return super().bytes + self._heap_bytes

    @property
    def first_seq(self) -> int | None:
        first = super().first_seq
        if self._heap:
            heap_first = min(entry[2] for entry in self._heap)
            first = heap_first if first is None else min(first, heap_first)
        return first

    @property
    def deadlines(self) -> int:
        """Messages held in deadline order (those with an expiration time)."""
        return len(self._heap)

    # -- adding and taking -----------------------------------------------------------------------

    def append(self, message: Message) -> None:
        if message.expires:
            self._push(message)
        else:
            super().append(message)

    def restore(self, message: Message) -> None:
        if message.expires:
            self._push(message)
        else:
            super().restore(message)

    def pop(self) -> Message | None:
        if self._heap:
            return self._take(heapq.heappop(self._heap))
        return super().pop()

    def evict(self, *, lowest_priority: bool) -> Message | None:
        """As PendingList.evict, over both parts: the oldest message of any priority, or the
        oldest of the lowest priority present."""
        heap = self._heap
        if not heap:
            return super().evict(lowest_priority=lowest_priority)

        def rank(message: Message) -> tuple[int, int]:
            return (message.priority, message.seq) if lowest_priority else (0, message.seq)

        candidate = min(heap, key=lambda entry: rank(entry[3]))
        other = self.eviction_candidate(lowest_priority=lowest_priority)
        if other is not None:
            priority, seq = other
            if ((priority, seq) if lowest_priority else (0, seq)) < rank(candidate[3]):
                return super().evict(lowest_priority=lowest_priority)
        heap.remove(candidate)
        heapq.heapify(heap)
        return self._take(candidate)

    def _push(self, message: Message) -> None:
        heapq.heappush(self._heap, _entry(message))
        self._heap_bytes += len(message.body)
        self.hold_in_level(message)

    def _take(self, entry: _Entry) -> Message:
        message = entry[3]
        self._heap_bytes -= len(message.body)
        self.let_go_in_level(message)
        return message

    # -- scanning ---------------------------------------------------------------------------------

    def following(self, cursor: tuple[int, int], limit: int) -> list[Message]:
        """As PendingList.following (browsing, by priority then arrival), the messages with a
        deadline included at their place in that order."""
        found = super().following(cursor, limit)
        if not self._heap:
            return found
        cursor_priority, cursor_seq = cursor
        after = [
            entry[3]
            for entry in self._heap
            if entry[3].priority < cursor_priority
            or (entry[3].priority == cursor_priority and entry[3].seq > cursor_seq)
        ]
        merged = sorted(found + after, key=lambda m: (-m.priority, m.seq))
        return merged[:limit]

    def extract(self, choose: Callable[[Message], bool], stop: Callable[[], bool]) -> int:
        """As PendingList.extract, the messages with a deadline first, earliest first."""
        taken = 0
        if self._heap and not stop():
            kept: list[_Entry] = []
            for entry in sorted(self._heap):
                if stop() or not choose(entry[3]):
                    kept.append(entry)
                    continue
                self._take(entry)
                taken += 1
            heapq.heapify(kept)
            self._heap = kept
        if not stop():
            taken += super().extract(choose, stop)
        return taken

    # -- housekeeping -----------------------------------------------------------------------------

    def remove_expired(self, now_ms: int) -> list[Message]:
        """As PendingList.remove_expired: the heap gives up its expired messages from the top,
        earliest deadline first, without looking at the others."""
        expired: list[Message] = []
        heap = self._heap
        while heap and heap[0][3].expired(now_ms):
            expired.append(self._take(heapq.heappop(heap)))
        expired.extend(super().remove_expired(now_ms))
        return expired

    def clear(self) -> int:
        count = len(self._heap)
        for entry in self._heap:
            self.let_go_in_level(entry[3])
        self._heap = []
        self._heap_bytes = 0
        return count + super().clear()

    def __iter__(self) -> Iterator[Message]:
        """Messages in delivery order (for inspection)."""
        for entry in sorted(self._heap):
            yield entry[3]
        yield from super().__iter__()
