"""The I/O layer's pump, one event-loop turn at a time, over an in-memory transport.

Flow metering (imqConnectionFlowCount): each turn writes at most N MESSAGE frames and then yields,
so a frame that arrives meanwhile is read and its RECEIPT written before the next N.
"""

from __future__ import annotations

import asyncio
from typing import Any

from sluiceway.config import BrokerConfig
from sluiceway.core.broker import Broker
from sluiceway.core.model.store import MemoryStore
from sluiceway.core.values.flow import ConnectionFlow
from sluiceway.core.values.message import Message
from sluiceway.naming import parse_destination
from sluiceway.protocol.codec import FrameDecoder, encode_frame
from sluiceway.protocol.frames import Frame, StompVersion
from sluiceway.server.connection import UNMETERED_TURN, WRITE_CAP_FACTOR, StompProtocol
from sluiceway.server.stomp_server import StompServer
from sluiceway.session.control import MAX_WAITING_CONTROL
from tests.e2e.support import loop_turns, turns_until


class MemoryTransport(asyncio.Transport):
    """Collects written bytes; the test says when the write buffer is full."""

    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.buffered = 0  # what the test says waits to be sent
        self.closing = False
        self.reading = True

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += data

    def get_write_buffer_size(self) -> int:
        return self.buffered

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

    def is_reading(self) -> bool:
        return self.reading

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
        await turns_until(lambda: bool(harness.transport.written), limit=1)  # one pump turn
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
    await turns_until(lambda: bool(harness.transport.written), limit=1)  # one pump turn
    assert len(harness.output()) == UNMETERED_TURN
    await turns_until(lambda: bool(harness.transport.written), limit=1)  # and the next
    assert len(harness.output()) == 50


async def test_no_messages_are_written_above_the_high_water_mark() -> None:
    harness = Harness(flow_count=10)
    harness.backlog(30)
    harness.feed(Frame("SUBSCRIBE", {"destination": "/queue/q", "id": "s", "ack": "auto"}))
    harness.protocol.pause_writing()  # what the transport does above its high-water mark
    await loop_turns(3)  # three pump turns, each of which would write if not paused
    assert harness.output() == []
    harness.feed(Frame("BEGIN", {"transaction": "t", "receipt": "r"}))
    assert [f.command for f in harness.output()] == ["RECEIPT"]  # control frames still go
    harness.protocol.resume_writing()
    # three pump turns of at most 10 messages each
    await turns_until(lambda: harness.transport.written.count(b"MESSAGE\n") == 30, limit=3)
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


def sends(count: int, persistent: bool) -> bytes:
    headers = {"destination": "/queue/q", "persistent": str(persistent).lower()}
    return b"".join(
        encode_frame(Frame("SEND", {**headers, "receipt": str(i)}), StompVersion.V1_2)
        for i in range(count)
    )


def receipt_ids(transport: MemoryTransport) -> list[int]:
    decoder = FrameDecoder(version=StompVersion.V1_2)
    decoder.receive_data(bytes(transport.written))
    ids = []
    while (event := decoder.next_event()) is not None:
        assert isinstance(event, Frame)
        assert event.command == "RECEIPT"
        ids.append(int(event.headers["receipt-id"]))
    return ids


def connected(broker: Broker) -> tuple[StompServer, StompProtocol, MemoryTransport]:
    server = StompServer(broker)
    protocol = StompProtocol(server)
    transport = MemoryTransport()
    protocol.connection_made(transport)
    protocol.data_received(encode_frame(Frame("CONNECT", {"accept-version": "1.2"})))
    transport.written.clear()
    return server, protocol, transport


async def test_frames_wait_unhandled_while_too_many_receipts_wait_for_the_journal() -> None:
    store = StalledStore()
    server, protocol, transport = connected(Broker(BrokerConfig(), store=store))
    session = protocol.session
    assert session is not None
    protocol.data_received(sends(MAX_WAITING_CONTROL + 10, persistent=True))
    # Every RECEIPT waits for the sync: the session stops once MAX_WAITING_CONTROL wait, the
    # last ten SENDs stay unhandled, and the connection is not read.
    assert not transport.written
    assert session.control_waiting == MAX_WAITING_CONTROL
    assert store.last == MAX_WAITING_CONTROL
    assert not transport.reading
    assert protocol.info().reading_paused
    store.synced = store.last
    server.synced()
    assert receipt_ids(transport) == list(range(MAX_WAITING_CONTROL))
    # One loop turn: the ten left are handled, and reading goes on.
    await turns_until(lambda: store.last == MAX_WAITING_CONTROL + 10, limit=1)
    assert store.last == MAX_WAITING_CONTROL + 10
    assert session.control_waiting == 10
    assert transport.is_reading()
    store.synced = store.last
    server.synced()
    assert receipt_ids(transport) == list(range(MAX_WAITING_CONTROL + 10))


async def test_receipts_due_at_once_are_written_a_bounded_batch_at_a_time() -> None:
    _, protocol, transport = connected(Broker(BrokerConfig()))
    session = protocol.session
    assert session is not None
    count = 2 * MAX_WAITING_CONTROL + 5
    protocol.data_received(sends(count, persistent=False))
    assert receipt_ids(transport) == list(range(MAX_WAITING_CONTROL))

    def all_written() -> bool:
        assert session.control_waiting <= MAX_WAITING_CONTROL  # at every turn
        return len(receipt_ids(transport)) == count

    await turns_until(all_written, limit=2)
    assert receipt_ids(transport) == list(range(count))
    assert transport.reading
    assert session.control_waiting == 0


async def test_receipts_wait_in_the_session_while_the_client_does_not_read() -> None:
    config = BrokerConfig()
    _, protocol, transport = connected(Broker(config))
    transport.buffered = WRITE_CAP_FACTOR * config.write_high_water + 1
    protocol.data_received(sends(3, persistent=False))
    # Nothing more goes to a transport this full; the receipts wait, and so does reading.
    assert not transport.written
    assert not transport.reading
    transport.buffered = 0
    protocol.resume_writing()
    await turns_until(lambda: bool(transport.written), limit=1)  # the pump writes what waited
    assert receipt_ids(transport) == [0, 1, 2]
    assert transport.reading
