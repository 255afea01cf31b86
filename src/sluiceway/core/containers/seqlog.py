"""A topic's retained messages, in sequence-number order: read at any position, trimmed in front.

A topic with durable subscriptions keeps each message one of them may still need here, once,
whatever the number of subscriptions; each subscription reads it through a cursor. Like a
pending list, the log keeps its oldest messages in memory and, over the memory threshold,
writes newer ones to the swap area in chunks; reading an old position reads the chunk back
without removing it.
"""

from __future__ import annotations

import bisect

from sluiceway.core.containers.pending import chunk_of, encode_chunk
from sluiceway.core.containers.spilling import SpillingRun
from sluiceway.core.values.message import Message


class SeqLog(SpillingRun):
    """Messages ordered by `seq` (they are appended in that order)."""

    __slots__ = ()

    @property
    def first_seq(self) -> int | None:
        if self.head:
            return self.head[0].seq
        if self.chunks:
            return self.chunks[0].first_seq
        return self.filling[0].seq if self.filling else None

    def read(self, from_seq: int, limit: int, to_seq: int | None = None) -> list[Message]:
        """Up to `limit` messages with from_seq <= seq (< to_seq), in order, not removed."""
        found: list[Message] = []
        start = bisect.bisect_left(self.head, from_seq, key=_seq)
        for index in range(start, len(self.head)):
            if not self._take(self.head[index], found, limit, to_seq):
                return found
        for chunk in self.chunks:
            if chunk.last_seq < from_seq:
                continue
            for message in self.read_chunk(chunk, free=False):
                if message.seq >= from_seq and not self._take(message, found, limit, to_seq):
                    return found
        for message in self.filling:
            if message.seq >= from_seq and not self._take(message, found, limit, to_seq):
                return found
        return found

    @staticmethod
    def _take(message: Message, found: list[Message], limit: int, to_seq: int | None) -> bool:
        """Add `message` if in range; False once the read is complete."""
        if to_seq is not None and message.seq >= to_seq:
            return False
        found.append(message)
        return len(found) < limit

    def trim(self, below_seq: int) -> list[Message]:
        """Remove and return every message with seq < below_seq (spilled ones read back)."""
        trimmed: list[Message] = []
        while self.head and self.head[0].seq < below_seq:
            message = self.head.popleft()
            self.let_go(message)
            trimmed.append(message)
        while self.chunks and not self.head and self.chunks[0].first_seq < below_seq:
            self._trim_chunk(below_seq, trimmed)
        if not self.head and not self.chunks:
            while self.filling and self.filling[0].seq < below_seq:
                message = self.filling.pop(0)
                self.filling_bytes -= len(message.body)
                self.let_go(message)
                trimmed.append(message)
        self._count -= len(trimmed)
        self._bytes -= sum(len(m.body) for m in trimmed)
        return trimmed

    def _trim_chunk(self, below_seq: int, trimmed: list[Message]) -> None:
        assert self._spill is not None
        chunk = self.chunks.popleft()
        messages = self.read_chunk(chunk, free=True)
        kept = [m for m in messages if m.seq >= below_seq]
        trimmed.extend(m for m in messages if m.seq < below_seq)
        if kept:
            self.chunks.appendleft(chunk_of(self._spill.write(encode_chunk(kept)), kept))

    def clear(self) -> list[Message]:
        """Remove everything (for persistent messages the caller needs them: they are read)."""
        return self.trim(2**63)


def _seq(message: Message) -> int:
    return message.seq
