"""Pipeline readers as consumers of their destination, with their lag, over the wire.

A real broker on port 0 and the real pipeline client: a cursor group on a topic and a lease
group on a queue each take part of what was published; the admin API (`/readers`, a
destination's summary and detail) and /metrics (parsed by the Prometheus client's own parser)
must say how many messages each has not taken, exactly, and how old the oldest is, within the
time the test measured around the request.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any, Final

import pytest
from prometheus_client.parser import text_string_to_metric_families

from sluiceway.client.pipeline import OutgoingMessage, PipelineConnection, PipelineSettings
from sluiceway.testing import BrokerThread
from tests.admin.adminhttp import AdminHttp
from tests.e2e.support import wait_until

TOPIC: Final = "/topic/clicks"
QUEUE: Final = "/queue/orders"
SENT: Final = 10
COMMITTED: Final = 4  # the cursor takes the first four
ACKNOWLEDGED: Final = 4  # the lease group's first lease, acknowledged
LEASED: Final = 3  # its second, open


@pytest.fixture
def pipeline(broker: BrokerThread) -> Iterator[PipelineConnection]:
    with PipelineConnection(PipelineSettings(port=broker.port, timeout=10)) as connection:
        yield connection


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def send(connection: PipelineConnection, destination: str) -> None:
    connection.send_many(OutgoingMessage(destination, b"m%d" % i) for i in range(SENT))


def timestamps(connection: PipelineConnection, topic: str) -> dict[int, int]:
    """The broker's timestamp of each message the topic retains, by sequence number."""
    head = connection.head(topic)
    read = connection.read_range(topic, head.first_sequence or 0, None)
    return {m.sequence: int(m.headers["timestamp"]) for m in read}


def drain(connection: PipelineConnection) -> tuple[int, int]:
    """Make the two readers take part of what was sent; return the timestamps of the oldest
    message each has not taken (the cursor's, the lease group's)."""
    opened = connection.open_cursor(TOPIC, "spark", "latest")
    assert opened.cursor_sequence is not None
    start = opened.cursor_sequence
    send(connection, TOPIC)
    send(connection, QUEUE)
    topic_times = timestamps(connection, TOPIC)
    connection.commit_cursor(TOPIC, "spark", start + COMMITTED)
    first = list(connection.read_lease(QUEUE, "etl/1", max_messages=ACKNOWLEDGED))
    connection.ack_lease(QUEUE, "etl/1")
    second = list(connection.read_lease(QUEUE, "etl/2", max_messages=LEASED))
    assert (len(first), len(second)) == (ACKNOWLEDGED, LEASED)
    return topic_times[start + COMMITTED], int(second[0].headers["timestamp"])


def test_readers_show_in_the_admin_api_with_their_lag(
    broker: BrokerThread, pipeline: PipelineConnection
) -> None:
    cursor_oldest, lease_oldest = drain(pipeline)
    wait_until(lambda: now_ms() > max(cursor_oldest, lease_oldest) + 5)  # a measurable age
    http = AdminHttp(broker.admin_port)
    before = now_ms()
    readers = http.ok("GET", "/readers")
    after = now_ms()
    assert [(r["destination"], r["kind"], r["group"]) for r in readers] == [
        (QUEUE, "lease-group", "etl"),
        (TOPIC, "cursor-group", "spark"),
    ]
    lease, cursor = readers
    assert cursor["lag_messages"] == SENT - COMMITTED
    assert (cursor["open_leases"], cursor["leased_messages"]) == (None, None)
    assert cursor["position"] == COMMITTED + 1  # the topic's sequence numbers start at 1
    assert lease["lag_messages"] == SENT - ACKNOWLEDGED  # waiting, and its open lease's
    assert (lease["open_leases"], lease["leased_messages"], lease["position"]) == (1, LEASED, None)
    for reader, oldest in ((cursor, cursor_oldest), (lease, lease_oldest)):
        age_ms = reader["lag_seconds"] * 1000
        assert before - oldest - 1 <= age_ms <= after - oldest + 1, (reader, before, after)
        assert reader["lag_seconds"] > 0

    # Counted beside the consumers in the list of destinations, and detailed in each.
    summaries = {d["path"]: d for d in http.ok("GET", "/destinations")}
    for path in (QUEUE, TOPIC):
        assert (summaries[path]["consumers"], summaries[path]["pipeline_readers"]) == (0, 1)
    assert summaries["/queue/mq.sys.dmq"]["pipeline_readers"] == 0
    detail = http.ok("GET", "/destinations/queue/orders")
    (shown,) = detail["readers"]
    assert {k: shown[k] for k in ("group", "lag_messages", "open_leases")} == {
        "group": "etl",
        "lag_messages": SENT - ACKNOWLEDGED,
        "open_leases": 1,
    }

    # The lease acknowledged and the cursor committed to the head: nothing left, no age.
    pipeline.ack_lease(QUEUE, "etl/2")
    list(pipeline.read_lease(QUEUE, "etl/3"))  # takes the last three
    pipeline.ack_lease(QUEUE, "etl/3")
    pipeline.commit_cursor(TOPIC, "spark", SENT + 1)
    caught_up = {r["kind"]: r for r in http.ok("GET", "/readers")}
    for reader in caught_up.values():
        assert (reader["lag_messages"], reader["lag_seconds"]) == (0, 0.0), reader
    assert caught_up["lease-group"]["open_leases"] == 0


def scrape(port: int) -> dict[str, list[Any]]:
    status, body, _ = AdminHttp(port).raw("GET", "/metrics")
    assert status == 200
    return {f.name: f.samples for f in text_string_to_metric_families(body.decode())}


def test_prometheus_has_a_gauge_per_reader(
    broker: BrokerThread, pipeline: PipelineConnection
) -> None:
    cursor_oldest, lease_oldest = drain(pipeline)
    before = now_ms()
    metrics = scrape(broker.admin_port)
    after = now_ms()

    def gauge(name: str, destination: str, kind: str, group: str) -> float:
        found = [
            s.value
            for s in metrics[name]
            if s.labels == {"destination": destination, "kind": kind, "group": group}
        ]
        assert len(found) == 1, (name, metrics[name])
        return float(found[0])

    cursor = (TOPIC, "cursor-group", "spark")
    lease = (QUEUE, "lease-group", "etl")
    assert gauge("sluiceway_reader_lag_messages", *cursor) == SENT - COMMITTED
    assert gauge("sluiceway_reader_lag_messages", *lease) == SENT - ACKNOWLEDGED
    for labels, oldest in ((cursor, cursor_oldest), (lease, lease_oldest)):
        age_ms = gauge("sluiceway_reader_lag_seconds", *labels) * 1000
        assert before - oldest - 1 <= age_ms <= after - oldest + 1
    assert gauge("sluiceway_reader_open_leases", *lease) == 1
    assert gauge("sluiceway_reader_leased_messages", *lease) == LEASED
    # A cursor group has no leases: no such series for it.
    assert [s.labels["kind"] for s in metrics["sluiceway_reader_open_leases"]] == ["lease-group"]
