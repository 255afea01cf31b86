"""An append-only run of messages that stays within the memory budget by spilling to disk.

Topic logs, queue leases and stages all keep messages in arrival order and let them go only at
the front or all at once. `SpillingRun` holds them in three parts, in order: a head in memory;
then, once the broker's memory ledger is over the swap point, chunks of up to CHUNK_MESSAGES
(or CHUNK_BYTES) written to the swap area; then the newest, in memory until they make a chunk.
Once one message has spilled, every later one does too, so the order is always head, chunks,
filling. Memory then holds the oldest messages and a small reference per chunk. That structure
is core.containers.pending's SpillableRun, the one a pending list's priority levels are made
of; SpillingRun adds counts, reads by position and draining.

Messages in memory are counted in the ledger; spilled ones are not (their chunk holds only the
reference to the swap area).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

from sluiceway.core.containers.pending import Chunk, Spill, SpillableRun
from sluiceway.core.values.memory import MemoryLedger
from sluiceway.core.values.message import Message


class SpillingRun(SpillableRun):
    """Messages in arrival order: head (memory), chunks (swap area), filling (memory)."""

    __slots__ = ("_bytes", "_count")

    def __init__(self, ledger: MemoryLedger, spill: Spill | None) -> None:
        super().__init__(ledger, spill)
        self._count = 0
        self._bytes = 0

    def __len__(self) -> int:
        return self._count

    @property
    def bytes(self) -> int:
        """Body bytes of the messages held, in memory or spilled."""
        return self._bytes

    @property
    def spilled(self) -> int:
        """Messages held in the swap area."""
        return sum(chunk.count for chunk in self.chunks)

    def append(self, message: Message) -> None:
        self._count += 1
        self._bytes += message.size
        self.add(message)

    def _parts(self) -> Iterator[tuple[int, Chunk | None, list[Message] | deque[Message]]]:
        """(size, chunk or None, messages in memory or empty) for each part, in order."""
        yield len(self.head), None, self.head
        for chunk in self.chunks:
            yield chunk.count, chunk, []
        yield len(self.filling), None, self.filling

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
                messages = (
                    self.read_chunk(chunk, free=False) if chunk is not None else list(in_memory)
                )
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
                self.let_go(message)
        return run

    def drain(self) -> Iterator[list[Message]]:
        """Remove every message and yield them in order, at most one spilled chunk at a time
        (read back and freed), so a long run is never all in memory at once."""
        if self.head:
            run, self.head = list(self.head), deque()
            yield self._forget(run, counted=True)
        while self.chunks:
            yield self._forget(self.read_chunk(self.chunks.popleft(), free=True), counted=False)
        if self.filling:
            run, self.filling, self.filling_bytes = self.filling, [], 0
            yield self._forget(run, counted=True)

    def discard(self) -> None:
        """Drop every message; spilled chunks are freed without being read."""
        for message in (*self.head, *self.filling):
            self.let_go(message)
        self.free_chunks()
        self.head, self.chunks, self.filling = deque(), deque(), []
        self.filling_bytes = self._count = self._bytes = 0
