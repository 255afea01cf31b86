"""The input budget end to end: frames before CONNECT, per connection, for the whole broker, over
TCP and WebSocket, and an ERROR that reaches a client still sending."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from functools import partial

import pytest

from sluiceway.core.values.memory import MemoryLedger
from sluiceway.protocol.codec import FrameDecoder, encode_frame
from sluiceway.protocol.frames import Frame
from sluiceway.server import connection
from sluiceway.testing import BrokerThread
from tests.conftest import BrokerFactory
from tests.e2e.rawclient import RawClient
from tests.e2e.stomppy import connect
from tests.e2e.support import wait_connection_count, wait_until
from tests.server.conftest import TlsFiles
from tests.server.rawws import RawWebSocket

KIB = 1024
CONNECT = encode_frame(Frame("CONNECT", {"accept-version": "1.2", "host": "localhost"}))


def send_head(length: int, destination: str = "/queue/big", **headers: str) -> bytes:
    """A SEND's command and headers, announcing a body of `length` bytes."""
    lines = "".join(f"{name}:{value}\n" for name, value in headers.items())
    return f"SEND\ndestination:{destination}\ncontent-length:{length}\n{lines}\n".encode()


def ledger_of(broker: BrokerThread) -> MemoryLedger:
    assert broker.broker is not None
    return broker.broker.ledger


def input_held(broker: BrokerThread) -> int:
    ledger = ledger_of(broker)
    return broker.call(lambda: ledger.input)


def holds(broker: BrokerThread, expected: int) -> bool:
    return input_held(broker) == expected


@pytest.fixture
def sockets() -> Iterator[list[socket.socket]]:
    """Plain sockets a test opens; all are closed after it."""
    opened: list[socket.socket] = []
    yield opened
    for sock in opened:
        sock.close()


def open_socket(port: int, opened: list[socket.socket]) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5.0)
    opened.append(sock)
    return sock


def read_to_end(sock: socket.socket) -> bytes:
    """Everything the broker sends until it closes its side."""
    received = bytearray()
    while chunk := sock.recv(65536):
        received += chunk
    return bytes(received)


def error_of(data: bytes) -> Frame:
    """The ERROR frame `data` starts with."""
    decoder = FrameDecoder()
    decoder.receive_data(data)
    frame = decoder.next_event()
    assert isinstance(frame, Frame), data
    assert frame.command == "ERROR", frame
    return frame


# -- units ----------------------------------------------------------------------------------------


# -- before CONNECT ------------------------------------------------------------------------------


def test_a_connect_body_is_refused_past_the_first_frame_limit(
    broker: BrokerThread, sockets: list[socket.socket]
) -> None:
    sock = open_socket(broker.port, sockets)
    sock.sendall(b"CONNECT\naccept-version:1.2\ncontent-length:57000000\n\n")
    sock.sendall(b"x" * (512 * KIB))  # the broker reads it, and drops it: no reset
    error = error_of(read_to_end(sock))
    assert error.headers["status"] == "423"
    assert error.headers["message"] == (
        "frame too large before CONNECT (imq.stomp.connect.max_frame_size)"
    )
    assert (error.headers["limit"], error.headers["limit-value"]) == (
        "imq.stomp.connect.max_frame_size",
        "8192",
    )
    assert b"send CONNECT first" in error.body
    wait_until(lambda: input_held(broker) == 0)


def test_connect_and_a_large_send_in_one_write(broker: BrokerThread) -> None:
    """The first frame's limit ends with the CONNECT: the frames after it in the same read are
    held to the general limits."""
    client = RawClient(broker.port)
    try:
        body = b"y" * (100 * KIB)
        client.send_bytes(CONNECT + send_head(len(body), receipt="big") + body + b"\0")
        client.expect("CONNECTED")
        assert client.expect("RECEIPT").headers["receipt-id"] == "big"
    finally:
        client.close()


def test_stomp_py_sends_a_large_message_after_connecting(broker: BrokerThread) -> None:
    connection_, recorder = connect(broker.port)
    try:
        connection_.subscribe("/queue/stomppy-big", id="1", ack="auto")
        body = "z" * (3 * 1024 * KIB)
        connection_.send("/queue/stomppy-big", body)
        (message,) = recorder.wait_messages(1)
        assert message.body == body
    finally:
        connection_.disconnect()


# -- per connection and for the broker ---------------------------------------------------------


def test_a_partial_body_is_charged_as_it_arrives_and_given_back(
    make_broker: BrokerFactory,
) -> None:
    broker = make_broker()
    client = RawClient(broker.port)
    try:
        client.connect()
        head = send_head(300 * KIB, receipt="whole")
        client.send_bytes(head + b"x" * (200 * KIB))
        wait_until(lambda: input_held(broker) == len(head) + 200 * KIB)
        ledger = ledger_of(broker)
        used = broker.call(lambda: ledger.used)
        client.send_bytes(b"x" * (100 * KIB) + b"\0")
        client.expect("RECEIPT")
        assert input_held(broker) == 0
        assert broker.call(lambda: ledger.used) >= used + 300 * KIB  # now a message in memory
        client.send_bytes(head + b"x" * (50 * KIB))
        wait_until(lambda: input_held(broker) > 50 * KIB)
    finally:
        client.close()
    wait_until(lambda: input_held(broker) == 0)  # the connection is gone: so is its charge


def test_partial_bodies_count_toward_the_memory_level(make_broker: BrokerFactory) -> None:
    """A body still arriving takes the broker to RED: new producers are refused (the memory
    level sees what the input budget holds)."""
    broker = make_broker(
        {
            "imq.memory.budget": "2m",
            "imq.stomp.input.total.max_bytes": "0",
            "imq.stomp.input.max_bytes": "0",
        }
    )
    stalled, producer = RawClient(broker.port), RawClient(broker.port)
    try:
        stalled.connect()
        producer.connect(failed_receipts="true")
        stalled.send_bytes(send_head(4096 * KIB) + b"x" * (2040 * KIB))
        wait_until(lambda: input_held(broker) > 2040 * KIB)
        refused = producer.request("SEND", {"destination": "/queue/other"}, b"small")
        assert refused.headers["status"] == "414"
        assert refused.headers["limit"] == "imq.memory.budget"
        stalled.close()
        wait_until(lambda: input_held(broker) == 0)
        assert (
            "status" not in producer.request("SEND", {"destination": "/queue/other"}, b"ok").headers
        )
    finally:
        stalled.close()
        producer.close()


def test_a_body_past_the_connection_budget_is_refused_as_it_arrives(
    make_broker: BrokerFactory, sockets: list[socket.socket]
) -> None:
    broker = make_broker({"imq.stomp.input.max_bytes": "256k"})
    sock = open_socket(broker.port, sockets)
    sock.sendall(CONNECT)
    sock.sendall(b"SEND\ndestination:/queue/big\n\n" + b"x" * (200 * KIB))  # to its NUL
    wait_until(lambda: input_held(broker) > 200 * KIB)
    sock.sendall(b"x" * (512 * KIB))
    data = read_to_end(sock)
    assert data.startswith(b"CONNECTED\n")
    error = error_of(data[data.index(b"\0") + 1 :])
    assert (error.headers["status"], error.headers["limit"]) == ("423", "imq.stomp.input.max_bytes")
    assert error.headers["message"] == "connection input limit exceeded (imq.stomp.input.max_bytes)"
    assert b"raise imq.stomp.input.max_bytes" in error.body
    wait_until(lambda: input_held(broker) == 0)


def test_a_send_announcing_more_than_the_budget_is_refused_at_its_headers(
    make_broker: BrokerFactory,
) -> None:
    broker = make_broker({"imq.stomp.input.max_bytes": "256k"})
    client = RawClient(broker.port)
    try:
        client.connect()
        client.send_bytes(send_head(60_000_000))  # no byte of the body is needed to refuse it
        error = client.expect("ERROR")
        assert (error.headers["status"], error.headers["limit"]) == (
            "423",
            "imq.stomp.input.max_bytes",
        )
        assert error.headers["limit-value"] == str(256 * KIB)
        assert b"exceeds the limit of 262144 bytes (imq.stomp.input.max_bytes)" in error.body
        client.expect_closed()
    finally:
        client.close()


def test_the_total_is_shared_by_every_connection(make_broker: BrokerFactory) -> None:
    broker = make_broker(
        {"imq.stomp.input.total.max_bytes": "1m", "imq.stomp.input.max_bytes": "768k"}
    )
    clients = [RawClient(broker.port) for _ in range(3)]
    try:
        head = send_head(500 * KIB, receipt="done")
        held = 0
        for client in clients[:2]:
            client.connect()
            client.send_bytes(head + b"x" * (400 * KIB))
            held += len(head) + 400 * KIB
            wait_until(partial(holds, broker, held))
        third = clients[2]
        third.connect()
        third.send_bytes(head + b"x" * (400 * KIB))  # 1.2 MiB in all: past the total
        error = third.expect("ERROR")
        assert (error.headers["status"], error.headers["limit"]) == (
            "414",
            "imq.stomp.input.total.max_bytes",
        )
        assert error.headers["limit-value"] == str(1024 * KIB)
        third.expect_closed()
        assert input_held(broker) == held  # within the total, and the refused one gave back
        for client in clients[:2]:  # the others finish their frames
            client.send_bytes(b"x" * (100 * KIB) + b"\0")
            assert client.expect("RECEIPT").headers["receipt-id"] == "done"
        assert input_held(broker) == 0
    finally:
        for client in clients:
            client.close()


# -- an ERROR that reaches a client still sending ---------------------------------------------


def test_an_oversized_header_still_being_written_gets_its_error(
    broker: BrokerThread, sockets: list[socket.socket]
) -> None:
    sock = open_socket(broker.port, sockets)
    sock.sendall(CONNECT)
    # 4 MiB of one header line, written whole while the broker refuses it after 8 KiB: without
    # the half-close and the reading that follows, this write fails with a reset.
    sock.sendall(b"SEND\ndestination:/queue/x\nlong:" + b"v" * (4096 * KIB))
    data = read_to_end(sock)
    error = error_of(data[data.index(b"\0") + 1 :])
    assert (error.headers["status"], error.headers["limit"]) == (
        "400",
        "imq.stomp.max_header_length",
    )


def test_a_client_that_goes_on_sending_is_cut_after_the_linger(
    broker: BrokerThread, sockets: list[socket.socket], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(connection, "CLOSE_LINGER_S", 0.5)
    sock = open_socket(broker.port, sockets)
    sock.sendall(b"CONNECT\ncontent-length:999999999\n\n")
    failure: list[OSError] = []

    def flood() -> None:
        chunk = b"x" * (64 * KIB)
        try:
            while True:
                sock.sendall(chunk)
        except OSError as exc:
            failure.append(exc)

    writer = threading.Thread(target=flood, daemon=True)
    writer.start()
    received = bytearray()
    try:
        while chunk := sock.recv(65536):
            received += chunk
    except ConnectionResetError:
        pass  # the linger ended with a reset: the ERROR had been read before it
    writer.join(10.0)
    assert failure, "the broker kept reading a client that never stops"
    assert error_of(bytes(received)).headers["status"] == "423"
    wait_connection_count(broker, 0)


def test_a_client_quiet_after_its_error_is_closed_without_waiting_the_linger(
    broker: BrokerThread,
) -> None:
    client = RawClient(broker.port)
    try:
        client.connect()
        client.send("NOPE")
        client.expect("ERROR")
        client.expect_closed()
        wait_connection_count(broker, 0)  # though this client keeps its socket open
    finally:
        client.close()


# -- over WebSocket -------------------------------------------------------------------------------


@pytest.fixture
def ws_broker(make_broker: BrokerFactory) -> BrokerThread:
    return make_broker({"imq.stomp.ws.port": "0", "imq.stomp.input.max_bytes": "256k"})


def ws_port(broker: BrokerThread) -> int:
    assert broker.services is not None
    return broker.services.addresses()["ws"][1]


def test_a_websocket_message_before_connect_is_refused_while_it_arrives(
    ws_broker: BrokerThread,
) -> None:
    ws = RawWebSocket(ws_port(ws_broker))
    try:
        ws.send_header(10 * 1024 * KIB)  # ten MiB announced: aiohttp would wait for them all
        ws.send_payload(b"CONNECT\n\n" + b"x" * (64 * KIB))
        error = ws.expect_stomp("ERROR")
        assert (error.headers["status"], error.headers["limit"]) == (
            "423",
            "imq.stomp.connect.max_frame_size",
        )
        assert error.headers["message"].startswith("frame too large before CONNECT")
        # Closed: with a normal close frame, or, when the close crossed the rest of our upload,
        # by the connection's end (test_hardening's probe says why). Never left open.
        assert ws.expect_close_or_reset() in (1000, None)
    finally:
        ws.close()
    wait_until(lambda: input_held(ws_broker) == 0)


def test_a_websocket_message_being_assembled_counts_toward_the_budget(
    ws_broker: BrokerThread,
) -> None:
    ws = RawWebSocket(ws_port(ws_broker))
    try:
        ws.send_frame(Frame("CONNECT", {"accept-version": "1.2", "heart-beat": "0,0"}))
        ws.expect_stomp("CONNECTED")
        ws.send_header(1024 * KIB)
        ws.send_payload(send_head(1000 * KIB) + b"x" * (100 * KIB))
        wait_until(lambda: input_held(ws_broker) >= 100 * KIB)  # held by aiohttp, counted
        ws.send_payload(b"x" * (200 * KIB))  # past imq.stomp.input.max_bytes
        error = ws.expect_stomp("ERROR")
        assert (error.headers["status"], error.headers["limit"]) == (
            "423",
            "imq.stomp.input.max_bytes",
        )
    finally:
        ws.close()
    wait_until(lambda: input_held(ws_broker) == 0)


def test_over_tls_the_error_reaches_a_client_still_sending(
    make_broker: BrokerFactory, tls_files: TlsFiles, sockets: list[socket.socket]
) -> None:
    """TLS has no half-close: the broker reads and drops what follows the ERROR, and closes
    once the client is done sending."""
    broker = make_broker(tls_files.properties({"imq.stomp.tls.port": "0"}))
    assert broker.services is not None
    plain = open_socket(broker.services.addresses()["stomp-tls"][1], sockets)
    sock = tls_files.client_context().wrap_socket(plain, server_hostname="127.0.0.1")
    sockets.append(sock)
    sock.sendall(CONNECT)
    sock.sendall(b"SEND\ndestination:/queue/x\nlong:" + b"v" * (4096 * KIB))
    data = read_to_end(sock)
    error = error_of(data[data.index(b"\0") + 1 :])
    assert (error.headers["status"], error.headers["limit"]) == (
        "400",
        "imq.stomp.max_header_length",
    )


def test_a_refused_websocket_client_that_goes_on_sending_is_dropped(
    ws_broker: BrokerThread,
) -> None:
    """After its ERROR, a client may send once more the most it may hold (here 256 KiB), not
    the rest of a 32 MiB message aiohttp would assemble (what it can send at all is that and
    what the sockets' buffers take)."""
    ws = RawWebSocket(ws_port(ws_broker))
    failure: list[OSError] = []

    def rest() -> None:
        try:
            for _ in range(512):
                ws.send_payload(b"x" * (64 * KIB))
        except OSError as exc:
            failure.append(exc)

    writer = threading.Thread(target=rest, daemon=True)
    try:
        ws.send_frame(Frame("CONNECT", {"accept-version": "1.2", "heart-beat": "0,0"}))
        ws.expect_stomp("CONNECTED")
        ws.send_header(32 * 1024 * KIB)
        ws.send_payload(b"SEND\ndestination:/queue/x\n\n" + b"x" * (300 * KIB))
        assert ws.expect_stomp("ERROR").headers["limit"] == "imq.stomp.input.max_bytes"
        writer.start()
        writer.join(10.0)
        assert failure, "the broker read all of a refused client's message"
    finally:
        ws.close()
    wait_until(lambda: input_held(ws_broker) == 0)
