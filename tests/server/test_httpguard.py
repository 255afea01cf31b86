"""The time and count limits of the admin endpoint's and the WebSocket endpoint's connections
(server.httpguard), against a real broker over raw sockets."""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import aiohttp
import pytest

from sluiceway.server.httpguard import ConnectionGuard
from sluiceway.testing import BrokerThread
from tests.conftest import BrokerFactory
from tests.e2e.support import wait_until
from tests.security.webprobe import (
    TIMEOUT,
    closed_within,
    get_request,
    http_exchange,
    make_certificate,
    ws_handshake,
)
from tests.server.wsclient import WsStomp

HALF_HEAD = b"GET /api/v1/broker HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: sl"
SHORT = "300"  # ms: the timeouts under test


def admin_guard(broker: BrokerThread) -> ConnectionGuard:
    services = broker.services
    assert services is not None
    assert services.admin is not None
    return services.admin.guard


@pytest.fixture
def sockets() -> Iterator[ExitStack]:
    with ExitStack() as stack:
        yield stack


def connect(stack: ExitStack, port: int) -> socket.socket:
    return stack.enter_context(socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT))


def test_a_head_sent_in_pieces_within_the_timeout_is_served(
    make_broker: BrokerFactory, sockets: ExitStack
) -> None:
    broker = make_broker({"imq.admin.request.header_timeout": "5000"})
    sock = connect(sockets, broker.admin_port)
    request = get_request("/api/v1/broker", "127.0.0.1")
    for piece in (request[:10], request[10:30], request[30:]):
        sock.sendall(piece)
    answer = http_exchange(broker.admin_port, b"", sock=sock)
    assert answer.status == 200


def test_many_half_heads_are_closed_and_logged_once(
    make_broker: BrokerFactory, sockets: ExitStack, caplog: pytest.LogCaptureFixture
) -> None:
    broker = make_broker(
        {"imq.admin.request.header_timeout": SHORT, "imq.admin.max_connections": "100"}
    )
    held = []
    with caplog.at_level(logging.WARNING, logger="sluiceway.server.httpguard"):
        for _ in range(50):
            sock = connect(sockets, broker.admin_port)
            sock.sendall(HALF_HEAD)
            held.append(sock)
        deadline = time.monotonic() + TIMEOUT
        assert all(closed_within(sock, deadline) for sock in held)
        guard = admin_guard(broker)
        assert broker.call(lambda: guard.timed_out) == 50
        assert broker.call(lambda: len(guard.open)) == 0
    warnings = [r.getMessage() for r in caplog.records if "request line" in r.getMessage()]
    # One line for a burst: the first event; the others are counted in the next line.
    assert len(warnings) == 1
    assert "imq.admin.request.header_timeout" in warnings[0]
    assert "within 0.3 s" in warnings[0]
    # The endpoint still serves.
    assert (
        http_exchange(broker.admin_port, get_request("/api/v1/broker", "127.0.0.1")).status == 200
    )


def test_a_connection_that_sends_nothing_is_closed(
    make_broker: BrokerFactory, sockets: ExitStack
) -> None:
    broker = make_broker({"imq.admin.request.header_timeout": SHORT})
    sock = connect(sockets, broker.admin_port)
    assert closed_within(sock, time.monotonic() + TIMEOUT)


def test_the_next_request_on_a_kept_alive_connection_has_the_header_timeout(
    make_broker: BrokerFactory, sockets: ExitStack
) -> None:
    # The keep-alive timeout (30 s by default) is far beyond the wait: only the header timeout,
    # started by the second request's first bytes, can close the connection in time.
    broker = make_broker({"imq.admin.request.header_timeout": "1000"})
    sock = connect(sockets, broker.admin_port)
    for _ in range(3):  # each kept-alive request is served, however long the pause before it
        request = get_request("/api/v1/broker", "127.0.0.1", close=False)
        assert http_exchange(broker.admin_port, request, sock=sock).status == 200
    sent = time.monotonic()
    sock.sendall(HALF_HEAD)
    assert closed_within(sock, sent + TIMEOUT)
    assert time.monotonic() - sent >= 1.0


def test_an_idle_kept_alive_connection_is_closed(
    make_broker: BrokerFactory, sockets: ExitStack
) -> None:
    broker = make_broker({"imq.admin.keepalive.timeout": SHORT})
    sock = connect(sockets, broker.admin_port)
    request = get_request("/api/v1/broker", "127.0.0.1", close=False)
    sent = time.monotonic()  # the broker's clock starts after this, once it has answered
    assert http_exchange(broker.admin_port, request, sock=sock).status == 200
    assert closed_within(sock, sent + TIMEOUT)
    assert time.monotonic() - sent >= 0.3


def test_the_cap_counts_open_connections_only(
    make_broker: BrokerFactory, sockets: ExitStack, caplog: pytest.LogCaptureFixture
) -> None:
    broker = make_broker({"imq.admin.max_connections": "2"})
    guard = admin_guard(broker)
    request = get_request("/api/v1/broker", "127.0.0.1", close=False)
    with caplog.at_level(logging.WARNING, logger="sluiceway.server.httpguard"):
        for _ in range(3):  # two fill the cap, and are closed; then two more fit
            first, second = connect(sockets, broker.admin_port), connect(sockets, broker.admin_port)
            for sock in (first, second):
                assert http_exchange(broker.admin_port, request, sock=sock).status == 200
            with socket.create_connection(
                ("127.0.0.1", broker.admin_port), timeout=TIMEOUT
            ) as extra:
                answer = http_exchange(broker.admin_port, request, sock=extra)
            assert answer.status == 503
            assert b"imq.admin.max_connections" in answer.body
            first.close()
            second.close()
            wait_until(lambda: broker.call(lambda: len(guard.open)) == 0)
    assert broker.call(lambda: guard.refused) == 3
    refusals = [r.getMessage() for r in caplog.records if "was refused" in r.getMessage()]
    assert len(refusals) == 1
    assert "imq.admin.max_connections" in refusals[0]


def test_https_handshakes_and_heads_have_the_header_timeout(
    make_broker: BrokerFactory, sockets: ExitStack, tmp_path: Path
) -> None:
    certificate = make_certificate(tmp_path)
    broker = make_broker(
        {
            "imq.admin.tls": "true",
            "imq.admin.request.header_timeout": SHORT,
            **certificate.properties(),
        }
    )
    silent = connect(sockets, broker.admin_port)  # no ClientHello
    half = certificate.client_context().wrap_socket(
        connect(sockets, broker.admin_port), server_hostname="127.0.0.1"
    )
    sockets.enter_context(half)
    half.sendall(HALF_HEAD)
    deadline = time.monotonic() + TIMEOUT
    assert closed_within(silent, deadline)
    assert closed_within(half, deadline)
    whole = certificate.client_context().wrap_socket(
        connect(sockets, broker.admin_port), server_hostname="127.0.0.1"
    )
    sockets.enter_context(whole)
    answer = http_exchange(
        broker.admin_port, get_request("/api/v1/broker", "127.0.0.1"), sock=whole
    )
    assert answer.status == 200


# -- the WebSocket endpoint's handshake ---------------------------------------------------------


@pytest.fixture
def ws_broker(make_broker: BrokerFactory) -> BrokerThread:
    return make_broker({"imq.stomp.ws.port": "0", "imq.stomp.connect.timeout": SHORT})


def ws_port(broker: BrokerThread) -> int:
    assert broker.services is not None
    return broker.services.addresses()["ws"][1]


def test_a_half_sent_handshake_is_closed(ws_broker: BrokerThread, sockets: ExitStack) -> None:
    sock = connect(sockets, ws_port(ws_broker))
    sock.sendall(b"GET /stomp HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: webso")
    assert closed_within(sock, time.monotonic() + TIMEOUT)


def test_a_refused_handshake_does_not_keep_its_connection(
    ws_broker: BrokerThread, sockets: ExitStack
) -> None:
    sock = connect(sockets, ws_port(ws_broker))
    answer = http_exchange(
        ws_port(ws_broker), get_request("/nowhere", "127.0.0.1", close=False), sock=sock
    )
    assert answer.status == 404
    assert b"/ws" in answer.body
    assert closed_within(sock, time.monotonic() + TIMEOUT)


async def test_a_stomp_session_outlives_the_handshake_timeout(ws_broker: BrokerThread) -> None:
    port = ws_port(ws_broker)
    assert ws_handshake(port).status == 101
    async with aiohttp.ClientSession() as session:
        client = await WsStomp.open(session, f"http://127.0.0.1:{port}/ws")
        # Three times the handshake's time limit with nothing sent (heart-beats are off): a
        # pause on purpose, for a close that must not come.
        await asyncio.sleep(0.9)
        receipt = await client.request("SEND", {"destination": "/queue/later"}, b"still here")
        assert receipt.command == "RECEIPT"
        await client.close()


def test_a_head_too_large_is_refused(make_broker: BrokerFactory) -> None:
    broker = make_broker()
    many = "".join(f"X-Header-{i}: v\r\n" for i in range(65))
    request = f"GET /api/v1/broker HTTP/1.1\r\nHost: 127.0.0.1\r\n{many}\r\n".encode()
    assert http_exchange(broker.admin_port, request).status == 400
    long_line = get_request("/api/v1/broker", "127.0.0.1", X_Long="v" * 9000)
    assert http_exchange(broker.admin_port, long_line).status == 400
