"""Links and cluster-wide queue limits together: what a member delivered to another member's
link is counted there, not twice, so a queue at its limit still drains to consumers elsewhere,
and the cluster as a whole keeps to the limit."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sluiceway.cluster.shared_counts import SharedCounts
from sluiceway.persist.database import Database
from sluiceway.persist.schema import ensure_schema
from tests.cluster.links_support import Member, cluster
from tests.cluster.test_links import (
    Clients,
    Cluster,
    ack_each,
    consumer_at,
    produce_at,
)
from tests.e2e.conftest import stomp_clients
from tests.e2e.support import wait_until

__all__ = ["cluster", "stomp_clients"]  # fixtures

pytestmark = pytest.mark.timeout(120)

LIMIT = 10


@pytest.fixture
def counted(pg_url: str) -> Iterator[list[SharedCounts]]:
    """The counts exchanges the test starts, stopped after it."""
    ensure_schema(Database(pg_url))
    started: list[SharedCounts] = []
    yield started
    for counts in started:
        counts.stop()


def exchange_counts(pg_url: str, members: list[Member], started: list[SharedCounts]) -> None:
    for member in members:
        broker = member.broker.broker
        assert broker is not None
        counts = SharedCounts(
            Database(pg_url), "c1", member.broker_id, broker, member.call, interval=0.1
        )
        counts.start()
        started.append(counts)


@pytest.mark.parametrize("behavior", ["FLOW_CONTROL", "REJECT_NEWEST"])
def test_a_queue_at_the_clusters_limit_drains_to_a_consumer_on_another_member(
    cluster: Cluster,
    stomp_clients: Clients,
    pg_url: str,
    counted: list[SharedCounts],
    behavior: str,
) -> None:
    limited = {
        "imq.destination.queue.orders.maxNumMsgs": str(LIMIT),
        "imq.destination.queue.orders.limitBehavior": behavior,
    }
    a, b = cluster(2, properties={"a": limited, "b": limited})
    exchange_counts(pg_url, [a, b], counted)
    bodies = produce_at(stomp_clients, a, LIMIT, persistent="true")  # a is at the limit

    def remote_at_b() -> int:
        queue = b.destination("/queue/orders")
        return 0 if queue is None else b.call(lambda: queue.remote_count)

    wait_until(lambda: remote_at_b() == LIMIT)  # b knows the cluster's queue is full
    consumer, got = consumer_at(stomp_clients, b, a, "client-individual")
    assert ack_each(consumer, got, LIMIT) == bodies
    assert len(got.messages) == LIMIT
