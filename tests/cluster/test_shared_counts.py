"""Destination limits that hold for the cluster: two real brokers report their queues' counts
through a real PostgreSQL, and a queue's maxNumMsgs bounds the messages of both together."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from sluiceway.cluster.shared_counts import SharedCounts, exchange, forget_member
from sluiceway.naming import parse_destination
from sluiceway.persist.database import Database
from sluiceway.persist.schema import ensure_schema
from sluiceway.testing import BrokerThread
from tests.e2e.limits import assert_refused
from tests.e2e.stomppy import connect, end, sync, wait_until

pytestmark = pytest.mark.timeout(60)

LIMITED = {"imq.destination.queue.orders.maxNumMsgs": "10"}


def counts_for(broker: BrokerThread, database: Database, broker_id: str) -> SharedCounts:
    assert broker.broker is not None
    return SharedCounts(database, "c1", broker_id, broker.broker, broker.call, interval=0.2)


def send(port: int, count: int) -> tuple[Any, Any]:
    connection, recorder = connect(port)
    for n in range(count):
        connection.send("/queue/orders", f"m{n}", headers={"persistent": "true"})
    sync(connection, recorder)
    return connection, recorder


def test_a_queue_limit_counts_what_every_member_holds(pg_url: str) -> None:
    database = Database(pg_url)
    ensure_schema(database)
    with BrokerThread(LIMITED) as a, BrokerThread(LIMITED) as b:
        counts_a, counts_b = counts_for(a, database, "a"), counts_for(b, database, "b")
        producer_a, _ = send(a.port, 6)
        with psycopg.connect(pg_url) as connection:
            counts_a.round(connection)
            counts_b.round(connection)
        producer_b, recorder = send(b.port, 4)  # 6 + 4: the cluster's limit, not yet over it
        assert recorder.errors == []
        producer_b.send("/queue/orders", "over", headers={"persistent": "true"})
        recorder.wait_for(lambda: bool(recorder.errors))
        assert_refused(recorder.errors[0].headers, 414, "/queue/orders", "maxNumMsgs", "10")
        producer_a.disconnect()
        end(producer_b, recorder)


def test_the_exchange_runs_by_itself_and_a_takeover_forgets_the_failed_members_report(
    pg_url: str,
) -> None:
    database = Database(pg_url)
    ensure_schema(database)
    with BrokerThread(LIMITED) as a, BrokerThread(LIMITED) as b:
        counts_a, counts_b = counts_for(a, database, "a"), counts_for(b, database, "b")
        assert b.broker is not None
        registry = b.broker.registry

        def remote_at_b() -> int:
            queue = registry.get(parse_destination("/queue/orders"))
            return queue.remote_count if queue is not None else 0

        counts_a.start()
        counts_b.start()
        try:
            producer, _ = send(a.port, 3)
            wait_until(lambda: b.call(remote_at_b) == 3)
        finally:
            counts_a.stop()
            counts_b.stop()
        with psycopg.connect(pg_url) as connection:
            assert exchange(connection, "c1", "x", {}) == {"/queue/orders": (3, 6)}
            forget_member(connection, "c1", "a")
            connection.commit()
            assert exchange(connection, "c1", "x", {}) == {}
        producer.disconnect()
