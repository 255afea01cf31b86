"""A consumer's buffer is bounded by a finite window: the client asks for one even when no limit
is set, and a broker that sends beyond the window it granted ends the connection."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from sluiceway.client import ConnectionClosedError, ConnectionFactory
from sluiceway.client.settings import UNLIMITED_CONSUMER_WINDOW
from sluiceway.protocol.codec import FrameDecoder, encode_frame
from sluiceway.protocol.frames import Frame, StompVersion
from tests.client.conftest import ConnectTo
from tests.client.support import caught_up, queue_state
from tests.conftest import BrokerFactory
from tests.e2e.support import WAIT, eventually


async def test_no_limit_on_either_side_still_bounds_the_buffer(
    make_broker: BrokerFactory, connect: ConnectTo
) -> None:
    broker = make_broker({"imq.autocreate.queue.consumerFlowLimit": "-1"})  # no cap
    extra = 100
    sender = await connect(broker.port)
    producer = sender.session().producer("/queue/endless", persistent=False)
    for i in range(UNLIMITED_CONSUMER_WINDOW + extra):
        await producer.send(b"%d" % i)
    await caught_up(sender)
    connection = await connect(broker.port, consumer_flow_limit=-1)
    consumer = await connection.session().consumer("/queue/endless")
    assert consumer.flow_limit == UNLIMITED_CONSUMER_WINDOW  # asked for, and granted
    await eventually(lambda: consumer.buffered == UNLIMITED_CONSUMER_WINDOW, timeout=30)
    # The broker has every frame the client sent and counts the window used up: it keeps the
    # rest back while the application consumes nothing.
    await caught_up(connection)
    state = queue_state(broker, "/queue/endless")
    assert (state.outstanding, state.waiting) == (UNLIMITED_CONSUMER_WINDOW, extra)
    assert consumer.buffered == UNLIMITED_CONSUMER_WINDOW
    for _ in range(UNLIMITED_CONSUMER_WINDOW + extra):
        assert await consumer.receive(timeout=5) is not None
    assert consumer.max_buffered == UNLIMITED_CONSUMER_WINDOW


# -- a broker that oversteps the window --------------------------------------------------------

WINDOW = 3


async def _next_frame(reader: asyncio.StreamReader, decoder: FrameDecoder) -> Frame | None:
    """The client's next frame; None once it has closed the connection."""
    while (event := decoder.next_event()) is None:
        data = await reader.read(4096)
        if not data:
            return None
        decoder.receive_data(data)
    assert isinstance(event, Frame)
    return event


async def _overstep(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, granted: str
) -> None:
    """Play a broker that answers SUBSCRIBE with consumer-flow-limit `granted`, then sends one
    message more than WINDOW, in the same write as the RECEIPT."""
    decoder = FrameDecoder()
    connect = await _next_frame(reader, decoder)
    assert connect is not None
    assert connect.command == "CONNECT"
    writer.write(encode_frame(Frame("CONNECTED", {"version": "1.2", "heart-beat": "0,0"})))
    decoder.version = StompVersion.V1_2
    subscribe = await _next_frame(reader, decoder)
    assert subscribe is not None
    receipt = {"receipt-id": subscribe.headers["receipt"], "consumer-flow-limit": granted}
    frames = [Frame("RECEIPT", receipt)]
    for n in range(WINDOW + 1):
        headers = {
            "subscription": subscribe.headers["id"],
            "message-id": f"m{n}",
            "destination": subscribe.headers["destination"],
            "ack": f"a{n}",
        }
        frames.append(Frame("MESSAGE", headers, b"%d" % n))
    writer.write(b"".join(encode_frame(frame, StompVersion.V1_2) for frame in frames))
    while (frame := await _next_frame(reader, decoder)) is not None:  # until the client hangs up
        if "receipt" in frame.headers:
            writer.write(encode_frame(Frame("RECEIPT", {"receipt-id": frame.headers["receipt"]})))
    writer.close()


@pytest.fixture
async def overstepping(request: pytest.FixtureRequest) -> AsyncIterator[int]:
    """The port of a broker that grants `request.param` and sends beyond WINDOW."""
    granted: str = request.param

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _overstep(reader, writer, granted)

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    async with server:
        yield server.sockets[0].getsockname()[1]


@pytest.mark.parametrize(
    ("overstepping", "asked"),
    [
        (str(WINDOW), 1000),  # grants less than asked, sends more than it granted
        ("-1", WINDOW),  # grants no limit: the client holds it to what it asked for
    ],
    indirect=["overstepping"],
)
async def test_a_broker_sending_beyond_the_window_ends_the_connection(
    overstepping: int, asked: int
) -> None:
    address = f"stomp://127.0.0.1:{overstepping}"
    factory = ConnectionFactory(address, consumer_flow_limit=asked, ack_timeout=WAIT)
    async with await factory.connect() as connection:
        consumer = await connection.session().consumer("/queue/q")
        assert consumer.flow_limit == WINDOW
        await eventually(lambda: connection.closed)
        assert consumer.max_buffered == WINDOW  # the message beyond it was never buffered
        with pytest.raises(ConnectionClosedError) as closed:
            await consumer.receive(timeout=5)
    message = str(closed.value)
    assert "more messages than the window it granted" in message
    assert f"{WINDOW + 1} unconsumed messages for a consumer flow limit of {WINDOW}" in message
