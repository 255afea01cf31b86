"""Load for benchmarks and large tests: a pipelined producer, a draining consumer, an RSS sampler.

The producer sends every message with a receipt and keeps at most `window` receipts outstanding,
so it goes as fast as the broker answers, hears every refusal (it connects with
`failed-receipts:true`), and is slowed exactly as far as the broker withholds receipts. Messages
carry their index first in the body (`b"%d " % index`), so the consumer checks order and gaps.
"""

from __future__ import annotations

import asyncio
import collections
import time
from dataclasses import dataclass, field

from sluiceway.bench.stream import RssSampler, StompStream, rss
from sluiceway.protocol.frames import Frame

__all__ = ["Drained", "Produced", "RssSampler", "StompStream", "drain", "produce", "rss"]


@dataclass
class Produced:
    """What a pipelined producer heard back."""

    accepted: int = 0
    refused: collections.Counter[str] = field(default_factory=collections.Counter)
    first_refusal: str = ""
    seconds: float = 0.0
    last_progress: float = 0.0  # monotonic time of the latest receipt

    @property
    def answered(self) -> int:
        return self.accepted + sum(self.refused.values())


async def produce(
    port: int,
    destination: str,
    count: int,
    *,
    body_size: int = 1024,
    window: int = 500,
    persistent: bool = False,
    progress: Produced | None = None,
) -> Produced:
    """Send `count` messages, each with a receipt, at most `window` unanswered at a time."""
    result = progress if progress is not None else Produced()
    stream = await StompStream.open(port, **{"failed-receipts": "true"})
    credit = asyncio.Semaphore(window)
    padding = b"x" * body_size
    started = time.monotonic()

    async def read_receipts() -> None:
        while result.answered < count:
            frame = await stream.next_frame()
            if frame.command != "RECEIPT":
                raise RuntimeError(f"unexpected {frame.command}: {frame.headers} {frame.body!r}")
            status = frame.headers.get("status")
            if status is None:
                result.accepted += 1
            else:
                result.refused[status] += 1
                if not result.first_refusal:
                    result.first_refusal = frame.headers.get("detail", "")
            result.last_progress = time.monotonic()
            credit.release()

    reader = asyncio.create_task(read_receipts())
    headers = {"destination": destination, "persistent": "true" if persistent else "false"}
    for index in range(count):
        await credit.acquire()
        prefix = b"%d " % index
        body = prefix + padding[len(prefix) :]
        stream.send(Frame("SEND", {**headers, "receipt": str(index)}, body))
        await stream.drain()  # while the transport holds more than WRITE_BUFFER_HIGH bytes
    await reader
    result.seconds = time.monotonic() - started
    await stream.close()
    return result


@dataclass
class Drained:
    received: int = 0
    out_of_order: int = 0
    seconds: float = 0.0


async def drain(
    port: int, destination: str, expected: int, *, idle_timeout: float = 30.0
) -> Drained:
    """Receive `expected` messages (ack:auto), checking that their indexes increase."""
    result = Drained()
    stream = await StompStream.open(port)
    stream.send(Frame("SUBSCRIBE", {"destination": destination, "id": "drain", "ack": "auto"}))
    started = time.monotonic()
    last = -1
    while result.received < expected:
        frame = await asyncio.wait_for(stream.next_frame(), idle_timeout)
        if frame.command != "MESSAGE":
            raise RuntimeError(f"unexpected {frame.command}: {frame.headers} {frame.body!r}")
        index = int(frame.body.split(b" ", 1)[0])
        if index <= last:
            result.out_of_order += 1
        last = index
        result.received += 1
    result.seconds = time.monotonic() - started
    await stream.close()
    return result
