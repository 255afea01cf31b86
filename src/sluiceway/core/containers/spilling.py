"""An append-only run of messages that stays within the memory budget by spilling to disk.

Topic logs, queue leases and stages all keep messages in arrival order and let them go only at
the front or all at once. `SpillingRun` holds them in three parts, in order: a head in memory;
then, once the broker's memory ledger is over the swap point, chunks of up to CHUNK_MESSAGES
(or CHUNK_BYTES) written to the swap area; then the newest, in memory until they make a chunk.
Once one message has spilled, every later one does too, so the order is always head, chunks,
filling. Memory then holds the oldest messages and a small reference per chunk.

Messages in memory are counted in the ledger; spilled ones are not (their chunk holds only the
reference to the swap area).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

from sluiceway.core.containers.pending import (
    CHUNK_BYTES,
    CHUNK_MESSAGES,
    Chunk,
    Spill,
    chunk_of,
    decode_chunk,
    encode_chunk,
)
from sluiceway.core.values.memory import MemoryLedger
from sluiceway.core.values.message import Message


class SpillingRun:
    """Messages in arrival order: head (memory), chunks (swap area), filling (memory)."""

    __slots__ = (
        "_bytes",
        "_chunks",
        "_count",
        "_filling",
        "_filling_bytes",
        "_head",
        "_ledger",
        "_spill",
    )

    def __init__(self, ledger: MemoryLedger, spill: Spill | None) -> None:
        self._head: deque[Message] = deque()
        self._chunks: deque[Chunk] = deque()
        self._filling: list[Message] = []
        self._filling_bytes = 0
        self._count = 0
        self._bytes = 0
        self._ledger = ledger
        self._spill = spill

    def __len__(self) -> int:
        return self._count

    @property
    def bytes(self) -> int:
        """Body bytes of the messages held, in memory or spilled."""
        return self._bytes

    @property
    def spilled(self) -> int:
        """Messages held in the swap area."""
        return sum(chunk.count for chunk in self._chunks)

    def append(self, message: Message) -> None:
        self._count += 1
        self._bytes += message.size
        self._ledger.hold(message)
        if self._spill is not None and (self._chunks or self._filling or self._ledger.over):
            self._filling.append(message)
            self._filling_bytes += message.size
            if len(self._filling) >= CHUNK_MESSAGES or self._filling_bytes >= CHUNK_BYTES:
                self._spill_filling()
        else:
            self._head.append(message)

    def _spill_filling(self) -> None:
        assert self._spill is not None
        messages, self._filling, self._filling_bytes = self._filling, [], 0
        self._chunks.append(chunk_of(self._spill.write(encode_chunk(messages)), messages))
        for message in messages:
            self._ledger.let_go(message)

    def _load(self, chunk: Chunk) -> list[Message]:
        """A spilled chunk's messages, read back (the chunk stays where it is)."""
        assert self._spill is not None
        return decode_chunk(self._spill.read(chunk.ref))

    def _parts(self) -> Iterator[tuple[int, Chunk | None, list[Message] | deque[Message]]]:
        """(size, chunk or None, messages in memory or empty) for each part, in order."""
        yield len(self._head), None, self._head
        for chunk in self._chunks:
            yield chunk.count, chunk, []
        yield len(self._filling), None, self._filling

    def read_at(self, start: int, limit: int) -> list[Message]:
        """Up to `limit` messages from position `start` (0: the first), not removed; only the
        chunks that hold them are read back."""
        found: list[Message] = []
        offset = 0  # position of the first message of the part looked at
        for size, chunk, in_memory in self._parts():
            if len(found) >= limit:
                break
            wanted = start + len(found)
            if wanted < offset + size:
                messages = self._load(chunk) if chunk is not None else list(in_memory)
                first = wanted - offset
                found.extend(messages[first : first + limit - len(found)])
            offset += size
        return found

    def _forget(self, run: list[Message], *, counted: bool) -> list[Message]:
        """Messages that left: out of the counts (and of the ledger when they were in memory)."""
        self._count -= len(run)
        self._bytes -= sum(message.size for message in run)
        if counted:
            for message in run:
                self._ledger.let_go(message)
        return run

    def drain(self) -> Iterator[list[Message]]:
        """Remove every message and yield them in order, at most one spilled chunk at a time
        (read back and freed), so a long run is never all in memory at once."""
        if self._head:
            run, self._head = list(self._head), deque()
            yield self._forget(run, counted=True)
        while self._chunks:
            chunk = self._chunks.popleft()
            run = self._load(chunk)
            assert self._spill is not None
            self._spill.free(chunk.ref)
            yield self._forget(run, counted=False)
        if self._filling:
            run, self._filling, self._filling_bytes = self._filling, [], 0
            yield self._forget(run, counted=True)

    def discard(self) -> None:
        """Drop every message; spilled chunks are freed without being read."""
        for message in (*self._head, *self._filling):
            self._ledger.let_go(message)
        if self._spill is not None:
            for chunk in self._chunks:
                self._spill.free(chunk.ref)
        self._head, self._chunks, self._filling = deque(), deque(), []
        self._filling_bytes = self._count = self._bytes = 0
