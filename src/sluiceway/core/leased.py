"""What a queue lease holds, and how a reader sees it: its messages, and the lease read.

A lease's messages left the queue's pending list but not the queue: they stay counted in its
limits until the lease is acknowledged (consumed) or released (given back). Like a pending list,
`LeasedMessages` keeps the first ones in memory and, once the broker's memory ledger is over
`imq.swap.threshold`, writes the rest to the swap area in chunks; reading a lease again reads
the chunks back without removing them.

`LeaseReader` is the subscription a lease read (SUBSCRIBE with `lease:GROUP/N`) creates: it sends
the lease's messages in order, each with a `lease` header, without consuming them, then the end
marker with the lease's state.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import TYPE_CHECKING

from sluiceway.core.lease_records import LeaseState
from sluiceway.core.memory import MemoryLedger, message_cost
from sluiceway.core.message import Message
from sluiceway.core.pending import (
    CHUNK_BYTES,
    CHUNK_MESSAGES,
    Chunk,
    Spill,
    decode_chunk,
    encode_chunk,
)
from sluiceway.core.subscription import BrowserSubscription

if TYPE_CHECKING:
    from sluiceway.core.leases import Lease


class LeasedMessages:
    """A lease's messages, in the order they left the queue (queue order)."""

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
        self._head: list[Message] = []  # in memory
        self._chunks: list[Chunk] = []  # spilled, after the head
        self._filling: list[Message] = []  # in memory until they make a chunk, after the chunks
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

    def append(self, message: Message) -> None:
        self._count += 1
        self._bytes += message.size
        self._ledger.add(message_cost(message.size))
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
        self._chunks.append(Chunk(self._spill.write(encode_chunk(messages)), messages))
        for message in messages:
            self._ledger.remove(message_cost(message.size))

    def read(self, start: int, limit: int) -> list[Message]:
        """Up to `limit` messages from position `start` (0: the first), not removed."""
        found: list[Message] = []
        offset = 0  # position of the first message of the part being looked at
        for part in self._parts():
            if len(found) >= limit:
                break
            wanted = start + len(found)
            size = part.count if isinstance(part, Chunk) else len(part)
            if wanted < offset + size:
                messages = self._load(part) if isinstance(part, Chunk) else part
                first = wanted - offset
                found.extend(messages[first : first + limit - len(found)])
            offset += size
        return found

    def _parts(self) -> Iterator[list[Message] | Chunk]:
        yield self._head
        yield from self._chunks
        yield self._filling

    def _load(self, chunk: Chunk) -> list[Message]:
        assert self._spill is not None
        return decode_chunk(self._spill.read(chunk.ref))

    def drain(self) -> Iterator[list[Message]]:
        """Remove every message, in order, a part at a time (spilled chunks are read back and
        freed), so a large lease is never all in memory at once."""
        head, chunks, filling = self._head, self._chunks, self._filling
        self._head, self._chunks, self._filling = [], [], []
        self._count = self._bytes = self._filling_bytes = 0
        for messages in (head, filling):
            for message in messages:
                self._ledger.remove(message_cost(message.size))
        if head:
            yield head
        for chunk in chunks:
            messages = self._load(chunk)
            assert self._spill is not None
            self._spill.free(chunk.ref)
            yield messages
        if filling:
            yield filling


class LeaseReader(BrowserSubscription):
    """A lease read: the lease's messages, each labelled `lease:GROUP/N`, then the end marker
    (`lease`, `lease-state`, `lease-count`, `lease-expires` and the range read's headers)."""

    __slots__ = ("_index", "_lease", "_name", "_state")

    def _setup(self) -> None:
        super()._setup()
        self._index = 0  # position in the lease of the next message to send
        self._lease: Lease | None = None
        self._name = ""
        self._state = LeaseState.EXPIRED

    def show(self, name: str, state: LeaseState, lease: Lease | None) -> None:
        """What this read answers: lease `name`, in `state`, with `lease` when it is open."""
        self._name, self._state, self._lease = name, state, lease
        if lease is None or not len(lease.messages):
            # Nothing is returned: a following read by sequence would start after the head.
            self._from = self.destination.last_seq + 1

    def fill(self) -> None:
        while not self._done and self.ready():
            lease = self._lease
            batch = []
            if lease is not None and lease.state is LeaseState.OPEN:
                batch = lease.messages.read(self._index, self._room())
            if not batch:
                self._finish()
                return
            for message in batch:
                self._index += 1
                self.stage_seen(_labelled(message, self._name))

    def end_headers(self) -> list[tuple[str, str]]:
        lease = self._lease
        # A lease acknowledged or expired while it was being read reports what it is now.
        state = lease.state if lease is not None else self._state
        open_now = lease is not None and state is LeaseState.OPEN
        return [
            *super().end_headers(),
            ("lease", self._name),
            ("lease-state", state.value),
            ("lease-count", str(len(lease.messages) if lease is not None and open_now else 0)),
            ("lease-expires", str(lease.expires if lease is not None else 0)),
        ]


def _labelled(message: Message, name: str) -> Message:
    """A copy of `message` to write, carrying its lease's name; the journal bookkeeping stays
    with the original, which the lease keeps."""
    return dataclasses.replace(
        message, headers=(("lease", name), *message.headers), location=0, marks=None
    )
