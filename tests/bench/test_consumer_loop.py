"""A bench consumer over a real socket to a scripted server standing for the broker: it reads what
arrives at once into its local queue, works one message at a time, and counts what it holds;
frames that arrived before its loop began are taken, and reading goes on after them."""

from __future__ import annotations

import asyncio
import multiprocessing
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import pytest

from sluiceway.bench.stream import StompStream
from sluiceway.bench.workers import (
    ConsumerLoop,
    ConsumerResult,
    ConsumerSpec,
    Shared,
    Tally,
    Target,
)
from sluiceway.protocol.codec import FrameDecoder, encode_frame
from sluiceway.protocol.frames import Frame, StompVersion

pytestmark = pytest.mark.timeout(30)
V12 = StompVersion.V1_2
WAIT = 10.0  # seconds: generous, only ever waited out when something is wrong


def message(seq: int) -> bytes:
    body = b"0 %d %d padding" % (seq, time.monotonic_ns())
    headers = {"destination": "/queue/q", "message-id": str(seq), "ack": f"a{seq}"}
    return encode_frame(Frame("MESSAGE", headers, body), V12)


@dataclass
class Broker:
    """The server's side of the one connection: what it read, and a way to write."""

    writer: asyncio.StreamWriter | None = None
    acks: list[str] = field(default_factory=list)
    connected: asyncio.Event = field(default_factory=asyncio.Event)
    closed: asyncio.Event = field(default_factory=asyncio.Event)


@asynccontextmanager
async def scripted() -> AsyncIterator[tuple[Broker, StompStream]]:
    broker = Broker()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        broker.writer = writer
        broker.connected.set()
        decoder = FrameDecoder()
        decoder.version = V12
        try:
            while data := await reader.read(65536):
                decoder.receive_data(data)
                while (event := decoder.next_event()) is not None:
                    if isinstance(event, Frame) and event.command == "ACK":
                        broker.acks.append(event.headers["id"])
        except ConnectionError:
            pass  # the client aborted: the test is over
        finally:
            writer.close()
            broker.closed.set()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    stream = await StompStream.connect(server.sockets[0].getsockname()[1])
    stream.decoder.version = V12
    try:
        await asyncio.wait_for(broker.connected.wait(), WAIT)
        yield broker, stream
    finally:
        stream.transport.abort()
        await asyncio.wait_for(broker.closed.wait(), WAIT)
        server.close()
        await server.wait_closed()


async def until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, "the condition did not come true in time"
        await asyncio.sleep(0.005)


def consumer(stream: StompStream, delay_ms: float) -> tuple[ConsumerLoop, Shared]:
    context = multiprocessing.get_context("spawn")
    shared = Shared(
        sent=[0], received=[0], ready=[1], go=context.Event(), stop=context.Event(),
        results=context.Queue(),
    )  # fmt: skip
    shared.go.set()
    spec = ConsumerSpec(
        Target("127.0.0.1", 1), 0, "/queue/q", (10,), "client-individual", 10, delay_ms, 0,
        spells=True,
    )  # fmt: skip
    loop = ConsumerLoop(spec, shared, stream, Tally(spec, ConsumerResult(0)))
    return loop, shared


def test_frames_read_before_the_loop_began_are_taken_and_reading_goes_on() -> None:
    async def run() -> None:
        async with scripted() as (broker, stream):
            assert broker.writer is not None
            broker.writer.write(message(0))
            # Nothing takes it yet: the stream stops reading, as it must.
            await until(lambda: not stream.reading)
            loop, shared = consumer(stream, delay_ms=0)
            task = asyncio.create_task(loop.run())
            await until(lambda: loop.tally.result.received == 1)
            broker.writer.write(message(1))
            await until(lambda: loop.tally.result.received == 2)  # read on after the first
            await until(lambda: broker.acks == ["a0", "a1"])
            loop._finish(None)
            await asyncio.wait_for(task, WAIT)
            loop.stop()
            shared.results.close()

    asyncio.run(run())


def test_a_delayed_consumer_reads_ahead_and_holds_until_each_ack_is_written() -> None:
    async def run() -> None:
        async with scripted() as (broker, stream):
            assert broker.writer is not None
            # Each message's work takes far longer than the test: the work is ended by hand.
            loop, shared = consumer(stream, delay_ms=600_000)
            task = asyncio.create_task(loop.run())
            broker.writer.write(b"".join(message(seq) for seq in range(5)))
            await until(lambda: loop.arrived == 5)
            # All read at once; one started (and counted as received), four wait their turn.
            assert (loop.occupancy.held, loop.occupancy.peak) == (5, 5)
            assert (loop.tally.result.received, len(loop.inbox), loop.working) == (1, 4, True)
            assert loop.occupancy.waiting_since  # messages wait to be started
            assert broker.acks == []
            loop.worked()  # the first one's work is done
            await until(lambda: broker.acks == ["a0"])
            assert (loop.occupancy.held, loop.tally.result.received, len(loop.inbox)) == (4, 2, 3)
            for _ in range(4):
                loop.worked()
            await until(lambda: len(broker.acks) == 5)
            assert broker.acks == [f"a{seq}" for seq in range(5)]
            assert (loop.occupancy.held, loop.occupancy.peak, loop.working) == (0, 5, False)
            assert loop.occupancy.idle_since  # nothing left to do: idle again
            assert loop.occupancy.waiting_spells is not None
            assert len(loop.occupancy.waiting_spells) == 1  # one spell with messages waiting
            loop._finish(None)
            await asyncio.wait_for(task, WAIT)
            loop.stop()
            shared.results.close()

    asyncio.run(run())
