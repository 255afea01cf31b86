"""The bounded counts in the metrics: /metrics (parsed by the Prometheus client's own parser),
the broker's JSON (`query bkr`) and a destination's trend (`metrics dst`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from sluiceway.testing import BrokerThread
from tests.admin.adminhttp import AdminHttp
from tests.admin.test_metrics import scrape, value
from tests.conftest import BrokerFactory
from tests.e2e.rawclient import RawClient
from tests.e2e.reading import read_cursor, read_lease, send

LIMITS = {
    "imq.stomp.max_transactions": "2",
    "imq.stomp.transactions.max_messages": "3",
    "imq.stomp.transactions.max_bytes": "100",
    "imq.cursor.max_groups": "2",
    "imq.lease.max_groups": "1",
}


@pytest.fixture
def connect(broker: BrokerThread) -> Iterator[Callable[[], RawClient]]:
    """Raw clients of `broker`, connected with failed receipts; all closed after the test."""
    made: list[RawClient] = []

    def make() -> RawClient:
        client = RawClient(broker.port)
        made.append(client)
        client.connect(failed_receipts="true")
        return client

    yield make
    for client in made:
        client.close()


@pytest.fixture
def broker(make_broker: BrokerFactory) -> BrokerThread:
    return make_broker(LIMITS)


def refused(client: RawClient, command: str, headers: dict[str, str], body: bytes = b"") -> str:
    """Send a frame that must be refused; the property its failed RECEIPT names."""
    receipt = client.request(command, headers, body)
    assert receipt.headers.get("status") == "414", receipt
    return receipt.headers["limit"]


def test_each_limit_shows_its_value_highest_count_and_refusals(
    broker: BrokerThread, connect: Callable[[], RawClient]
) -> None:
    producer, reader = connect(), connect()
    for tx in ("t1", "t2"):
        producer.request("BEGIN", {"transaction": tx})
    assert refused(producer, "BEGIN", {"transaction": "t3"}) == "imq.stomp.max_transactions"
    send_in = {"destination": "/queue/q", "transaction": "t1"}
    producer.request("SEND", send_in, b"x" * 60)
    assert refused(producer, "SEND", send_in, b"y" * 60) == "imq.stomp.transactions.max_bytes"
    producer.request("SEND", send_in, b"z")
    producer.request("SEND", {**send_in, "transaction": "t2"}, b"z")
    assert refused(producer, "SEND", send_in, b"z") == "imq.stomp.transactions.max_messages"
    read_cursor(reader, "/topic/t", "a")
    read_cursor(reader, "/topic/t", "b")
    read_cursor(reader, "/topic/other", "a")
    cursor = {"destination": "/topic/t", "id": "c", "browser": "true", "cursor": "c"}
    assert refused(reader, "SUBSCRIBE", cursor) == "imq.cursor.max_groups"
    send(producer, "/queue/jobs", 1)
    read_lease(reader, "/queue/jobs", "g/1")
    lease = {"destination": "/queue/jobs", "id": "l", "lease": "h/1"}
    assert refused(reader, "SUBSCRIBE", lease) == "imq.lease.max_groups"
    assert refused(reader, "SUBSCRIBE", lease) == "imq.lease.max_groups"

    expected = {  # limit: (value, highest, refusals)
        "imq.stomp.max_transactions": (2, 2, 1),
        "imq.transaction.producer.maxNumMsgs": (1000, 2, 0),
        "imq.stomp.transactions.max_messages": (3, 3, 1),
        "imq.stomp.transactions.max_bytes": (100, 62, 1),
        "imq.cursor.max_groups": (2, 2, 1),
        "imq.lease.max_groups": (1, 1, 2),
    }
    metrics = scrape(broker)
    shown = {
        limit: (
            value(metrics["sluiceway_count_limit"], limit=limit),
            value(metrics["sluiceway_count_highest"], limit=limit),
            value(metrics["sluiceway_count_refusals"], limit=limit),
        )
        for limit in expected
    }
    assert shown == expected
    topic = {"destination": "/topic/t", "type": "topic"}
    assert value(metrics["sluiceway_destination_cursors"], **topic) == 2
    jobs = {"destination": "/queue/jobs", "type": "queue"}
    assert value(metrics["sluiceway_destination_lease_groups"], **jobs) == 1

    admin = AdminHttp(broker.admin_port)
    counts = {row["limit"]: row for row in admin.ok("GET", "/broker")["counts"]}
    assert {
        limit: (row["value"], row["highest"], row["refused"]) for limit, row in counts.items()
    } == expected
    assert counts["imq.lease.max_groups"]["per"] == "queue"
    assert counts["imq.stomp.transactions.max_bytes"]["per"] == "connection"
    assert admin.ok("GET", "/metrics/broker")["counts"] == list(counts.values())
    trend = admin.ok("GET", "/metrics/destinations/topic/t")
    assert (trend["cursors"], trend["lease_groups"]) == (2, 0)
    trend = admin.ok("GET", "/metrics/destinations/queue/jobs")
    assert (trend["cursors"], trend["lease_groups"]) == (0, 1)

    # What transactions hold is released with them: the highest counts fall back.
    producer.request("ABORT", {"transaction": "t1"})
    producer.request("COMMIT", {"transaction": "t2"})
    metrics = scrape(broker)
    for limit in ("imq.stomp.max_transactions", "imq.stomp.transactions.max_messages"):
        assert value(metrics["sluiceway_count_highest"], limit=limit) == 0
    assert value(metrics["sluiceway_count_refusals"], limit=limit) == 1
