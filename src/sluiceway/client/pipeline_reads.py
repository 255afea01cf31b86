"""A read of the pipeline connection (`PipelineConnection.read_range`, `read_lease`): its
messages one by one, or as packs of columns, then its end marker; gone on with after a failover
as its `Resume` says."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final, Protocol

from sluiceway.client.pipeline_failover import Link, Resume, resumed_read
from sluiceway.client.pipeline_packs import MessagePack
from sluiceway.client.pipeline_values import EndMarker, PipelineMessage

# Messages that came one per frame, packed by `Read.packs()` this many at a time.
_PLAIN_PACK: Final = 1000


class Reader(Link, Protocol):
    """What a read needs of its connection: failover's part, and the read itself."""

    def _read(
        self, headers: dict[str, str]
    ) -> Iterator[PipelineMessage | MessagePack | EndMarker]: ...


class Read:
    """The messages of one read, in order, as they arrive; `end` once they are all read.

    Iterate once. Leaving the iteration early closes the connection (the rest of the read is
    still on its way); the next operation opens a new one. With failover on, an interrupted
    read goes on as `resume` says (by default: read again, taking everything).
    """

    def __init__(
        self,
        connection: Reader,
        headers: dict[str, str],
        resume: Resume | None = None,
    ) -> None:
        self._connection = connection
        self._headers = headers
        self._resume = resume or Resume(headers, f"read of {headers.get('destination')}")
        self.end: EndMarker | None = None

    def __iter__(self) -> Iterator[PipelineMessage]:
        for item in self._items():
            if isinstance(item, MessagePack):
                yield from item.messages()
            else:
                yield item

    def packs(self) -> Iterator[MessagePack]:
        """The messages as packs of columns (protocol.pack): as the broker packed them for a
        read with `pack`, else packed here (an older broker, or a read without it)."""
        plain: list[PipelineMessage] = []
        for item in self._items():
            if isinstance(item, MessagePack):
                if plain:
                    yield MessagePack.of(plain)
                    plain = []
                yield item
            else:
                plain.append(item)
                if len(plain) >= _PLAIN_PACK:
                    yield MessagePack.of(plain)
                    plain = []
        if plain:
            yield MessagePack.of(plain)

    def _items(self) -> Iterator[PipelineMessage | MessagePack]:
        connection = self._connection
        if connection.settings.failover > 0:
            items = resumed_read(connection, connection._read, self._resume)
        else:
            items = connection._read(self._headers)
        finished = False
        try:
            for item in items:
                if isinstance(item, EndMarker):
                    self.end = item
                else:
                    yield item
            finished = True
        finally:
            if not finished:
                self._connection.close()

    def drain(self) -> EndMarker:
        """Read to the end, keeping nothing; the end marker."""
        for _ in self:
            pass
        assert self.end is not None
        return self.end
