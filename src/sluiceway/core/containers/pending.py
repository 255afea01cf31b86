"""Messages waiting for a consumer: highest priority first, then first in, first out.

Each priority level keeps its oldest messages in memory (the head) and, once the broker's memory
ledger is over `imq.swap.threshold`, writes newer ones to the swap area in chunks of up to
CHUNK_MESSAGES messages (the tail). Memory then holds the head, one chunk being filled, and a
small reference per spilled chunk, whatever the backlog. When the head runs dry, the next chunk
is read back; order is kept because a level that has spilled keeps spilling until its tail is
drained. A message given back (NACK, disconnect) is older than every spilled one and goes back
into the head, at its place by sequence number. At start-up, recovery appends a backlog beyond
the swap point as whole chunks packed from the journal's records (append_packed).
"""

from __future__ import annotations

import bisect
import itertools
import struct
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Final, Protocol

from sluiceway.core.values.memory import MemoryLedger
from sluiceway.core.values.message import Message
from sluiceway.core.values.message_codec import decode_message, encode_message

PRIORITY_LEVELS: Final = 10  # JMS priorities 0-9
CHUNK_MESSAGES: Final = 256  # messages per spilled chunk: one read brings back this many
CHUNK_BYTES: Final = 256 * 1024  # ...or this many bytes of messages, whichever comes first
_LENGTH: Final = struct.Struct("<I")
_BOOKKEEPING: Final = struct.Struct("<QH")  # journal location, number of marks (each a u64)
_MARK: Final = struct.Struct("<Q")
# Bound once (C statics when compiled): recovery packs a chunk entry per message beyond the
# swap point without a method lookup each.
_pack_length: Final = _LENGTH.pack
_pack_bookkeeping: Final = _BOOKKEEPING.pack


@dataclass(frozen=True, slots=True)
class SwapRef:
    """Where a spill put one chunk's bytes, to read or free them by."""

    segment: int  # number of the segment file
    offset: int  # byte offset of the data in that file
    length: int  # bytes


class Spill(Protocol):
    """Where spilled chunks go (persist.swap.SwapArea is the one on disk)."""

    def write(self, data: bytes) -> SwapRef: ...

    def read(self, ref: SwapRef) -> bytes: ...

    def free(self, ref: SwapRef) -> None: ...


class Chunk:
    """A spilled run of messages of one level, in order."""

    __slots__ = ("body_bytes", "count", "first_seq", "last_seq", "ref")

    def __init__(
        self, ref: SwapRef, count: int, body_bytes: int, first_seq: int, last_seq: int
    ) -> None:
        self.ref = ref
        self.count = count
        self.body_bytes = body_bytes
        self.first_seq = first_seq
        self.last_seq = last_seq


def chunk_of(ref: SwapRef, messages: list[Message]) -> Chunk:
    """The chunk `ref` points at, which holds `messages`."""
    body_bytes = sum(len(m.body) for m in messages)
    return Chunk(ref, len(messages), body_bytes, messages[0].seq, messages[-1].seq)


class PackedChunk:
    """Messages gathered as a spilled chunk's bytes (encode_chunk's format) from their encoded
    form, never decoded: how recovery files a backlog beyond the swap point (persist.restoring)."""

    __slots__ = ("body_bytes", "count", "first_seq", "last_seq", "parts")

    def __init__(self) -> None:
        self.parts: list[bytes] = [b""]  # the count goes first, once known
        self.count = 0
        self.body_bytes = 0
        self.first_seq = self.last_seq = 0

    def add(
        self, encoded: bytes, seq: int, size: int, location: int, marks: list[int] | None
    ) -> None:
        """One more message: `encoded` as encode_message writes it, `size` its body bytes."""
        if not self.count:
            self.first_seq = seq
        self.last_seq = seq
        self.count += 1
        self.body_bytes += size
        _add_entry(self.parts, encoded, location, marks)

    @property
    def full(self) -> bool:
        """As large as a chunk the pending list spills itself (CHUNK_MESSAGES, CHUNK_BYTES)."""
        return self.count >= CHUNK_MESSAGES or self.body_bytes >= CHUNK_BYTES

    def data(self) -> bytes:
        self.parts[0] = _LENGTH.pack(self.count)
        return b"".join(self.parts)


class SpillableRun:
    """Messages in arrival order in three parts: a head in memory; then, once the broker's memory
    ledger is over the swap point, chunks of up to CHUNK_MESSAGES (or CHUNK_BYTES) written to the
    swap area; then the newest, in memory until they make a chunk. Once one message has spilled,
    every later one does too until the run is drained, so the order is always head, chunks,
    filling.

    The one spilling structure of the core: each priority level of a pending list is one, and so
    is every SpillingRun (core.containers.spilling: topic logs, leases, stages). Messages in
    memory are counted in the ledger (`hold`, `let_go`); spilled ones are not."""

    __slots__ = ("_ledger", "_spill", "chunks", "filling", "filling_bytes", "head")

    def __init__(self, ledger: MemoryLedger, spill: Spill | None) -> None:
        self.head: deque[Message] = deque()  # in memory, oldest first
        self.chunks: deque[Chunk] = deque()  # spilled, after the head
        self.filling: list[Message] = []  # newest, in memory until they make a chunk
        self.filling_bytes = 0
        self._ledger = ledger
        self._spill = spill

    @property
    def spilling(self) -> bool:
        """Whether a message appended now goes to the swap area: a run that has spilled keeps
        spilling until it is drained, and any does once memory is over the swap point."""
        return self._spill is not None and (
            bool(self.chunks) or bool(self.filling) or self._ledger.over
        )

    def add(self, message: Message) -> list[Message] | None:
        """Append `message`; when that made a chunk and spilled it, the chunk's messages."""
        self.hold(message)
        if not self.spilling:
            self.head.append(message)
            return None
        self.filling.append(message)
        self.filling_bytes += len(message.body)
        if len(self.filling) >= CHUNK_MESSAGES or self.filling_bytes >= CHUNK_BYTES:
            return self.spill_filling()
        return None

    def spill_filling(self) -> list[Message]:
        """Write the messages being filled to the swap area as one chunk; return them."""
        assert self._spill is not None
        messages = self.filling
        self.chunks.append(chunk_of(self._spill.write(encode_chunk(messages)), messages))
        for message in messages:
            self.let_go(message)
        self.filling = []
        self.filling_bytes = 0
        return messages

    def read_chunk(self, chunk: Chunk, *, free: bool) -> list[Message]:
        """A spilled chunk's messages, read back; `free`: the chunk leaves the swap area."""
        assert self._spill is not None
        messages = decode_chunk(self._spill.read(chunk.ref))
        if free:
            self._spill.free(chunk.ref)
        return messages

    def free_chunks(self) -> None:
        """Free every spilled chunk unread (the run is being dropped)."""
        if self._spill is not None:
            for chunk in self.chunks:
                self._spill.free(chunk.ref)

    def hold(self, message: Message) -> None:
        """`message` is now in memory in this run."""
        self._ledger.hold(message)

    def let_go(self, message: Message) -> None:
        """`message` left this run's memory (taken, spilled, dropped)."""
        self._ledger.let_go(message)


class _Level(SpillableRun):
    """One priority level of a pending list."""

    __slots__ = ()

    @property
    def spilled(self) -> bool:
        return bool(self.chunks or self.filling)

    def hold(self, message: Message) -> None:
        # A topic's message sits in the list of each of its subscribers, sharing one body: the
        # ledger counts it once, for the first list.
        message.resident += 1
        if message.resident == 1:
            self._ledger.hold(message)

    def let_go(self, message: Message) -> None:
        message.resident -= 1
        if message.resident == 0:
            self._ledger.let_go(message)


class PendingList:
    """One level per priority and a bit mask of the non-empty levels.

    Appending and popping are O(1); the list's size is bounded by the destination's limits,
    its memory by the ledger's threshold when a spill area is given.
    """

    __slots__ = ("_bytes", "_count", "_expiring", "_ledger", "_levels", "_mask", "_spill")

    def __init__(self, ledger: MemoryLedger | None = None, spill: Spill | None = None) -> None:
        self._ledger = ledger if ledger is not None else MemoryLedger()
        self._spill = spill
        self._levels = self._new_levels()
        self._mask = 0  # bit p set when level p holds messages
        self._count = 0
        self._bytes = 0
        self._expiring = 0  # in-memory messages with an expiry, so sweeps can skip the rest

    def _new_levels(self) -> list[_Level]:
        return [_Level(self._ledger, self._spill) for _ in range(PRIORITY_LEVELS)]

    def __len__(self) -> int:
        return self._count

    def __bool__(self) -> bool:
        return self._count > 0

    @property
    def bytes(self) -> int:
        """Total body bytes of the messages held, in memory or spilled."""
        return self._bytes

    @property
    def first_seq(self) -> int | None:
        """The lowest sequence number held, of any priority (None when empty)."""
        mask = self._mask
        levels = [self._levels[p] for p in range(PRIORITY_LEVELS) if mask & (1 << p)]
        return min((self._first_seq(level) for level in levels), default=None)

    @property
    def spilled(self) -> int:
        """Messages held in the swap area."""
        return sum(c.count for level in self._levels for c in level.chunks)

    # -- adding and taking -----------------------------------------------------------------------

    def spills(self, priority: int) -> bool:
        """Whether a message of `priority` appended now goes to the swap area: a level that has
        spilled keeps spilling until its tail is drained, and any does once memory is over."""
        return self._levels[priority].spilling

    def append(self, message: Message) -> None:
        """Add a newly arrived message behind every message of its priority."""
        spilled = self._levels[message.priority].add(message)
        self._added(message)
        if spilled is not None:
            self._spilled(spilled)

    def append_packed(self, priority: int, packed: PackedChunk) -> None:
        """Add messages packed as a chunk behind every message of `priority`, straight to the
        swap area (at start-up, a recovered backlog beyond the swap point)."""
        assert self._spill is not None
        assert packed.count
        level = self._levels[priority]
        if level.filling:
            self._spilled(level.spill_filling())  # older than the packed ones: goes first
        ref = self._spill.write(packed.data())
        level.chunks.append(
            Chunk(ref, packed.count, packed.body_bytes, packed.first_seq, packed.last_seq)
        )
        self._mask |= 1 << priority
        self._count += packed.count
        self._bytes += packed.body_bytes

    def restore(self, message: Message) -> None:
        """Put a message that was taken back in its place (by sequence number).

        Usually it is older than everything spilled and goes back into the head; one a selective
        consumer took from the spilled part goes back into the chunk (or the chunk being
        filled) where its sequence number falls.
        """
        level = self._levels[message.priority]
        seq = message.seq
        first_spilled = (
            (level.chunks[0].first_seq if level.chunks else level.filling[0].seq)
            if level.spilled
            else None
        )
        if first_spilled is None or seq < first_spilled:
            level.head.insert(bisect.bisect_right(level.head, seq, key=_seq), message)
        elif level.chunks and seq <= level.chunks[-1].last_seq:
            self._restore_into_chunk(level, message)
            self._added(message, in_memory=False)
            return
        else:
            level.filling.insert(bisect.bisect_right(level.filling, seq, key=_seq), message)
            level.filling_bytes += len(message.body)
        level.hold(message)
        self._added(message)

    def _restore_into_chunk(self, level: _Level, message: Message) -> None:
        """Rewrite the spilled chunk `message` belongs in, with it inserted."""
        assert self._spill is not None
        index = next(i for i, c in enumerate(level.chunks) if message.seq <= c.last_seq)
        chunk = level.chunks[index]
        messages = level.read_chunk(chunk, free=True)
        messages.insert(bisect.bisect_right(messages, message.seq, key=_seq), message)
        level.chunks[index] = chunk_of(self._spill.write(encode_chunk(messages)), messages)

    def pop(self) -> Message | None:
        """Remove and return the first message (highest priority, oldest), or None."""
        mask = self._mask
        if not mask:
            return None
        return self._pop_level(mask.bit_length() - 1)

    def evict(self, *, lowest_priority: bool) -> Message | None:
        """Remove and return the message a full destination gives up for a new one.

        REMOVE_OLDEST: the oldest message of any priority (lowest sequence number).
        REMOVE_LOW_PRIORITY: the oldest message of the lowest priority present.
        """
        mask = self._mask
        if not mask:
            return None
        if lowest_priority:
            return self._pop_level((mask & -mask).bit_length() - 1)
        oldest = min(
            (p for p in range(PRIORITY_LEVELS) if mask & (1 << p)),
            key=lambda p: self._first_seq(self._levels[p]),
        )
        return self._pop_level(oldest)

    def eviction_candidate(self, *, lowest_priority: bool) -> tuple[int, int] | None:
        """(priority, sequence number) of the message `evict` would take now, or None."""
        mask = self._mask
        if not mask:
            return None
        if lowest_priority:
            priority = (mask & -mask).bit_length() - 1
        else:
            priority = min(
                (p for p in range(PRIORITY_LEVELS) if mask & (1 << p)),
                key=lambda p: self._first_seq(self._levels[p]),
            )
        return priority, self._first_seq(self._levels[priority])

    def hold_in_level(self, message: Message) -> None:
        """Count `message`, held outside the levels (a subclass's own order), in the ledger as
        its priority's level would."""
        self._levels[message.priority].hold(message)

    def let_go_in_level(self, message: Message) -> None:
        """`hold_in_level`'s message left."""
        self._levels[message.priority].let_go(message)

    def _first_seq(self, level: _Level) -> int:
        if level.head:
            return level.head[0].seq
        if level.chunks:
            return level.chunks[0].first_seq
        return level.filling[0].seq

    def _pop_level(self, priority: int) -> Message:
        level = self._levels[priority]
        if not level.head:
            self._load(level)
        message = level.head.popleft()
        if not level.head and not level.spilled:
            self._mask &= ~(1 << priority)
        level.let_go(message)
        self._removed(message)
        return message

    def _spilled(self, messages: list[Message]) -> None:
        """`messages` went to the swap area: the sweep for expired ones no longer sees them."""
        for message in messages:
            if message.expires:
                self._expiring -= 1

    def _load(self, level: _Level) -> None:
        """Bring the oldest spilled messages of `level` back into its head."""
        if level.chunks:
            messages = level.read_chunk(level.chunks.popleft(), free=True)
            for message in messages:
                level.hold(message)
                if message.expires:
                    self._expiring += 1
            level.head.extend(messages)
        else:
            level.head.extend(level.filling)  # already in memory and counted
            level.filling = []
            level.filling_bytes = 0

    # -- scanning ---------------------------------------------------------------------------------

    def following(self, cursor: tuple[int, int], limit: int) -> list[Message]:
        """Up to `limit` messages after position `cursor` = (priority, seq), in delivery order.

        For browsing: nothing is removed. Start with cursor (PRIORITY_LEVELS, 0) for the first.
        """
        found: list[Message] = []
        cursor_priority, cursor_seq = cursor
        for priority in range(min(cursor_priority, PRIORITY_LEVELS - 1), -1, -1):
            after = cursor_seq if priority == cursor_priority else -1
            for message in self._level_after(self._levels[priority], after):
                found.append(message)
                if len(found) >= limit:
                    return found
        return found

    def _level_after(self, level: _Level, seq: int) -> Iterator[Message]:
        """The messages of a level with a sequence number above `seq`, in order."""
        start = bisect.bisect_right(level.head, seq, key=_seq) if seq >= 0 else 0
        yield from itertools.islice(level.head, start, None)
        for chunk in list(level.chunks):
            if chunk.last_seq > seq:
                yield from (m for m in level.read_chunk(chunk, free=False) if m.seq > seq)
        yield from (m for m in level.filling if m.seq > seq)

    def extract(self, choose: Callable[[Message], bool], stop: Callable[[], bool]) -> int:
        """Scan in delivery order, removing each message `choose` takes; return how many.

        `choose(message)` returns True when it took the message. The scan ends early when
        `stop()` is true. O(n) in the messages scanned, spilled ones included (each spilled chunk
        that loses messages is written back without them): used for consumers with selectors,
        whose next message may be anywhere in the list.
        """
        taken = 0
        for priority in range(PRIORITY_LEVELS - 1, -1, -1):
            level = self._levels[priority]
            if level.head and not stop():
                kept, count = self._extract_run(level, list(level.head), choose, stop)
                level.head = deque(kept)
                taken += count
            if level.chunks and not stop():
                chunks: deque[Chunk] = deque()
                for chunk in level.chunks:
                    replacement, count = (
                        (chunk, 0) if stop() else self._extract_chunk(level, chunk, choose, stop)
                    )
                    taken += count
                    if replacement is not None:
                        chunks.append(replacement)
                level.chunks = chunks
            if level.filling and not stop():
                kept, count = self._extract_run(level, level.filling, choose, stop)
                level.filling = kept
                level.filling_bytes = sum(len(m.body) for m in kept)
                taken += count
            if not level.head and not level.spilled:
                self._mask &= ~(1 << priority)
            if stop():
                break
        return taken

    def _extract_run(
        self,
        level: _Level,
        messages: list[Message],
        choose: Callable[[Message], bool],
        stop: Callable[[], bool],
    ) -> tuple[list[Message], int]:
        """Messages held in memory: the kept ones, and how many were taken."""
        kept: list[Message] = []
        for index, message in enumerate(messages):
            if stop():
                kept.extend(messages[index:])
                break
            if choose(message):
                level.let_go(message)
                self._removed(message)
            else:
                kept.append(message)
        return kept, len(messages) - len(kept)

    def _extract_chunk(
        self,
        level: _Level,
        chunk: Chunk,
        choose: Callable[[Message], bool],
        stop: Callable[[], bool],
    ) -> tuple[Chunk | None, int]:
        """Scan one spilled chunk; return what replaces it (None: nothing left) and the count
        taken. A chunk that lost messages is written again without them."""
        messages = level.read_chunk(chunk, free=False)
        kept: list[Message] = []
        for position, message in enumerate(messages):
            if stop():
                kept.extend(messages[position:])
                break
            if choose(message):
                self._removed(message, in_memory=False)
            else:
                kept.append(message)
        taken = len(messages) - len(kept)
        if not taken:
            return chunk, 0
        assert self._spill is not None
        self._spill.free(chunk.ref)
        if not kept:
            return None, taken
        return chunk_of(self._spill.write(encode_chunk(kept)), kept), taken

    # -- housekeeping -----------------------------------------------------------------------------

    def remove_expired(self, now_ms: int) -> list[Message]:
        """Remove and return every expired message held in memory (spilled ones are dropped when
        they are read back). O(n) in memory, skipped when nothing in memory can expire."""
        if not self._expiring:
            return []
        expired: list[Message] = []
        for level in self._levels:
            found: list[Message] = []
            for attribute in ("head", "filling"):
                messages = getattr(level, attribute)
                if any(m.expired(now_ms) for m in messages):
                    found.extend(m for m in messages if m.expired(now_ms))
                    kept = [m for m in messages if not m.expired(now_ms)]
                    setattr(level, attribute, deque(kept) if attribute == "head" else kept)
            level.filling_bytes = sum(len(m.body) for m in level.filling)
            for message in found:
                level.let_go(message)
                self._removed(message)
            expired.extend(found)
        self._recompute_mask()
        return expired

    def clear(self) -> int:
        """Remove every message (spilled ones are freed unread); return how many there were."""
        count = self._count
        for level in self._levels:
            for message in itertools.chain(level.head, level.filling):
                level.let_go(message)
            level.free_chunks()
        self._levels = self._new_levels()
        self._mask = self._count = self._bytes = self._expiring = 0
        return count

    def __iter__(self) -> Iterator[Message]:
        """Messages in delivery order (for inspection; spilled ones are read, not removed)."""
        for level in reversed(self._levels):
            yield from self._level_after(level, -1)

    def _recompute_mask(self) -> None:
        self._mask = 0
        for priority, level in enumerate(self._levels):
            if level.head or level.spilled:
                self._mask |= 1 << priority

    def _added(self, message: Message, *, in_memory: bool = True) -> None:
        self._mask |= 1 << message.priority
        self._count += 1
        self._bytes += len(message.body)
        if message.expires and in_memory:
            self._expiring += 1

    def _removed(self, message: Message, *, in_memory: bool = True) -> None:
        self._count -= 1
        self._bytes -= len(message.body)
        if message.expires and in_memory:
            self._expiring -= 1


def _seq(message: Message) -> int:
    return message.seq


def encode_chunk(messages: list[Message]) -> bytes:
    """count, then per message: length, the message, its journal bookkeeping."""
    parts = [_LENGTH.pack(len(messages))]
    for message in messages:
        _add_entry(parts, encode_message(message), message.location, message.marks)
    return b"".join(parts)


def _add_entry(parts: list[bytes], encoded: bytes, location: int, marks: list[int] | None) -> None:
    """One message of a chunk: its length, the message, its journal bookkeeping."""
    parts.append(_pack_length(len(encoded)))
    parts.append(encoded)
    parts.append(_pack_bookkeeping(location, len(marks) if marks else 0))
    if marks:
        parts.extend(_MARK.pack(mark) for mark in marks)


def decode_chunk(data: bytes) -> list[Message]:
    (count,) = _LENGTH.unpack_from(data, 0)
    offset = _LENGTH.size
    messages = []
    for _ in range(count):
        (length,) = _LENGTH.unpack_from(data, offset)
        offset += _LENGTH.size
        message = decode_message(data[offset : offset + length])
        offset += length
        message.location, mark_count = _BOOKKEEPING.unpack_from(data, offset)
        offset += _BOOKKEEPING.size
        if mark_count:
            message.marks = [
                _MARK.unpack_from(data, offset + i * _MARK.size)[0] for i in range(mark_count)
            ]
            offset += mark_count * _MARK.size
        messages.append(message)
    return messages
