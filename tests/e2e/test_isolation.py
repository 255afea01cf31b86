"""One slow or stalled client never delays the others, and costs bounded broker memory."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

from sluiceway.protocol.frames import Frame
from sluiceway.server.connection import WRITE_CHUNK
from tests.e2e.conftest import BrokerFactory
from tests.e2e.rawclient import RawClient
from tests.e2e.support import connection_infos, wait_until

ClientMaker = Callable[..., RawClient]

BODY = b"x" * 1000
HIGH_WATER = 16 * 1024


def stalled_client(clients: ClientMaker, port: int) -> RawClient:
    """A client that connects, subscribes and then never reads again."""
    client = clients(port, receive_buffer=4096)
    fields = {"destination": "/queue/iso", "id": "stalled", "ack": "client-individual"}
    client.request("SUBSCRIBE", fields)
    return client


def test_stalled_consumer_costs_bounded_memory_and_others_get_its_messages(
    make_broker: BrokerFactory, clients: ClientMaker
) -> None:
    broker = make_broker(
        {
            "imq.stomp.write.high_water": str(HIGH_WATER),
            "imq.stomp.write.low_water": "4096",
            "imq.stomp.stalled.reclaim": "200",
            # A small kernel send buffer, so what the client does not read backs up into the
            # broker's transport instead of megabytes of autotuned kernel buffer.
            "imq.protocol.tcp.outbufsz": "16k",
        }
    )
    stalled = stalled_client(clients, broker.port)
    producer = clients(broker.port)
    for i in range(500):
        producer.send("SEND", {"destination": "/queue/iso"}, b"%d " % i + BODY)
    producer.sync()

    # The stalled client subscribed first, so Open MQ dispatch staged everything to it; the
    # broker writes until the transport passes its high-water mark, then stops.
    wait_until(lambda: any(i.writing_paused for i in connection_infos(broker)))
    frame_size = len(BODY) + 300
    for info in connection_infos(broker):
        assert info.write_buffer <= HIGH_WATER + WRITE_CHUNK * frame_size

    healthy = clients(broker.port)
    healthy.subscribe("/queue/iso", ack="auto")
    # What the stalled client holds but was never written goes back to the queue (after
    # imq.stomp.stalled.reclaim) and reaches the healthy consumer.
    reclaimed: list[Frame] = []
    deadline = time.monotonic() + 10
    while not reclaimed and time.monotonic() < deadline:
        healthy.sync()
        reclaimed = healthy.drain()
    assert reclaimed, "the stalled client's unwritten messages never reached the other consumer"
    received = {m.body.split()[0] for m in reclaimed}

    # Written but unacknowledged messages come back when the stalled client goes away.
    stalled.close()
    deadline = time.monotonic() + 10
    while len(received) < 500 and time.monotonic() < deadline:
        healthy.sync()
        received |= {m.body.split()[0] for m in healthy.drain()}
    assert received == {b"%d" % i for i in range(500)}  # nothing lost


def test_a_stalled_client_does_not_delay_others_on_other_destinations(
    make_broker: BrokerFactory, clients: ClientMaker
) -> None:
    broker = make_broker(
        {"imq.stomp.write.high_water": str(HIGH_WATER), "imq.protocol.tcp.outbufsz": "16k"}
    )
    stalled_client(clients, broker.port)
    producer = clients(broker.port)
    for _ in range(300):
        producer.send("SEND", {"destination": "/queue/iso"}, BODY)
    other = clients(broker.port)
    other.subscribe("/queue/elsewhere", ack="auto")
    started = time.monotonic()
    for i in range(200):
        producer.request("SEND", {"destination": "/queue/elsewhere"}, b"%d" % i)
    assert len(other.receive(200)) == 200
    assert time.monotonic() - started < 10


def test_receipts_keep_flowing_while_a_backlog_is_delivered(
    make_broker: BrokerFactory, clients: ClientMaker
) -> None:
    """A consumer draining a large backlog gets its receipts promptly, not after the backlog.

    On the wire a RECEIPT can only be behind the MESSAGE frames already in flight (socket
    buffers and the transport's write buffer) plus at most one metered batch of
    connection-flow-count frames; the pump test in tests/server shows the batch bound exactly.
    """
    flow_count = 10
    broker = make_broker(
        {
            "imq.stomp.write.high_water": "8k",
            "imq.stomp.write.low_water": "2k",
            "imq.protocol.tcp.outbufsz": "8k",
        }
    )
    producer = clients(broker.port)
    for i in range(3000):
        producer.send("SEND", {"destination": "/queue/backlog"}, b"%d " % i + BODY)
    producer.sync()

    # A receive window of a few loopback segments: small enough to bound what is in flight,
    # large enough for TCP to run at full speed (a tiny window stalls on silly-window avoidance).
    consumer = clients(broker.port, receive_buffer=64 * 1024, connection_flow_count=str(flow_count))
    consumer.subscribe("/queue/backlog", ack="auto")
    received = 0
    gaps = []
    while received < 2800:
        received += len(consumer.receive(200))
        asked_at = received + len(consumer.messages)  # every frame read off the socket so far
        consumer.send("BEGIN", {"transaction": f"t{received}", "receipt": f"r{asked_at}"})
        while not consumer.other:
            consumer.read_some(time.monotonic() + 5)
            received += len(consumer.drain())
        assert consumer.expect("RECEIPT").headers["receipt-id"] == f"r{asked_at}"
        gaps.append(received - asked_at)
    # What can be in flight ahead of a RECEIPT: the client's and the broker's kernel buffers
    # (as the kernel reports them), the transport's high-water mark and one write chunk.
    (info,) = [i for i in connection_infos(broker) if i.subscriptions]
    client_buffer = consumer.sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
    frame_size = len(BODY) + 200
    in_flight = (client_buffer + info.send_buffer + 8192) // frame_size + min(
        WRITE_CHUNK, flow_count
    )
    assert max(gaps) <= in_flight + flow_count, (gaps, in_flight)
    assert len(gaps) >= 10  # receipts were asked for all through the delivery


def test_transport_tuning_properties_reach_the_socket(
    make_broker: BrokerFactory, clients: ClientMaker
) -> None:
    broker = make_broker(
        {
            "imq.protocol.tcp.nodelay": "false",
            "imq.protocol.tcp.inbufsz": "16k",
            "imq.protocol.tcp.outbufsz": "32k",
        }
    )
    clients(broker.port)
    (info,) = connection_infos(broker)
    assert info.tcp_nodelay is False
    assert info.receive_buffer >= 16 * 1024
    assert info.send_buffer >= 32 * 1024
    assert info.send_buffer < 4 * 32 * 1024  # set, not left to autotuning
    default = make_broker()
    clients(default.port)
    (info,) = connection_infos(default)
    assert info.tcp_nodelay is True  # imq.protocol.tcp.nodelay defaults to true
