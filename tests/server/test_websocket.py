"""STOMP over WebSocket: the framing and the transport adapter alone, then a real broker driven
by aiohttp's WebSocket client next to plain TCP clients."""

from __future__ import annotations

import asyncio
import itertools
import socket
from collections.abc import AsyncIterator, Callable
from typing import Any, cast

import aiohttp
import pytest
from aiohappyeyeballs import AddrInfoType
from hypothesis import given
from hypothesis import strategies as st

from sluiceway.protocol.codec import encode_frame
from sluiceway.protocol.frames import Frame, StompVersion
from sluiceway.server.connection import WRITE_CAP_FACTOR, WRITE_CHUNK
from sluiceway.server.snapshots import ConnectionInfo
from sluiceway.server.websocket import (
    READ_CHUNK,
    SOCKET_CHECK_BYTES,
    FrameSplitter,
    WebSocketTransport,
    message_type,
)
from sluiceway.testing import BrokerThread
from tests.conftest import BrokerFactory
from tests.e2e.rawclient import RawClient
from tests.e2e.support import turns_until
from tests.protocol.test_codec_properties import frames
from tests.server.conftest import TlsFiles
from tests.server.wsclient import WsStomp

TEXT, BINARY = aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY
WAIT = 5.0


# -- framing ------------------------------------------------------------------------------------


def encoded(command: str, headers: dict[str, str] | None = None, body: bytes = b"") -> bytes:
    return encode_frame(Frame(command, dict(headers or {}), body), StompVersion.V1_2)


RECEIPT = encoded("RECEIPT", {"receipt-id": "r1"})
MESSAGE = encoded("MESSAGE", {"destination": "/queue/a", "subscription": "1"}, b"hi\0there\n\n")
BINARY_MESSAGE = encoded("MESSAGE", {"destination": "/queue/a"}, b"\xff\xfe\0")


@pytest.mark.parametrize(
    ("writes", "pieces"),
    [
        pytest.param([RECEIPT], [RECEIPT], id="one frame"),
        pytest.param([RECEIPT + MESSAGE + RECEIPT], [RECEIPT, MESSAGE, RECEIPT], id="three"),
        pytest.param([b"\n"], [b"\n"], id="heart-beat"),
        pytest.param([b"\n" + MESSAGE + b"\n\n"], [b"\n", MESSAGE, b"\n\n"], id="eols between"),
        pytest.param([MESSAGE[:10], MESSAGE[10:] + RECEIPT], [MESSAGE, RECEIPT], id="cut head"),
        pytest.param([MESSAGE[:-3], MESSAGE[-3:]], [MESSAGE], id="cut body with NUL in it"),
        pytest.param([MESSAGE[:-1], MESSAGE[-1:]], [MESSAGE], id="cut before the NUL"),
        pytest.param(
            [b"ERROR\nmessage:x\n\nno length\0"], [b"ERROR\nmessage:x\n\nno length\0"], id="no cl"
        ),
    ],
)
def test_splitter_cuts_whole_frames(writes: list[bytes], pieces: list[bytes]) -> None:
    splitter = FrameSplitter()
    got = [piece for data in writes for piece in splitter.split(data)]
    assert got == pieces


def test_one_frame_is_sent_without_a_copy() -> None:
    (piece,) = FrameSplitter().split(MESSAGE)
    assert piece is MESSAGE


@given(
    st.lists(frames(StompVersion.V1_2) | st.just(None), max_size=8),
    st.lists(st.integers(min_value=0, max_value=400), max_size=5),
)
def test_splitter_round_trip(items: list[Frame | None], cuts: list[int]) -> None:
    """Frames and heart-beats (None), written in arbitrary pieces, come out frame by frame."""
    written = [b"\n" if item is None else encode_frame(item, StompVersion.V1_2) for item in items]
    stream = b"".join(written)
    bounds = sorted({0, len(stream), *(c for c in cuts if c < len(stream))})
    splitter = FrameSplitter()
    got = [
        piece
        for start, end in itertools.pairwise(bounds)
        for piece in splitter.split(stream[start:end])
    ]
    assert b"".join(got) == stream
    assert [piece for piece in got if piece != b"\n" * len(piece)] == [
        data for data in written if data != b"\n"
    ]


@pytest.mark.parametrize(
    ("frame", "kind"),
    [
        (RECEIPT, TEXT),
        (MESSAGE, TEXT),
        ("MESSAGE\n\nété\0".encode(), TEXT),
        (BINARY_MESSAGE, BINARY),
    ],
)
def test_text_when_utf8_binary_otherwise(frame: bytes, kind: aiohttp.WSMsgType) -> None:
    assert message_type(frame) is kind


# -- the transport adapter, with a fake WebSocket -------------------------------------------------


class FakeWebSocket:
    """What WebSocketTransport uses of aiohttp's WebSocketResponse; sends wait on `gate`."""

    def __init__(self) -> None:
        self.sent: list[tuple[bytes, aiohttp.WSMsgType]] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.incoming: asyncio.Queue[aiohttp.WSMessage] = asyncio.Queue(maxsize=8)
        self.closed = False

    async def send_frame(self, data: bytes, opcode: aiohttp.WSMsgType) -> None:
        await self.gate.wait()
        self.sent.append((data, opcode))

    async def receive(self) -> aiohttp.WSMessage:
        return await self.incoming.get()

    async def close(self) -> bool:
        self.closed = True
        await self.incoming.put(aiohttp.WSMessage(aiohttp.WSMsgType.CLOSED, None, None))
        return True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 4242) if name == "peername" else default


class RecordingProtocol(asyncio.Protocol):
    session = None
    closing = False  # its session's last frames are being written (StompProtocol.closing)

    def __init__(self) -> None:
        self.events: list[str] = []
        self.received: list[bytes] = []
        self.held: list[int] = []  # what the transport said it holds, each time
        self.lost = asyncio.Event()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.events.append("made")

    def data_received(self, data: bytes) -> None:
        self.received.append(data)

    def input_held_below(self, held: int) -> None:
        self.held.append(held)

    def pause_writing(self) -> None:
        self.events.append("pause")

    def resume_writing(self) -> None:
        self.events.append("resume")

    def connection_lost(self, exc: Exception | None) -> None:
        self.events.append("lost")
        self.lost.set()


@pytest.fixture
async def fake_connection() -> AsyncIterator[
    tuple[FakeWebSocket, RecordingProtocol, WebSocketTransport]
]:
    """A transport serving a fake WebSocket; its connection ends with the test."""
    ws, protocol = FakeWebSocket(), RecordingProtocol()
    transport = WebSocketTransport(cast(Any, ws), cast(Any, protocol), None)
    serving = asyncio.get_running_loop().create_task(transport.serve())
    await turns_until(lambda: protocol.events == ["made"])
    yield ws, protocol, transport
    if not serving.done():
        transport.abort()
        await ws.incoming.put(aiohttp.WSMessage(aiohttp.WSMsgType.CLOSED, None, None))
    await asyncio.wait_for(serving, WAIT)


Connection = tuple[FakeWebSocket, RecordingProtocol, WebSocketTransport]


async def test_pause_and_resume_follow_the_outgoing_buffer(fake_connection: Connection) -> None:
    ws, protocol, transport = fake_connection
    frame = encoded("MESSAGE", {"destination": "/queue/a"}, b"x" * 40)
    transport.set_write_buffer_limits(high=2 * len(frame), low=len(frame))
    ws.gate.clear()  # the client is not reading: nothing can be sent
    transport.write(frame + frame)
    assert transport.get_write_buffer_size() == 2 * len(frame)
    assert protocol.events == ["made"]  # at the high-water mark, not above it
    transport.write(b"\n")
    assert protocol.events == ["made", "pause"]  # told at once, from inside write()
    ws.gate.set()
    await turns_until(lambda: len(ws.sent) == 3)
    assert ws.sent == [(frame, TEXT), (frame, TEXT), (b"\n", TEXT)]
    assert protocol.events == ["made", "pause", "resume"]
    assert transport.get_write_buffer_size() == 0


async def test_a_write_past_the_cap_drops_the_connection(fake_connection: Connection) -> None:
    ws, _, transport = fake_connection
    frame = encoded("MESSAGE", {"destination": "/queue/a"}, b"x" * 40)
    transport.set_write_buffer_limits(high=len(frame), low=len(frame) // 2)
    ws.gate.clear()  # the client is not reading
    for _ in range(WRITE_CAP_FACTOR + 1):
        transport.write(frame)  # what a protocol ignoring pause_writing would do
    assert transport.get_write_buffer_size() == (WRITE_CAP_FACTOR + 1) * len(frame)
    transport.write(frame)  # past the cap: the buffer does not take it
    assert transport.is_closing()
    assert transport.get_write_buffer_size() == 0
    assert all(piece != frame for piece, _ in ws.sent)  # dropped, nothing sent


async def test_a_closing_session_may_write_its_last_frames_past_the_cap(
    fake_connection: Connection,
) -> None:
    ws, protocol, transport = fake_connection
    frame = encoded("MESSAGE", {"destination": "/queue/a"}, b"x" * 40)
    transport.set_write_buffer_limits(high=len(frame), low=len(frame) // 2)
    ws.gate.clear()
    for _ in range(WRITE_CAP_FACTOR + 1):
        transport.write(frame)
    protocol.closing = True
    transport.write(RECEIPT)
    transport.close()
    assert transport.get_write_buffer_size() == (WRITE_CAP_FACTOR + 1) * len(frame) + len(RECEIPT)
    ws.gate.set()
    await asyncio.wait_for(protocol.lost.wait(), WAIT)
    assert ws.sent[-1] == (RECEIPT, TEXT)


async def test_reading_waits_while_paused_and_big_messages_come_in_chunks(
    fake_connection: Connection,
) -> None:
    ws, protocol, transport = fake_connection
    transport.pause_reading()
    await ws.incoming.put(aiohttp.WSMessage(TEXT, b"\n", None))
    # The transport takes the message from the WebSocket (it was already waiting for one) and,
    # in that same step, would hand it to the protocol if reading were not paused.
    await turns_until(ws.incoming.empty)
    assert protocol.received == []
    transport.resume_reading()
    await turns_until(lambda: protocol.received == [b"\n"])
    big = b"y" * (2 * READ_CHUNK + 5)
    await ws.incoming.put(aiohttp.WSMessage(BINARY, big, None))
    await turns_until(lambda: len(protocol.received) == 4)
    assert [len(data) for data in protocol.received[1:]] == [READ_CHUNK, READ_CHUNK, 5]
    assert b"".join(protocol.received[1:]) == big


async def test_close_sends_what_is_buffered_then_closes(fake_connection: Connection) -> None:
    ws, protocol, transport = fake_connection
    transport.write(RECEIPT)
    transport.close()
    transport.write(MESSAGE)  # after close: dropped, as by a socket transport
    assert transport.is_closing()
    await asyncio.wait_for(protocol.lost.wait(), WAIT)
    assert ws.sent == [(RECEIPT, TEXT)]
    assert ws.closed
    assert protocol.events == ["made", "lost"]


# -- a real broker ------------------------------------------------------------------------------


def ws_url(broker: BrokerThread, scheme: str = "http", path: str = "/stomp") -> str:
    assert broker.services is not None
    host, port = broker.services.addresses()["ws"]
    return f"{scheme}://{host}:{port}{path}"


def infos(broker: BrokerThread) -> list[ConnectionInfo]:
    services = broker.services
    assert services is not None
    return broker.call(services.connections)


def ws_infos(broker: BrokerThread) -> list[ConnectionInfo]:
    return [info for info in infos(broker) if info.service == "ws"]


async def wait_for(condition: Callable[[], bool], timeout: float = WAIT) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.01)


@pytest.fixture
def ws_broker(make_broker: BrokerFactory) -> BrokerThread:
    return make_broker({"imq.stomp.ws.port": "0"})


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as client_session:
        yield client_session


def raw_client(broker: BrokerThread) -> RawClient:
    client = RawClient(broker.port)
    client.connect()
    return client


@pytest.mark.parametrize(
    ("offered", "chosen"),
    [
        (("v12.stomp",), "v12.stomp"),
        (("v10.stomp", "v11.stomp", "v12.stomp"), "v10.stomp"),  # the client's preference
        ((), None),
    ],
)
async def test_subprotocols(
    ws_broker: BrokerThread,
    session: aiohttp.ClientSession,
    offered: tuple[str, ...],
    chosen: str | None,
) -> None:
    client = await WsStomp.open(session, ws_url(ws_broker), protocols=offered, connect=False)
    assert client.ws.protocol == chosen
    connected = await client.connect()
    assert connected.headers["version"] == "1.2"  # CONNECT's accept-version decides
    await client.close()


@pytest.mark.parametrize("path", ["/stomp", "/"])
async def test_queue_and_topic_both_ways_with_a_tcp_client(
    ws_broker: BrokerThread, session: aiohttp.ClientSession, path: str
) -> None:
    web = await WsStomp.open(session, ws_url(ws_broker, path=path))
    tcp = raw_client(ws_broker)
    try:
        await web.subscribe("/queue/to-web", "q", ack="auto")
        await web.subscribe("/topic/news", "t", ack="auto")
        tcp.subscribe("/queue/to-tcp", "q", ack="auto")
        tcp.subscribe("/topic/news", "t", ack="auto")
        tcp.request("SEND", {"destination": "/queue/to-web"}, b"from tcp")
        await web.request("SEND", {"destination": "/queue/to-tcp"}, b"from web")
        await web.request("SEND", {"destination": "/topic/news"}, "é from web".encode())
        tcp.request("SEND", {"destination": "/topic/news"}, b"news from tcp")
        got = sorted(m.body for m in await web.receive(3))
        assert got == sorted([b"from tcp", "é from web".encode(), b"news from tcp"])
        got = sorted(m.body for m in tcp.receive(3))
        assert got == sorted([b"from web", "é from web".encode(), b"news from tcp"])
        assert sorted(info.service for info in infos(ws_broker)) == ["stomp", "ws"]
    finally:
        tcp.close()
        await web.close()


async def test_acks_and_redelivery_after_the_websocket_goes(
    ws_broker: BrokerThread, session: aiohttp.ClientSession
) -> None:
    tcp = raw_client(ws_broker)
    try:
        for body in (b"one", b"two"):
            tcp.send("SEND", {"destination": "/queue/acks"}, body)
        tcp.sync()
        web = await WsStomp.open(session, ws_url(ws_broker))
        await web.subscribe("/queue/acks")  # client-individual
        first, second = await web.receive(2)
        await web.send("ACK", {"id": first.headers["ack"]})
        await web.sync()
        await web.ws.close()  # no DISCONNECT: the second is still unacknowledged
        await wait_for(lambda: not ws_infos(ws_broker))
        tcp.subscribe("/queue/acks")
        (again,) = tcp.receive(1)
        tcp.sync()
        assert tcp.drain() == []  # the acknowledged one is gone
        assert again.body == second.body == b"two"
        assert again.headers["redelivered"] == "true"
    finally:
        tcp.close()


async def test_binary_bodies_travel_as_binary_messages(
    ws_broker: BrokerThread, session: aiohttp.ClientSession
) -> None:
    web = await WsStomp.open(session, ws_url(ws_broker))
    await web.subscribe("/queue/bin", ack="auto")
    await web.request("SEND", {"destination": "/queue/bin"}, b"\xff\x00\x01 not UTF-8")
    await web.request("SEND", {"destination": "/queue/bin"}, "UTF-8: ünïcode".encode())
    binary, text = await web.receive(2)
    assert binary.body == b"\xff\x00\x01 not UTF-8"
    assert text.body == "UTF-8: ünïcode".encode()
    assert [kind for command, kind in web.kinds if command == "MESSAGE"] == [BINARY, TEXT]
    assert {kind for command, kind in web.kinds if command != "MESSAGE"} == {TEXT}
    await web.close()


async def test_messages_larger_than_aiohttp_defaults_both_ways(
    ws_broker: BrokerThread, session: aiohttp.ClientSession
) -> None:
    big = bytes(range(256)) * (6 * 1024 * 1024 // 256)  # 6 MiB: aiohttp's default limit is 4
    web = await WsStomp.open(session, ws_url(ws_broker))
    tcp = raw_client(ws_broker)
    try:
        await web.subscribe("/queue/big-in", ack="auto")
        tcp.subscribe("/queue/big-out", ack="auto")
        await web.request("SEND", {"destination": "/queue/big-out"}, big)
        (out,) = await asyncio.to_thread(tcp.receive, 1, 20.0)
        assert out.body == big
        await asyncio.to_thread(tcp.request, "SEND", {"destination": "/queue/big-in"}, big)
        (into,) = await web.receive(1, timeout=20.0)
        assert into.body == big
    finally:
        tcp.close()
        await web.close()


async def test_frame_size_limit(make_broker: BrokerFactory, session: aiohttp.ClientSession) -> None:
    broker = make_broker({"imq.stomp.ws.port": "0", "imq.stomp.max_frame_size": "64k"})
    # A little over the limit: the decoder answers with an ERROR naming it.
    web = await WsStomp.open(session, ws_url(broker))
    await web.send("SEND", {"destination": "/queue/x"}, b"z" * 100_000)
    error = await web.expect("ERROR")
    assert "imq.stomp.max_frame_size" in error.body.decode()
    assert await web.expect_closed() == aiohttp.WSCloseCode.OK
    # Far over it: refused as a WebSocket message, before it is buffered whole.
    web = await WsStomp.open(session, ws_url(broker))
    await web.send("SEND", {"destination": "/queue/x"}, b"z" * 1_000_000)
    assert await web.expect_closed() == aiohttp.WSCloseCode.MESSAGE_TOO_BIG


def small_receive_buffer(addr_info: AddrInfoType) -> socket.socket:
    """A client socket with a 4 KiB receive buffer, so a client that stops reading backs up
    into the broker quickly instead of into megabytes of autotuned kernel buffer."""
    family, kind, proto, _, _ = addr_info
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    return sock


HIGH_WATER = 16 * 1024
BODY = b"x" * 1000


async def test_a_websocket_client_that_stops_reading_costs_bounded_memory(
    make_broker: BrokerFactory,
) -> None:
    broker = make_broker(
        {
            "imq.stomp.ws.port": "0",
            "imq.stomp.write.high_water": str(HIGH_WATER),
            "imq.stomp.write.low_water": "4096",
            "imq.protocol.tcp.outbufsz": "16k",
        }
    )
    connector = aiohttp.TCPConnector(socket_factory=small_receive_buffer)
    async with aiohttp.ClientSession(connector=connector) as stalled_session:
        stalled = await WsStomp.open(stalled_session, ws_url(broker))
        await stalled.subscribe("/queue/stall", ack="auto")
        # From here the client reads nothing: aiohttp's reader stops the socket at 64 KiB.
        producer = raw_client(broker)
        try:
            for i in range(2000):
                producer.send("SEND", {"destination": "/queue/stall"}, b"%d " % i + BODY)
            producer.sync()
            await wait_for(lambda: any(i.writing_paused for i in ws_infos(broker)))
            # Bounded: the high-water mark and one chunk of messages past it in the outgoing
            # buffer; in aiohttp's socket transport under it, its own 64 KiB mark, the bytes it
            # sends between two looks at that mark, and one frame.
            frame = len(BODY) + 300
            bound = HIGH_WATER + WRITE_CHUNK * frame + 64 * 1024 + SOCKET_CHECK_BYTES + frame
            (info,) = ws_infos(broker)
            assert info.write_buffer <= bound
            services = broker.services
            assert services is not None
            assert broker.call(lambda: sum(s.write_buffered for s in services.listeners)) <= bound
            # More messages change nothing for the stalled connection's buffer.
            for i in range(2000, 3000):
                producer.send("SEND", {"destination": "/queue/stall"}, b"%d " % i + BODY)
            producer.sync()
            # The kernel may take a few more bytes meanwhile and writing resume for a moment
            # (the client's socket reads up to aiohttp's mark): paused again, within the bound.
            await wait_for(lambda: any(i.writing_paused for i in ws_infos(broker)))
            (info,) = ws_infos(broker)
            assert info.write_buffer <= bound
            # Reading again: everything arrives, in order, nothing lost.
            received = await stalled.receive(3000, timeout=30.0)
            assert [int(m.body.split()[0]) for m in received] == list(range(3000))
        finally:
            producer.close()
            await stalled.close()


async def test_heart_beats_both_ways_then_a_silent_client_is_dropped(
    make_broker: BrokerFactory, session: aiohttp.ClientSession
) -> None:
    broker = make_broker(
        {
            "imq.stomp.ws.port": "0",
            "imq.stomp.heartbeat.send": "50",
            "imq.stomp.heartbeat.receive": "50",
        }
    )
    web = await WsStomp.open(session, ws_url(broker), connect=False)
    connected = await web.connect(heart_beat="50,50")
    assert connected.headers["heart-beat"] == "50,50"
    # stomp.js sends its heart-beats as WebSocket messages holding "\n"; answering each of the
    # broker's keeps the connection alive well past the 100 ms it tolerates silence.
    async with asyncio.timeout(WAIT):
        while web.heartbeats < 10:
            await web.read_one()
            await web.ws.send_str("\n")
    assert not web.other  # no ERROR while heart-beats flowed
    # Silence: the broker gives up after imq.stomp.heartbeat.grace (2) intervals.
    error = await web.expect("ERROR")
    assert error.headers["message"] == "heart-beat timeout"
    await web.expect_closed()


async def test_disconnect_receipt_then_close(
    ws_broker: BrokerThread, session: aiohttp.ClientSession
) -> None:
    web = await WsStomp.open(session, ws_url(ws_broker))
    assert len(ws_infos(ws_broker)) == 1
    await web.request("DISCONNECT")
    assert await web.expect_closed() == aiohttp.WSCloseCode.OK
    await wait_for(lambda: not ws_infos(ws_broker))


async def test_not_a_websocket_request(
    ws_broker: BrokerThread, session: aiohttp.ClientSession
) -> None:
    async with session.get(ws_url(ws_broker)) as response:
        assert response.status == 426
        assert "WebSocket" in await response.text()
    async with session.get(ws_url(ws_broker, path="/elsewhere")) as response:
        assert response.status == 404


async def test_broker_shutdown_tells_websocket_clients(
    ws_broker: BrokerThread, session: aiohttp.ClientSession
) -> None:
    web = await WsStomp.open(session, ws_url(ws_broker))
    stopping = asyncio.create_task(asyncio.to_thread(ws_broker.stop))
    error = await web.expect("ERROR")
    assert error.headers["message"] == "broker shutting down"
    await web.expect_closed()
    await asyncio.wait_for(stopping, 15)


async def test_wss_with_the_test_certificate(
    make_broker: BrokerFactory, session: aiohttp.ClientSession, tls_files: TlsFiles
) -> None:
    broker = make_broker(
        tls_files.properties({"imq.stomp.ws.port": "0", "imq.stomp.ws.tls": "true"})
    )
    url = ws_url(broker, scheme="https")  # aiohttp: https:// and wss:// both mean TLS
    web = await WsStomp.open(session, url, ssl_context=tls_files.client_context())
    tcp = raw_client(broker)
    try:
        await web.subscribe("/queue/secure", ack="auto")
        tcp.request("SEND", {"destination": "/queue/secure"}, b"over wss")
        (message,) = await web.receive(1)
        assert message.body == b"over wss"
    finally:
        tcp.close()
        await web.close()
    with pytest.raises(aiohttp.ClientConnectorCertificateError):
        await WsStomp.open(session, url)  # the system's CAs do not know the test CA
