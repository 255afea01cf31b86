"""Connection counts end to end: in all and per address, over TCP, TLS and WebSocket together;
what a refused client reads, and the metrics that count it."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import stomp
from prometheus_client.parser import text_string_to_metric_families

from sluiceway.testing import BrokerThread
from tests.admin.adminhttp import AdminHttp
from tests.conftest import BrokerFactory
from tests.e2e.rawclient import RawClient
from tests.e2e.stomppy import Recorder
from tests.e2e.support import wait_connection_count, wait_until
from tests.server.conftest import TlsFiles
from tests.server.rawws import RawWebSocket

MAX_CONNECTIONS = "imq.stomp.max_connections"
PER_ADDRESS = "imq.stomp.max_connections_per_address"


@pytest.fixture
def clients() -> Iterator[list[RawClient]]:
    """Raw clients a test opens (unconnected); all are closed after it."""
    opened: list[RawClient] = []
    yield opened
    for client in opened:
        client.close()


def open_client(port: int, opened: list[RawClient]) -> RawClient:
    client = RawClient(port)
    opened.append(client)
    return client


def refusal(client: RawClient) -> dict[str, str]:
    """The ERROR a refused connection reads before anything is sent, then the close."""
    error = client.expect("ERROR")
    client.expect_closed()
    return {**error.headers, "body": error.body.decode()}


def counted(broker: BrokerThread) -> tuple[int, int]:
    """Connections open in all, and the most from one address, as the broker counts them."""
    assert broker.broker is not None
    counts = broker.broker.connection_counts
    return broker.call(lambda: (counts.total, counts.most_per_address))


def test_one_past_the_total_is_refused_before_connect(
    make_broker: BrokerFactory, clients: list[RawClient]
) -> None:
    broker = make_broker({MAX_CONNECTIONS: "2"})
    for _ in range(2):
        open_client(broker.port, clients).connect()
    refused = refusal(open_client(broker.port, clients))
    assert refused["status"] == "414"
    assert refused["message"] == "too many connections (imq.stomp.max_connections)"
    assert (refused["limit"], refused["limit-value"]) == (MAX_CONNECTIONS, "2")
    assert "raise imq.stomp.max_connections" in refused["body"]
    assert counted(broker) == (2, 2)
    clients[0].close()
    wait_until(lambda: counted(broker) == (1, 1))
    open_client(broker.port, clients).connect()  # room again


def test_stomp_py_hears_why_it_was_refused(make_broker: BrokerFactory) -> None:
    broker = make_broker({PER_ADDRESS: "1"})
    first = RawClient(broker.port)
    connection = stomp.Connection12([("127.0.0.1", broker.port)])
    recorder = Recorder()
    connection.set_listener("recorder", recorder)
    try:
        first.connect()
        # The ERROR comes before stomp.py has sent its CONNECT, and the end of the stream right
        # after it: stomp.py fails the connect, or, when its reader saw the end first and closed
        # the socket, the send of its CONNECT.
        with pytest.raises((stomp.exception.StompException, OSError)):
            connection.connect(wait=True)
        recorder.wait_for(lambda: bool(recorder.errors))
        (error,) = recorder.errors
        assert error.headers["message"] == (
            "too many connections from 127.0.0.1 (imq.stomp.max_connections_per_address)"
        )
        assert error.headers["limit"] == PER_ADDRESS
    finally:
        connection.disconnect()
        first.close()


def test_every_stomp_service_counts_toward_the_same_limits(
    make_broker: BrokerFactory, tls_files: TlsFiles, clients: list[RawClient]
) -> None:
    broker = make_broker(
        tls_files.properties(
            {"imq.stomp.ws.port": "0", "imq.stomp.tls.port": "0", PER_ADDRESS: "2"}
        )
    )
    assert broker.services is not None
    addresses = broker.services.addresses()
    open_client(broker.port, clients).connect()
    ws = RawWebSocket(addresses["ws"][1])
    try:
        wait_until(lambda: counted(broker) == (2, 2))  # the WebSocket one counts too
        # Over TLS: the ERROR, then TLS's own close.
        secure = open_client(addresses["stomp-tls"][1], clients)
        secure.sock = tls_files.client_context().wrap_socket(
            secure.sock, server_hostname="127.0.0.1"
        )
        assert refusal(secure)["limit"] == PER_ADDRESS
        ws.close()
        wait_until(lambda: counted(broker) == (1, 1))
        # Over WebSocket: the ERROR as a message, then a close frame.
        open_client(broker.port, clients).connect()
        refused_ws = RawWebSocket(addresses["ws"][1])
        try:
            error = refused_ws.expect_stomp("ERROR")
            assert (error.headers["status"], error.headers["limit"]) == ("414", PER_ADDRESS)
            assert refused_ws.expect_close() == 1000
        finally:
            refused_ws.close()
    finally:
        ws.close()
    assert counted(broker) == (2, 2)


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(broker: BrokerThread) -> Samples:
    """Every sample of /metrics, by name and sorted labels."""
    status, body, _ = AdminHttp(broker.admin_port).raw("GET", "/metrics")
    assert status == 200
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(body.decode())
        for sample in family.samples
    }


def test_metrics_count_connections_input_and_refusals(
    make_broker: BrokerFactory, clients: list[RawClient]
) -> None:
    broker = make_broker({MAX_CONNECTIONS: "3", "imq.stomp.input.max_bytes": "64k"})
    for _ in range(2):
        open_client(broker.port, clients).connect()
    stalled = clients[0]
    stalled.send_bytes(b"SEND\ndestination:/queue/m\n\n" + b"x" * 30_000)  # its NUL to come
    too_big = open_client(broker.port, clients)
    too_big.connect()
    too_big.send_bytes(b"SEND\ndestination:/queue/m\n\n" + b"x" * 70_000)
    assert refusal(too_big)["limit"] == "imq.stomp.input.max_bytes"
    wait_connection_count(broker, 2)
    open_client(broker.port, clients).connect()  # the third of three
    assert refusal(open_client(broker.port, clients))["limit"] == MAX_CONNECTIONS

    metrics = scrape(broker)
    held = metrics[("sluiceway_input_buffered_bytes", ())]
    assert 30_000 < held < 31_000  # the stalled SEND's head and body so far
    assert metrics[("sluiceway_memory_bytes", (("kind", "input"),))] == held
    assert metrics[("sluiceway_input_limit_bytes", ())] == 160 * 1024 * 1024 // 4
    assert metrics[("sluiceway_connections_open", ())] == 3
    assert metrics[("sluiceway_connections_per_address_max", ())] == 3

    def refused(limit: str) -> float:
        key = (("limit", limit), ("service", "stomp"))
        return float(metrics[("sluiceway_connections_refused_total", key)])

    assert refused(MAX_CONNECTIONS) == 1
    assert refused("imq.stomp.input.max_bytes") == 1
    assert refused(PER_ADDRESS) == refused("imq.stomp.connect.max_frame_size") == 0

    status, body, _ = AdminHttp(broker.admin_port).raw("GET", "/api/v1/metrics/services")
    assert status == 200
    (service,) = json.loads(body)
    assert service["input_bytes"] == held
    assert service["per_address_max"] == 3
    assert service["refused"][MAX_CONNECTIONS] == 1
    assert service["refused"]["imq.stomp.input.max_bytes"] == 1
