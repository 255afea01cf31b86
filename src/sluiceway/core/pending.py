"""Messages waiting for a consumer: highest priority first, then first in, first out."""

from __future__ import annotations

import bisect
import itertools
from collections import deque
from collections.abc import Callable, Iterator

from sluiceway.core.message import Message

PRIORITY_LEVELS = 10  # JMS priorities 0-9


class PendingList:
    """One FIFO per priority level and a bit mask of the non-empty levels.

    Appending and popping are O(1). A message given back (NACK, disconnect) is put back at its
    place by sequence number, which is near the front in practice, so the scan is short.
    Its size is bounded by the destination's limits, not by this class.
    """

    __slots__ = ("_bytes", "_count", "_expiring", "_levels", "_mask")

    def __init__(self) -> None:
        self._levels: list[deque[Message]] = [deque() for _ in range(PRIORITY_LEVELS)]
        self._mask = 0  # bit p set when level p is non-empty
        self._count = 0
        self._bytes = 0
        self._expiring = 0  # messages with an expiry, so sweeps can skip lists without any

    def __len__(self) -> int:
        return self._count

    def __bool__(self) -> bool:
        return self._count > 0

    @property
    def bytes(self) -> int:
        """Total body bytes of the messages held."""
        return self._bytes

    def append(self, message: Message) -> None:
        """Add a newly arrived message behind every message of its priority."""
        self._levels[message.priority].append(message)
        self._added(message)

    def restore(self, message: Message) -> None:
        """Put a message that was taken back in its place (by sequence number)."""
        level = self._levels[message.priority]
        index = 0
        seq = message.seq
        for queued in level:
            if queued.seq > seq:
                break
            index += 1
        level.insert(index, message)
        self._added(message)

    def pop(self) -> Message | None:
        """Remove and return the first message (highest priority, oldest), or None."""
        mask = self._mask
        if not mask:
            return None
        priority = mask.bit_length() - 1
        level = self._levels[priority]
        message = level.popleft()
        if not level:
            self._mask = mask & ~(1 << priority)
        self._removed(message)
        return message

    def remove_expired(self, now_ms: int) -> list[Message]:
        """Remove and return every expired message. O(n), skipped when nothing can expire."""
        if not self._expiring:
            return []
        expired: list[Message] = []
        for priority, level in enumerate(self._levels):
            if not level:
                continue
            kept = deque(m for m in level if not m.expired(now_ms))
            if len(kept) != len(level):
                expired.extend(m for m in level if m.expired(now_ms))
                self._levels[priority] = kept
                if not kept:
                    self._mask &= ~(1 << priority)
        for message in expired:
            self._removed(message)
        return expired

    def clear(self) -> list[Message]:
        """Remove and return every message, in delivery order."""
        messages = list(self)
        for level in self._levels:
            level.clear()
        self._mask = self._count = self._bytes = self._expiring = 0
        return messages

    def following(self, cursor: tuple[int, int], limit: int) -> list[Message]:
        """Up to `limit` messages after position `cursor` = (priority, seq), in delivery order.

        For browsing: nothing is removed. Start with cursor (PRIORITY_LEVELS, 0) for the first.
        """
        found: list[Message] = []
        cursor_priority, cursor_seq = cursor
        for priority in range(min(cursor_priority, PRIORITY_LEVELS - 1), -1, -1):
            level = self._levels[priority]
            if not level:
                continue
            start = 0
            if priority == cursor_priority:
                start = bisect.bisect_right(level, cursor_seq, key=_seq)
            found.extend(itertools.islice(level, start, start + limit - len(found)))
            if len(found) >= limit:
                break
        return found

    def extract(self, choose: Callable[[Message], bool], stop: Callable[[], bool]) -> int:
        """Scan in delivery order, removing each message `choose` takes; return how many.

        `choose(message)` returns True when it took the message (it is removed). The scan ends
        early when `stop()` is true. O(n) in the messages scanned: used for consumers with
        selectors, whose next message may be anywhere in the list.
        """
        taken = 0
        for priority in range(PRIORITY_LEVELS - 1, -1, -1):
            level = self._levels[priority]
            if not level:
                continue
            kept: deque[Message] = deque()
            for index, message in enumerate(level):
                if stop():
                    kept.extend(itertools.islice(level, index, None))
                    break
                if choose(message):
                    self._removed(message)
                    taken += 1
                else:
                    kept.append(message)
            if len(kept) != len(level):
                self._levels[priority] = kept
                if not kept:
                    self._mask &= ~(1 << priority)
            if stop():
                break
        return taken

    def __iter__(self) -> Iterator[Message]:
        """Messages in delivery order (for inspection; does not remove them)."""
        for level in reversed(self._levels):
            yield from level

    def _added(self, message: Message) -> None:
        self._mask |= 1 << message.priority
        self._count += 1
        self._bytes += len(message.body)
        if message.expires:
            self._expiring += 1

    def _removed(self, message: Message) -> None:
        self._count -= 1
        self._bytes -= len(message.body)
        if message.expires:
            self._expiring -= 1


def _seq(message: Message) -> int:
    return message.seq
