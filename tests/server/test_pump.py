"""The I/O layer's pump, one event-loop turn at a time, over an in-memory transport.

Flow metering (imqConnectionFlowCount): each turn writes at most N MESSAGE frames and then yields,
so a frame that arrives meanwhile is read and its RECEIPT written before the next N.
"""

from __future__ import annotations

import asyncio
from typing import Any

from sluiceway.config import BrokerConfig
from sluiceway.core.broker import Broker
from sluiceway.core.flow import ConnectionFlow
from sluiceway.core.message import Message
from sluiceway.core.store import MemoryStore
from sluiceway.naming import parse_destination
from sluiceway.protocol.codec import FrameDecoder, encode_frame
from sluiceway.protocol.frames import Frame, StompVersion
from sluiceway.server.connection import MAX_WAITING_CONTROL, UNMETERED_TURN, StompProtocol
from sluiceway.server.stomp_server import StompServer


class MemoryTransport(asyncio.Transport):
    """Collects written bytes; the test says when the write buffer is full."""

    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.closing = False
        self.reading = True

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += data

    def get_write_buffer_size(self) -> int:
        return 0

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def abort(self) -> None:
        self.closing = True

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 5555) if name == "peername" else default


class Harness:
    def __init__(self, flow_count: int) -> None:
        self.broker = Broker(BrokerConfig())
        self.protocol = StompProtocol(StompServer(self.broker))
        self.transport = MemoryTransport()
        self.protocol.connection_made(self.transport)
        self.decoder = FrameDecoder(version=StompVersion.V1_2)
        self.feed(
            Frame(
                "CONNECT",
                {"accept-version": "1.2", "connection-flow-count": str(flow_count)},
            )
        )
        assert [f.command for f in self.output()] == ["CONNECTED"]

    def feed(self, frame: Frame) -> None:
        self.protocol.data_received(encode_frame(frame, StompVersion.V1_2))

    def output(self) -> list[Frame]:
        self.decoder.receive_data(bytes(self.transport.written))
        self.transport.written.clear()
        frames = []
        while (event := self.decoder.next_event()) is not None:
            assert isinstance(event, Frame)
            frames.append(event)
        return frames

    def backlog(self, count: int) -> None:
        producer = self.broker.open_connection(flow=ConnectionFlow(), on_ready=lambda: None)
        for i in range(count):
            producer.send(
                parse_destination("/queue/q"),
                b"%d" % i,
                (),
                priority=4,
                expires=0,
                persistent=False,
            )


async def test_each_turn_writes_at_most_flow_count_messages() -> None:
    harness = Harness(flow_count=10)
    harness.backlog(100)
    harness.feed(Frame("SUBSCRIBE", {"destination": "/queue/q", "id": "s", "ack": "auto"}))
    assert harness.output() == []  # messages are written by the pump, not while reading
    for turn in range(5):
        await asyncio.sleep(0)  # one event-loop iteration: one pump turn
        messages = harness.output()
        assert [m.body for m in messages] == [b"%d" % i for i in range(turn * 10, turn * 10 + 10)]
        # A frame arriving now is answered at once, before the next batch of messages.
        harness.feed(Frame("BEGIN", {"transaction": f"t{turn}", "receipt": f"r{turn}"}))
        (receipt,) = harness.output()
        assert receipt.command == "RECEIPT"
        assert receipt.headers["receipt-id"] == f"r{turn}"


async def test_unmetered_connection_still_yields_every_turn() -> None:
    harness = Harness(flow_count=0)
    harness.backlog(UNMETERED_TURN + 50)
    harness.feed(Frame("SUBSCRIBE", {"destination": "/queue/q", "id": "s", "ack": "auto"}))
    await asyncio.sleep(0)  # one event-loop iteration: one pump turn
    assert len(harness.output()) == UNMETERED_TURN
    await asyncio.sleep(0)  # and the next
    assert len(harness.output()) == 50


async def test_no_messages_are_written_above_the_high_water_mark() -> None:
    harness = Harness(flow_count=10)
    harness.backlog(30)
    harness.feed(Frame("SUBSCRIBE", {"destination": "/queue/q", "id": "s", "ack": "auto"}))
    harness.protocol.pause_writing()  # what the transport does above its high-water mark
    for _ in range(3):
        await asyncio.sleep(0)  # three pump turns, each of which would write if not paused
    assert harness.output() == []
    harness.feed(Frame("BEGIN", {"transaction": "t", "receipt": "r"}))
    assert [f.command for f in harness.output()] == ["RECEIPT"]  # control frames still go
    harness.protocol.resume_writing()
    for _ in range(3):
        await asyncio.sleep(0)  # three pump turns of at most 10 messages each
    assert len(harness.output()) == 30


class StalledStore(MemoryStore):
    """Every persistent message is a record; records become durable only when the test says."""

    def __init__(self) -> None:
        super().__init__()
        self.last = 0
        self.synced = 0

    def added(self, message: Message) -> None:
        super().added(message)
        self.last += 1

    @property
    def last_lsn(self) -> int:
        return self.last

    @property
    def synced_lsn(self) -> int:
        return self.synced


async def test_reading_stops_while_too_many_receipts_wait_for_the_journal() -> None:
    store = StalledStore()
    broker = Broker(BrokerConfig(), store=store)
    server = StompServer(broker)
    protocol = StompProtocol(server)
    transport = MemoryTransport()
    protocol.connection_made(transport)
    protocol.data_received(encode_frame(Frame("CONNECT", {"accept-version": "1.2"})))
    transport.written.clear()
    sends = b"".join(
        encode_frame(
            Frame("SEND", {"destination": "/queue/q", "persistent": "true", "receipt": str(i)}),
            StompVersion.V1_2,
        )
        for i in range(MAX_WAITING_CONTROL + 10)
    )
    protocol.data_received(sends)
    # Every RECEIPT waits for the sync, and there are too many of them: reading stops.
    assert not transport.written
    assert not transport.reading
    assert protocol.info().reading_paused
    store.synced = store.last
    server.synced()
    assert transport.written.count(b"RECEIPT") == MAX_WAITING_CONTROL + 10
    assert transport.reading
