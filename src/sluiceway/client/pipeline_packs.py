"""Packed reads on the client side: a MESSAGE carrying many messages (protocol.pack), as columns
for a reader that wants them (`Read.packs()`), or message by message for one that does not.

A broker that does not know the `pack` header sends its messages one per frame; `Read.packs()`
then packs them on this side, so a columnar reader sees packs whatever the broker.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from sluiceway.client.pipeline_values import PipelineMessage
from sluiceway.protocol.frames import DELIVERY_HEADERS
from sluiceway.protocol.pack import PERSISTENT, REDELIVERED, Pack, PackWriter, read_pack

# Headers of a packed MESSAGE frame that belong to every message of the pack.
_SHARED = ("destination", "lease")
_BROKER_HEADERS = DELIVERY_HEADERS | {"lease"}


@dataclass(frozen=True, slots=True)
class MessagePack:
    """The messages of one packed MESSAGE: its columns (`pack`), and the headers that are the
    same for all of them (`destination`, and `lease` for a lease read)."""

    pack: Pack
    shared: tuple[tuple[str, str], ...]

    @classmethod
    def from_frame(cls, body: bytes, headers: dict[str, str]) -> MessagePack:
        shared = tuple((name, headers[name]) for name in _SHARED if name in headers)
        return cls(read_pack(body), shared)

    @classmethod
    def of(cls, messages: Sequence[PipelineMessage]) -> MessagePack:
        """Messages that came one per frame, packed here."""
        writer = PackWriter()
        shared: tuple[tuple[str, str], ...] = ()
        for message in messages:
            headers = message.headers
            shared = tuple((name, headers[name]) for name in _SHARED if name in headers)
            writer.add(
                message.message_id,
                message.body,
                sequence=message.sequence,
                timestamp=message.timestamp,
                expires=message.expires,
                priority=message.priority,
                persistent=message.persistent,
                delivery_count=message.delivery_count,
                headers=[(k, v) for k, v in headers.items() if k not in _BROKER_HEADERS],
            )
        return cls(read_pack(writer.finish()), shared)

    @property
    def count(self) -> int:
        return self.pack.count

    @property
    def destination(self) -> str:
        return dict(self.shared).get("destination", "")

    def message(self, index: int) -> PipelineMessage:
        """Message `index` with the headers a MESSAGE of its own would have carried."""
        pack = self.pack
        flags = pack.flags[index]
        count = pack.delivery_counts[index]
        headers = {
            "message-id": pack.message_id(index),
            **dict(self.shared),
            "redelivered": "true" if flags & REDELIVERED else "false",
            "delivery-count": str(count),
            "priority": str(pack.priorities[index]),
            "persistent": "true" if flags & PERSISTENT else "false",
            "expires": str(pack.expires[index]),
            "timestamp": str(pack.timestamps[index]),
            "sequence": str(pack.sequences[index]),
        }
        for name, value in pack.own_headers(index):
            headers.setdefault(name, value)
        return PipelineMessage(pack.body(index), headers)

    def messages(self, start: int = 0) -> Iterator[PipelineMessage]:
        for index in range(start, self.count):
            yield self.message(index)

    def tail(self, start: int) -> MessagePack:
        """The pack from message `start` on (a read resumed after a failover)."""
        if start <= 0:
            return self
        rest = MessagePack.of(list(self.messages(start)))
        return MessagePack(rest.pack, self.shared)
