"""STOMP 1.0, 1.1 and 1.2 conformance over real sockets, with raw frames and with stomp.py.

Covers connecting and version negotiation, the headers and bodies a MESSAGE carries, receipts,
heart-beats, the connect timeout, the configurable frame limits and DISCONNECT.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import stomp

from sluiceway.core.values.flow import DEFAULT_CONNECTION_FLOW_COUNT, DEFAULT_CONNECTION_FLOW_LIMIT
from sluiceway.protocol.codec import encode_frame
from sluiceway.protocol.frames import Frame, StompVersion
from sluiceway.testing import BrokerThread
from tests.e2e.conftest import BrokerFactory, ClientFactory
from tests.e2e.rawclient import ConnectionClosed, RawClient
from tests.e2e.stomppy import Recorder, connect, sync, with_receipt
from tests.e2e.support import wait_connection_count

VERSIONS = ("1.0", "1.1", "1.2")
STOMP_CLASSES: dict[str, Any] = {
    "1.0": stomp.Connection10,
    "1.1": stomp.Connection11,
    "1.2": stomp.Connection12,
}
# A header value with every character STOMP 1.2 escapes; STOMP 1.1 has no escape for CR.
TRICKY_1_2 = "a:b\nc\\d\re"
TRICKY_1_1 = "a:b\nc\\d"
BINARY = bytes(range(256)) * 4
SLACK_S = 0.15  # scheduling tolerance on top of a timed interval


# -- helpers --------------------------------------------------------------------------------------

Dialer = Callable[[int], RawClient]


@pytest.fixture
def dial() -> Iterator[Dialer]:
    """Open raw connections to any broker's port; all are closed after the test."""
    opened: list[RawClient] = []

    def make(port: int) -> RawClient:
        client = RawClient(port)
        opened.append(client)
        return client

    yield make
    for client in opened:
        client.close()


def wire_client(dial: Dialer, port: int, version: str) -> tuple[RawClient, bytearray]:
    """A client connected with `version` that keeps every byte it receives, to check what was
    on the wire."""
    client = dial(port)
    wire = client.wire = bytearray()
    client.connect(version)
    return client, wire


def open_raw(client: RawClient, command: str, headers: dict[str, str]) -> Frame:
    """Connect with exactly `headers` (RawClient.connect always adds accept-version)."""
    client.send_bytes(encode_frame(Frame(command, headers)))
    connected = client.expect("CONNECTED")
    client.version = StompVersion(connected.headers["version"])
    client.decoder.version = client.version
    return connected


def round_trip(client: RawClient, destination: str, body: bytes) -> Frame:
    """Subscribe, send `body` and receive it on the same connection."""
    client.subscribe(destination, "rt", ack="auto")
    client.request("SEND", {"destination": destination}, body)
    (message,) = client.receive(1)
    assert message.body == body
    return message


class StompListener(Recorder):
    """A Recorder that also keeps the CONNECTED frame and counts heart-beats."""

    def __init__(self) -> None:
        super().__init__()
        self.connected: dict[str, str] = {}
        self.heartbeats = 0
        self.heartbeat_timeouts = 0

    def on_connected(self, frame: Any) -> None:
        self._record(lambda: self.connected.update(frame.headers))

    def on_heartbeat(self) -> None:
        self._record(lambda: setattr(self, "heartbeats", self.heartbeats + 1))

    def on_heartbeat_timeout(self) -> None:
        self._record(lambda: setattr(self, "heartbeat_timeouts", self.heartbeat_timeouts + 1))


@contextmanager
def stomp_client(
    port: int, version: str = "1.2", **options: Any
) -> Iterator[tuple[Any, StompListener]]:
    """A stomp.py connection built with `options` (heartbeats, auto_decode...), and its listener.

    It is disconnected (with a receipt) on the way out unless the test already did so.
    """
    connection = STOMP_CLASSES[version]([("127.0.0.1", port)], **options)
    listener = StompListener()
    connection.set_listener("listener", listener)
    connection.connect(wait=True)
    try:
        yield connection, listener
    finally:
        if connection.is_connected():
            connection.disconnect(receipt="bye")


def disconnect(connection: Any, recorder: Recorder) -> None:
    """DISCONNECT with a receipt and wait for the RECEIPT and for the socket to close."""
    connection.disconnect(receipt="bye")
    recorder.wait_for(lambda: "bye" in recorder.receipts and recorder.disconnected)


def eol_arrivals(client: RawClient, duration: float) -> list[float]:
    """When (seconds from now) each byte arrived on an otherwise silent connection, for
    `duration` seconds. Every byte must be a heart-beat EOL."""
    start = time.monotonic()
    deadline = start + duration
    arrivals: list[float] = []
    while (remaining := deadline - time.monotonic()) > 0:
        client.sock.settimeout(remaining)
        try:
            data = client.sock.recv(4096)
        except TimeoutError:
            break
        if not data:
            raise ConnectionClosed("the broker closed the connection")
        assert set(data) == {0x0A}, f"expected only heart-beat EOLs, got {data!r}"
        arrivals.extend([time.monotonic() - start] * len(data))
    return arrivals


def keep_alive(client: RawClient, duration: float, every: float) -> None:
    """Send a heart-beat EOL every `every` seconds for `duration` seconds."""
    deadline = time.monotonic() + duration
    while time.monotonic() < deadline:
        client.send_bytes(b"\n")
        time.sleep(every)  # the pace of the heart-beats is what is being tested


# -- connecting -----------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["CONNECT", "STOMP"])
@pytest.mark.parametrize(
    ("accept_version", "expected"),
    [
        ("1.0", "1.0"),
        ("1.1", "1.1"),
        ("1.2", "1.2"),
        ("1.0,1.1,1.2", "1.2"),
        ("1.1,1.0", "1.1"),
        ("1.2,2.0", "1.2"),
        (None, "1.0"),
    ],
)
def test_version_negotiation(
    raw: ClientFactory, command: str, accept_version: str | None, expected: str
) -> None:
    client = raw(connect=False)
    headers = {"host": "localhost"}
    if accept_version is not None:
        headers["accept-version"] = accept_version
    connected = open_raw(client, command, headers)
    assert connected.headers["version"] == expected
    # STOMP 1.0 has no heart-beating.
    assert ("heart-beat" in connected.headers) == (expected != "1.0")
    round_trip(client, "/queue/negotiated", b"in " + expected.encode())


def test_connected_headers(make_broker: BrokerFactory, dial: Dialer) -> None:
    broker = make_broker(
        {"imq.stomp.heartbeat.send": "3000", "imq.stomp.heartbeat.receive": "4000"}
    )
    first, second = dial(broker.port), dial(broker.port)
    one = first.connect("1.2")
    two = second.connect("1.1", connection_flow_count="7", connection_flow_limit="40")
    assert one.headers["version"] == "1.2"
    assert two.headers["version"] == "1.1"
    assert re.fullmatch(r"Sluiceway/\d+\.\d+\.\d+\S*", one.headers["server"]), one
    assert one.headers["session"]
    assert one.headers["session"] != two.headers["session"]
    assert one.headers["heart-beat"] == "3000,4000"
    assert one.headers["connection-flow-count"] == str(DEFAULT_CONNECTION_FLOW_COUNT)
    assert one.headers["connection-flow-limit"] == str(DEFAULT_CONNECTION_FLOW_LIMIT)
    assert one.headers["connection-flow-limit-enabled"] == "false"
    assert two.headers["connection-flow-count"] == "7"
    assert two.headers["connection-flow-limit"] == "40"


@pytest.mark.parametrize("version", VERSIONS)
def test_stomp_py_connected_headers(make_broker: BrokerFactory, version: str) -> None:
    broker = make_broker(
        {"imq.stomp.heartbeat.send": "3000", "imq.stomp.heartbeat.receive": "4000"}
    )
    with stomp_client(broker.port, version) as (_, listener):
        headers = listener.connected
        assert headers["version"] == version
        assert headers["server"].startswith("Sluiceway/")
        assert headers["session"]
        assert headers["connection-flow-count"] == str(DEFAULT_CONNECTION_FLOW_COUNT)
        assert headers.get("heart-beat") == (None if version == "1.0" else "3000,4000")


def ack_with_stomp_py(connection: Any, version: str, message: Any, receipt: str) -> None:
    """ACK `message` the way each version names it."""
    headers = message.headers
    if version == "1.0":
        connection.ack(headers["message-id"], receipt=receipt)
    elif version == "1.1":
        connection.ack(headers["message-id"], headers["subscription"], receipt=receipt)
    else:
        connection.ack(headers["ack"], receipt=receipt)


@pytest.mark.parametrize("version", VERSIONS)
def test_stomp_py_send_subscribe_ack_disconnect(broker: BrokerThread, version: str) -> None:
    destination = "/queue/rt"
    producer, produced = connect(broker.port, version=version)
    consumer, recorder = connect(broker.port, version=version)
    # STOMP 1.0 subscriptions need no id: the destination names the subscription.
    sub_id = None if version == "1.0" else "sub-1"
    with_receipt(
        recorder,
        lambda r: consumer.subscribe(
            destination,
            id=sub_id,
            ack="client",
            headers={"receipt": r, "consumer-flow-limit": "1"},
        ),
    )
    producer.send(destination, "one")
    with_receipt(produced, lambda r: producer.send(destination, "two", headers={"receipt": r}))

    (first,) = recorder.wait_messages(1)
    sync(consumer, recorder)
    assert [m.body for m in recorder.take()] == ["one"]  # a window of one: "two" waits
    assert first.headers["subscription"] == (sub_id or destination)
    assert first.headers["destination"] == destination
    assert ("ack" in first.headers) == (version == "1.2")

    with_receipt(recorder, lambda r: ack_with_stomp_py(consumer, version, first, r))
    (second,) = recorder.wait_messages(1)  # only an accepted ACK opens the window
    assert second.body == "two"
    assert second.headers["message-id"] != first.headers["message-id"]
    with_receipt(recorder, lambda r: ack_with_stomp_py(consumer, version, second, r))
    disconnect(consumer, recorder)

    # Both ACKs took effect: nothing is left to redeliver after the consumer left.
    checker, checked = connect(broker.port, version=version)
    with_receipt(checked, lambda r: checker.subscribe(destination, id="2", headers={"receipt": r}))
    sync(checker, checked)
    assert checked.take() == []
    disconnect(checker, checked)
    disconnect(producer, produced)


def test_raw_disconnect_receipt_then_close(broker: BrokerThread, raw: ClientFactory) -> None:
    stays = raw()
    client = raw()
    wait_connection_count(broker, 2)
    receipt = client.request("DISCONNECT")
    assert receipt.headers["receipt-id"]
    client.expect_closed()
    wait_connection_count(broker, 1)
    round_trip(stays, "/queue/after-disconnect", b"still here")


def test_stomp_py_disconnect_receipt_then_close(broker: BrokerThread) -> None:
    connection, recorder = connect(broker.port)
    wait_connection_count(broker, 1)
    disconnect(connection, recorder)
    assert recorder.errors == []
    wait_connection_count(broker, 0)


# -- MESSAGE headers ------------------------------------------------------------------------------


def test_escaped_headers_reach_a_1_2_consumer_intact(broker: BrokerThread, dial: Dialer) -> None:
    producer = dial(broker.port)
    producer.connect("1.2")
    consumer, wire = wire_client(dial, broker.port, "1.2")
    consumer.subscribe("/queue/esc")
    producer.request("SEND", {"destination": "/queue/esc", "tricky": TRICKY_1_2, "odd:name": "v"})
    (message,) = consumer.receive(1)
    assert message.headers["tricky"] == TRICKY_1_2
    assert message.headers["odd:name"] == "v"
    assert b"\ntricky:a\\cb\\nc\\\\d\\re\n" in wire
    assert b"\nodd\\cname:v\n" in wire


def test_escaped_headers_reach_a_1_1_consumer_intact(broker: BrokerThread, dial: Dialer) -> None:
    producer = dial(broker.port)
    producer.connect("1.1")
    consumer, wire = wire_client(dial, broker.port, "1.1")
    consumer.subscribe("/queue/esc11")
    producer.request("SEND", {"destination": "/queue/esc11", "tricky": TRICKY_1_1, "odd:n": "v"})
    (message,) = consumer.receive(1)
    assert message.headers["tricky"] == TRICKY_1_1
    assert message.headers["odd:n"] == "v"
    assert b"\ntricky:a\\cb\\nc\\\\d\n" in wire


@pytest.mark.parametrize(
    ("version", "kept", "left_out"),
    [
        # STOMP 1.1 cannot carry a CR; 1.0 cannot carry a CR, a LF or a colon in a name.
        ("1.1", {"colon": "x:y", "newline": "l\nm", "backslash": "b\\s", "odd:name": "v"}, {"cr"}),
        ("1.0", {"colon": "x:y", "backslash": "b\\s"}, {"cr", "newline", "odd:name"}),
    ],
)
def test_older_consumers_get_messages_without_headers_they_cannot_carry(
    broker: BrokerThread, version: str, kept: dict[str, str], left_out: set[str], dial: Dialer
) -> None:
    producer = dial(broker.port)
    producer.connect("1.2")
    consumer = dial(broker.port)
    consumer.connect(version)
    destination = f"/queue/older-{version}"
    consumer.subscribe(destination)
    headers = {
        "destination": destination,
        "colon": "x:y",
        "newline": "l\nm",
        "backslash": "b\\s",
        "cr": "c\rr",
        "odd:name": "v",
    }
    producer.request("SEND", headers, b"body")
    (message,) = consumer.receive(1)
    assert message.body == b"body"
    for name, value in kept.items():
        assert message.headers.get(name) == value, (name, message)
    for name in left_out:
        assert name not in message.headers, (name, message)
    assert message.headers["destination"] == destination


@pytest.mark.parametrize(("version", "value"), [("1.2", TRICKY_1_2), ("1.1", TRICKY_1_1)])
def test_stomp_py_escaped_headers_intact(broker: BrokerThread, version: str, value: str) -> None:
    producer, produced = connect(broker.port, version=version)
    consumer, recorder = connect(broker.port, version=version)
    with_receipt(
        recorder, lambda r: consumer.subscribe("/queue/esc", id="1", headers={"receipt": r})
    )
    with_receipt(
        produced,
        lambda r: producer.send("/queue/esc", "x", headers={"tricky": value, "receipt": r}),
    )
    (message,) = recorder.wait_messages(1)
    assert message.headers["tricky"] == value
    disconnect(consumer, recorder)
    disconnect(producer, produced)


@pytest.mark.parametrize(
    "body",
    [b"\x00", b"a\x00b\x00\x00c", b"\x00" * 100, BINARY, b""],
    ids=["nul", "nuls-inside", "nuls-only", "binary", "empty"],
)
@pytest.mark.parametrize("version", VERSIONS)
def test_bodies_arrive_byte_for_byte(
    broker: BrokerThread, version: str, body: bytes, dial: Dialer
) -> None:
    producer, consumer = dial(broker.port), dial(broker.port)
    producer.connect(version)
    consumer.connect(version)
    consumer.subscribe("/queue/bodies")
    producer.request("SEND", {"destination": "/queue/bodies"}, body)
    (message,) = consumer.receive(1)
    assert message.body == body
    assert message.headers.get("content-length", "0") == str(len(body))


def test_body_without_content_length_ends_at_the_first_nul(raw: ClientFactory) -> None:
    producer, consumer = raw(), raw()
    consumer.subscribe("/queue/nul-ended")
    producer.send_bytes(b"SEND\ndestination:/queue/nul-ended\nreceipt:r\n\nplain text\x00")
    producer.expect("RECEIPT")
    (message,) = consumer.receive(1)
    assert message.body == b"plain text"
    assert message.headers["content-length"] == "10"


@pytest.mark.parametrize("body", [BINARY, b"x\x00y\x00", b""], ids=["binary", "nul", "empty"])
@pytest.mark.parametrize("version", VERSIONS)
def test_stomp_py_bodies(broker: BrokerThread, version: str, body: bytes) -> None:
    with (
        stomp_client(broker.port, version, auto_decode=False) as (producer, produced),
        stomp_client(broker.port, version, auto_decode=False) as (consumer, recorder),
    ):
        with_receipt(
            recorder, lambda r: consumer.subscribe("/queue/b", id="1", headers={"receipt": r})
        )
        with_receipt(produced, lambda r: producer.send("/queue/b", body, headers={"receipt": r}))
        (message,) = recorder.wait_messages(1)
        assert message.body == body


@pytest.mark.parametrize("version", VERSIONS)
def test_content_type_and_custom_headers_pass_through(
    broker: BrokerThread, version: str, dial: Dialer
) -> None:
    producer, consumer = dial(broker.port), dial(broker.port)
    producer.connect(version)
    consumer.connect(version)
    consumer.subscribe("/queue/custom")
    custom = {
        "content-type": "application/json;charset=utf-8",
        "x-trace": "abc-123",
        "JMSType": "order",
        "empty": "",
        "spaces": "  padded  ",
        "unicode": "grüße ✓",
    }
    producer.request("SEND", {"destination": "/queue/custom", **custom}, b"{}")
    (message,) = consumer.receive(1)
    for name, value in custom.items():
        assert message.headers.get(name) == value, (name, message)


def test_repeated_header_first_value_wins(raw: ClientFactory) -> None:
    producer, consumer = raw(), raw()
    consumer.subscribe("/queue/repeat")
    producer.send_bytes(b"SEND\ndestination:/queue/repeat\nx:first\nx:second\nreceipt:r\n\n\x00")
    producer.expect("RECEIPT")
    (message,) = consumer.receive(1)
    assert message.headers["x"] == "first"


@pytest.mark.parametrize("version", VERSIONS)
def test_stomp_py_content_type_and_custom_headers(broker: BrokerThread, version: str) -> None:
    producer, produced = connect(broker.port, version=version)
    consumer, recorder = connect(broker.port, version=version)
    with_receipt(recorder, lambda r: consumer.subscribe("/queue/c", id="1", headers={"receipt": r}))
    with_receipt(
        produced,
        lambda r: producer.send(
            "/queue/c",
            '{"a": 1}',
            content_type="application/json",
            headers={"x-trace": "abc-123", "receipt": r},
        ),
    )
    (message,) = recorder.wait_messages(1)
    assert message.headers["content-type"] == "application/json"
    assert message.headers["x-trace"] == "abc-123"
    assert message.body == '{"a": 1}'
    disconnect(consumer, recorder)
    disconnect(producer, produced)


SPOOFED = {
    "message-id": "spoofed-id",
    "subscription": "spoofed-sub",
    "ack": "spoofed-ack",
    "redelivered": "true",
    "delivery-count": "99",
    "timestamp": "1",
}


def check_not_spoofed(headers: dict[str, str], sub_id: str) -> None:
    assert headers["message-id"] != SPOOFED["message-id"]
    assert headers["subscription"] == sub_id
    assert headers["redelivered"] == "false"
    assert headers["delivery-count"] == "1"
    assert headers["timestamp"] != SPOOFED["timestamp"]
    assert headers.get("ack") != SPOOFED["ack"]


def test_reserved_headers_cannot_be_spoofed(raw: ClientFactory) -> None:
    producer, consumer = raw(), raw()
    consumer.subscribe("/queue/spoof", "real-sub")
    producer.request("SEND", {"destination": "/queue/spoof", **SPOOFED}, b"x")
    (message,) = consumer.receive(1)
    check_not_spoofed(message.headers, "real-sub")
    consumer.request("ACK", {"id": message.headers["ack"]})  # the broker's own ack id works
    consumer.request("UNSUBSCRIBE", {"id": "real-sub"})
    consumer.subscribe("/queue/spoof", "again")
    consumer.sync()
    assert consumer.drain() == []


@pytest.mark.parametrize("version", VERSIONS)
def test_stomp_py_reserved_headers_cannot_be_spoofed(broker: BrokerThread, version: str) -> None:
    producer, produced = connect(broker.port, version=version)
    consumer, recorder = connect(broker.port, version=version)
    with_receipt(
        recorder,
        lambda r: consumer.subscribe("/queue/spoof", id="real", headers={"receipt": r}),
    )
    with_receipt(
        produced, lambda r: producer.send("/queue/spoof", "x", headers={**SPOOFED, "receipt": r})
    )
    (message,) = recorder.wait_messages(1)
    check_not_spoofed(message.headers, "real")
    disconnect(consumer, recorder)
    disconnect(producer, produced)


# -- receipts -------------------------------------------------------------------------------------

FLOW_HEADERS = {
    "consumer-flow-limit": "5",
    "consumer-flow-threshold": "20",
    "consumer-flow-prefetch": "true",
}


def test_receipts_for_every_client_frame_in_order(raw: ClientFactory) -> None:
    producer, client = raw(), raw()
    client.subscribe("/queue/rc", "main")
    for body in (b"1", b"2"):
        producer.send("SEND", {"destination": "/queue/rc"}, body)
    first, second = client.receive(2)
    frames: list[tuple[str, dict[str, str]]] = [
        ("SEND", {"destination": "/queue/rc-out"}),
        ("SUBSCRIBE", {"destination": "/queue/rc-other", "id": "extra", **FLOW_HEADERS}),
        ("UNSUBSCRIBE", {"id": "extra"}),
        ("ACK", {"id": first.headers["ack"]}),
        ("NACK", {"id": second.headers["ack"]}),
        ("BEGIN", {"transaction": "t1"}),
        ("SEND", {"destination": "/queue/rc-out", "transaction": "t1"}),
        ("COMMIT", {"transaction": "t1"}),
        ("BEGIN", {"transaction": "t2"}),
        ("SEND", {"destination": "/queue/rc-out", "transaction": "t2"}),
        ("ABORT", {"transaction": "t2"}),
        ("DISCONNECT", {}),
    ]
    # All in one write: the receipts must still come back one per frame, in order.
    client.send_bytes(
        b"".join(
            encode_frame(Frame(command, {**headers, "receipt": f"rc-{i}"}), StompVersion.V1_2)
            for i, (command, headers) in enumerate(frames)
        )
    )
    receipts = [client.expect("RECEIPT") for _ in frames]
    assert [r.headers["receipt-id"] for r in receipts] == [f"rc-{i}" for i in range(len(frames))]
    subscribed = receipts[1].headers
    assert {name: subscribed[name] for name in FLOW_HEADERS} == FLOW_HEADERS
    client.expect_closed()

    # Each frame took effect: two messages reached rc-out (the aborted one did not), and only
    # the NACKed message is left on rc.
    checker = raw()
    checker.subscribe("/queue/rc-out", "out")
    checker.subscribe("/queue/rc", "rc")
    checker.sync()
    got = sorted((m.headers["destination"], m.body) for m in checker.drain())
    assert got == [("/queue/rc", b"2"), ("/queue/rc-out", b""), ("/queue/rc-out", b"")]


def test_stomp_py_receipts_for_every_client_frame_in_order(broker: BrokerThread) -> None:
    producer, produced = connect(broker.port)
    client, recorder = connect(broker.port)
    with_receipt(
        recorder,
        lambda r: client.subscribe(
            "/queue/rc", id="main", ack="client-individual", headers={"receipt": r}
        ),
    )
    producer.send("/queue/rc", "1")
    producer.send("/queue/rc", "2")
    first, second = recorder.wait_messages(2)
    before = list(recorder.receipts)
    steps: list[Callable[[str], None]] = [
        lambda r: client.send("/queue/rc-out", "a", headers={"receipt": r}),
        lambda r: client.subscribe(
            "/queue/rc-other", id="extra", headers={**FLOW_HEADERS, "receipt": r}
        ),
        lambda r: client.unsubscribe("extra", headers={"receipt": r}),
        lambda r: client.ack(first.headers["ack"], receipt=r),
        lambda r: client.nack(second.headers["ack"], receipt=r),
        lambda r: client.begin("t1", headers={"receipt": r}),
        lambda r: client.send("/queue/rc-out", "b", headers={"transaction": "t1", "receipt": r}),
        lambda r: client.commit("t1", headers={"receipt": r}),
        lambda r: client.begin("t2", headers={"receipt": r}),
        lambda r: client.abort("t2", headers={"receipt": r}),
        lambda r: client.disconnect(receipt=r),
    ]
    names = [f"step-{i}" for i in range(len(steps))]
    for step, name in zip(steps, names, strict=True):
        step(name)
    recorder.wait_for(lambda: names[-1] in recorder.receipts)
    assert list(recorder.receipts)[len(before) :] == names
    subscribed = recorder.receipts["step-1"]
    assert {name: subscribed[name] for name in FLOW_HEADERS} == FLOW_HEADERS
    recorder.wait_for(lambda: recorder.disconnected)
    assert recorder.errors == []
    disconnect(producer, produced)


# -- heart-beats ----------------------------------------------------------------------------------

FAST_HEARTBEATS = {"imq.stomp.heartbeat.send": "100", "imq.stomp.heartbeat.receive": "100"}


@pytest.mark.parametrize(
    ("version", "heart_beat"), [("1.2", "0,0"), ("1.1", "100,0"), ("1.0", "0,100")]
)
def test_no_heartbeats_unless_the_client_wants_them(
    make_broker: BrokerFactory, version: str, heart_beat: str, dial: Dialer
) -> None:
    broker = make_broker(FAST_HEARTBEATS)
    client = dial(broker.port)
    # With "100,0" the client promises heart-beats but asks for none; STOMP 1.0 has none at all.
    connected = client.connect(version, heart_beat=heart_beat)
    keep_alive_for = 0.5
    if heart_beat.startswith("100"):
        ticker = threading.Thread(target=keep_alive, args=(client, keep_alive_for, 0.05))
        ticker.start()
        assert eol_arrivals(client, keep_alive_for) == []
        ticker.join()
    else:
        assert eol_arrivals(client, keep_alive_for) == []
    assert ("heart-beat" in connected.headers) == (version != "1.0")
    round_trip(client, "/queue/quiet", b"still connected")


def test_broker_heartbeats_at_the_negotiated_interval(
    make_broker: BrokerFactory, dial: Dialer
) -> None:
    broker = make_broker(FAST_HEARTBEATS)
    client = dial(broker.port)
    connected = client.connect("1.2", heart_beat="0,200")
    assert connected.headers["heart-beat"] == "100,100"
    # Negotiated: max(broker can send 100, client wants 200) = 200 ms.
    duration = 1.0
    arrivals = eol_arrivals(client, duration)
    assert len(arrivals) >= int(duration / 0.2) - 1, arrivals
    gaps = [b - a for a, b in zip([0.0, *arrivals], [*arrivals, duration], strict=True)]
    assert max(gaps) <= 0.2 + SLACK_S, arrivals


def test_stomp_py_receives_heartbeats(make_broker: BrokerFactory) -> None:
    broker = make_broker(FAST_HEARTBEATS)
    with stomp_client(broker.port, "1.2", heartbeats=(0, 200)) as (connection, listener):
        start = time.monotonic()
        listener.wait_for(lambda: listener.heartbeats >= 5, timeout=2.0)
        assert time.monotonic() - start < 5 * 0.2 + SLACK_S * 3
        assert listener.heartbeat_timeouts == 0
        assert connection.is_connected()


def test_silent_client_is_disconnected_for_missing_heartbeats(
    make_broker: BrokerFactory, dial: Dialer
) -> None:
    broker = make_broker(FAST_HEARTBEATS)
    silent = dial(broker.port)
    start = time.monotonic()
    silent.connect("1.2", heart_beat="100,0")
    error = silent.expect("ERROR", timeout=2.0)
    elapsed = time.monotonic() - start
    # Grace defaults to 2 intervals: not before 0.2 s, and not much later.
    assert 0.2 - 0.05 <= elapsed <= 0.2 + 1.0, elapsed
    assert "heart-beat" in error.headers["message"]
    assert error.headers["status"] == "400"
    assert b"imq.stomp.heartbeat.grace" in error.body
    silent.expect_closed()


def test_grace_is_configurable(make_broker: BrokerFactory, dial: Dialer) -> None:
    broker = make_broker({**FAST_HEARTBEATS, "imq.stomp.heartbeat.grace": "5"})
    silent = dial(broker.port)
    start = time.monotonic()
    silent.connect("1.2", heart_beat="100,0")
    error = silent.expect("ERROR", timeout=2.0)
    assert time.monotonic() - start >= 0.5 - 0.05
    assert "heart-beat" in error.headers["message"]
    silent.expect_closed()


def test_client_sending_heartbeats_stays_connected(
    make_broker: BrokerFactory, dial: Dialer
) -> None:
    broker = make_broker(FAST_HEARTBEATS)
    client = dial(broker.port)
    client.connect("1.2", heart_beat="100,0")
    keep_alive(client, 0.8, every=0.05)  # four times the 0.2 s the silent client got
    round_trip(client, "/queue/alive", b"alive")


def test_stomp_py_sending_heartbeats_stays_connected(make_broker: BrokerFactory) -> None:
    broker = make_broker({"imq.stomp.heartbeat.send": "0", "imq.stomp.heartbeat.receive": "100"})
    with stomp_client(broker.port, "1.2", heartbeats=(50, 0)) as (connection, listener):
        time.sleep(0.8)  # time passing is the point: stomp.py's heart-beats must keep it alive
        assert connection.is_connected()
        with_receipt(listener, lambda r: connection.begin("t", headers={"receipt": r}))
        assert listener.errors == []


# -- connect timeout ------------------------------------------------------------------------------


def test_connection_without_connect_is_closed_after_the_timeout(
    make_broker: BrokerFactory, dial: Dialer
) -> None:
    broker = make_broker({"imq.stomp.connect.timeout": "300"})
    prompt = dial(broker.port)
    prompt.connect("1.2")
    idle = dial(broker.port)
    start = time.monotonic()
    error = idle.expect("ERROR", timeout=3.0)
    elapsed = time.monotonic() - start
    assert 0.3 - 0.05 <= elapsed <= 0.3 + 1.0, elapsed
    assert error.headers["message"]
    assert error.headers["status"] == "400"
    assert b"imq.stomp.connect.timeout" in error.body
    idle.expect_closed()
    # The timeout only applies before CONNECT: the prompt client is past it and still served.
    round_trip(prompt, "/queue/prompt", b"served")


def test_partial_connect_frame_is_closed_after_the_timeout(
    make_broker: BrokerFactory, dial: Dialer
) -> None:
    broker = make_broker({"imq.stomp.connect.timeout": "300"})
    slow = dial(broker.port)
    slow.send_bytes(b"CONNECT\naccept-version:1.2\n")  # never finished
    error = slow.expect("ERROR", timeout=3.0)
    assert b"CONNECT" in error.body
    slow.expect_closed()


# -- limits ---------------------------------------------------------------------------------------


def padded_send(size: int) -> bytes:
    """A SEND with a receipt whose encoding is exactly `size` bytes, NUL included."""
    headers = {"destination": "/queue/limits", "receipt": "sized"}
    bare = len(encode_frame(Frame("SEND", headers, b"x" * 100)))
    frame = encode_frame(Frame("SEND", headers, b"x" * (100 + size - bare)))
    assert len(frame) == size
    return frame


def expect_limit_error(client: RawClient, status: str, prop: str) -> None:
    error = client.expect("ERROR")
    assert error.headers["message"]
    assert error.headers["status"] == status
    assert prop.encode() in error.body, error
    client.expect_closed()


@pytest.mark.parametrize("framing", ["content-length", "nul-terminated"])
def test_frame_size_limit(make_broker: BrokerFactory, framing: str, dial: Dialer) -> None:
    broker = make_broker({"imq.stomp.max_frame_size": "512"})
    other, client = dial(broker.port), dial(broker.port)
    other.connect()
    client.connect()
    if framing == "content-length":
        fits, too_big = padded_send(512), padded_send(513)
    else:
        head = b"SEND\ndestination:/queue/limits\nreceipt:sized\n\n"
        fits = head + b"y" * (511 - len(head)) + b"\x00"
        too_big = head + b"y" * (512 - len(head)) + b"\x00"
        assert (len(fits), len(too_big)) == (512, 513)
    client.send_bytes(fits)
    client.expect("RECEIPT")
    client.send_bytes(too_big)
    expect_limit_error(client, "423", "imq.stomp.max_frame_size")
    round_trip(other, "/queue/unaffected", b"ok")


def test_header_count_limit(make_broker: BrokerFactory, dial: Dialer) -> None:
    broker = make_broker({"imq.stomp.max_header_count": "6"})
    client = dial(broker.port)
    client.connect()
    # BEGIN, not SEND: a SEND must also leave room for the headers the broker adds to the
    # MESSAGE (test_send_leaves_room_for_the_broker_headers).
    four = {f"h{i}": "v" for i in range(4)}
    client.request("BEGIN", {"transaction": "t1", **four})  # 6 headers with the receipt
    client.send("BEGIN", {"transaction": "t2", "receipt": "r", **four, "h4": "v"})
    expect_limit_error(client, "400", "imq.stomp.max_header_count")


def test_send_leaves_room_for_the_broker_headers(make_broker: BrokerFactory, dial: Dialer) -> None:
    broker = make_broker({"imq.stomp.max_header_count": "20"})
    client = dial(broker.port)
    client.connect()
    client.subscribe("/queue/room", ack="auto")
    # 5 + destination + receipt + content-length = 8 = 20 - 12
    fits = {f"h{i}": "v" for i in range(5)}
    client.request("SEND", {"destination": "/queue/room", **fits}, b"ok")
    (message,) = client.receive(1)
    assert len(message.headers) <= 20  # the MESSAGE is within the same limit
    client.send("SEND", {"destination": "/queue/room", "receipt": "r", **fits, "h5": "v"}, b"no")
    error = client.expect("ERROR")
    assert error.headers["status"] == "400"
    assert b"imq.stomp.max_header_count" in error.body


def test_header_length_limit(make_broker: BrokerFactory, dial: Dialer) -> None:
    broker = make_broker({"imq.stomp.max_header_length": "64"})
    client = dial(broker.port)
    client.connect()
    at_limit = "x:" + "v" * 62
    client.send_bytes(f"SEND\ndestination:/queue/limits\n{at_limit}\nreceipt:r\n\n\x00".encode())
    client.expect("RECEIPT")
    client.send_bytes(f"SEND\ndestination:/queue/limits\n{at_limit}v\nreceipt:r\n\n\x00".encode())
    expect_limit_error(client, "400", "imq.stomp.max_header_length")


def test_stomp_py_gets_an_error_for_an_oversized_frame(make_broker: BrokerFactory) -> None:
    broker = make_broker({"imq.stomp.max_frame_size": "1k"})
    connection, recorder = connect(broker.port)
    connection.send("/queue/limits", "z" * 2048)
    recorder.wait_for(lambda: bool(recorder.errors) and recorder.disconnected)
    (error,) = recorder.errors
    assert error.headers["status"] == "423"
    assert "imq.stomp.max_frame_size" in error.body
