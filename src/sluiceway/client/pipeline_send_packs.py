"""Packed sends on the client side (pipelines-protocol.md, "Packed sends"): runs of messages for
one destination packed into one SEND each, and a refused pack's messages, one by one again.

A pack closes at MAX_PACK messages or PACK_BYTES of bodies; a message whose body alone is that
large goes as a SEND of its own.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from sluiceway.client.pipeline_values import OutgoingMessage
from sluiceway.protocol.pack import (
    MAX_PACK,
    PACK_BYTES,
    PERSISTENT,
    header_lines,
    little_endian,
    offsets_of,
    read_pack,
    send_pack,
)


@dataclass(frozen=True, slots=True)
class OutgoingPack:
    """Messages for one destination, as the body of one packed SEND."""

    destination: str
    count: int
    body: bytes

    @classmethod
    def of(cls, messages: Sequence[OutgoingMessage]) -> OutgoingPack:
        """`messages`, all for one destination, packed."""
        destination = messages[0].destination
        if any(m.destination != destination for m in messages):
            raise ValueError("the messages of one pack go to one destination")
        bodies = [m.body for m in messages]
        headers = [header_lines(tuple(m.headers.items())) if m.headers else b"" for m in messages]
        body = send_pack(
            len(messages),
            offsets_of(bodies),
            b"".join(bodies),
            expires=little_endian(array("q", [m.expires for m in messages])),
            priorities=bytes([m.priority for m in messages]),
            flags=bytes([PERSISTENT if m.persistent else 0 for m in messages]),
            header_offsets=offsets_of(headers),
            headers=b"".join(headers),
        )
        return cls(destination, len(messages), body)

    def messages(self) -> list[OutgoingMessage]:
        """The pack's messages, one by one (to send them singly after a refusal)."""
        pack = read_pack(self.body)
        return [
            OutgoingMessage(
                self.destination,
                pack.body(index),
                dict(pack.own_headers(index)),
                persistent=bool(pack.flags[index] & PERSISTENT),
                priority=pack.priorities[index],
                expires=pack.expires[index],
            )
            for index in range(pack.count)
        ]


def packed(messages: Iterable[OutgoingMessage]) -> Iterator[OutgoingMessage | OutgoingPack]:
    """`messages` in their order, each run for one destination in packs (a run of one, or a
    message as large as a pack, as itself)."""
    run: list[OutgoingMessage] = []
    size = 0
    for message in messages:
        length = len(message.body)
        if run and (
            message.destination != run[0].destination
            or len(run) >= MAX_PACK
            or size + length > PACK_BYTES
        ):
            yield _closed(run)
            run, size = [], 0
        if length >= PACK_BYTES:
            yield message
            continue
        run.append(message)
        size += length
    if run:
        yield _closed(run)


def _closed(run: list[OutgoingMessage]) -> OutgoingMessage | OutgoingPack:
    return run[0] if len(run) == 1 else OutgoingPack.of(run)


def unpacked(items: Iterable[OutgoingMessage | OutgoingPack]) -> Iterator[OutgoingMessage]:
    """`items` message by message, packs opened."""
    for item in items:
        if isinstance(item, OutgoingPack):
            yield from item.messages()
        else:
            yield item
