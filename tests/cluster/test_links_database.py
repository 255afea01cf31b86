"""The links learn the members from the shared database: the operating rows of their cluster in
sluiceway_broker, on a real PostgreSQL, written here as the membership writes them."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from sluiceway.cluster.links import cluster_links
from sluiceway.cluster.peers import DatabasePeers, KeptConnection, Peer
from sluiceway.config import build_config
from sluiceway.persist.database import Database, DatabaseError
from sluiceway.persist.schema import ensure_schema
from sluiceway.testing import BrokerThread
from sluiceway.testing.postgres import free_port
from tests.cluster.links_support import Member, undelivered
from tests.cluster.test_links import QUEUE, bodies_of, consumer_at, produce_at
from tests.e2e.conftest import stomp_clients
from tests.e2e.support import wait_until

__all__ = ["stomp_clients"]  # a fixture

pytestmark = pytest.mark.timeout(90)

DELIVERY_WAIT = 30.0


def member_row(url: str, cluster: str, broker: str, state: str, address: str) -> None:
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute(
            "INSERT INTO sluiceway_broker (cluster_id, broker_id, state, stomp_address) "
            "VALUES (%s, %s, %s, %s) ON CONFLICT (cluster_id, broker_id) "
            "DO UPDATE SET state = EXCLUDED.state, stomp_address = EXCLUDED.stomp_address",
            (cluster, broker, state, address),
        )


def test_the_members_are_the_operating_others_of_the_cluster(
    pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    database = Database(pg_url)
    ensure_schema(database)
    member_row(pg_url, "c1", "a", "OPERATING", "10.0.0.1:61613")
    member_row(pg_url, "c1", "b", "OPERATING", "10.0.0.2:61613")  # this broker
    member_row(pg_url, "c1", "c", "FAILED", "10.0.0.3:61613")
    member_row(pg_url, "c1", "d", "OPERATING", "[::1]:7000")
    member_row(pg_url, "c1", "e", "OPERATING", "nowhere")
    member_row(pg_url, "c2", "f", "OPERATING", "10.0.0.6:61613")  # another cluster
    peers = DatabasePeers(database, "c1", "b")
    try:
        with caplog.at_level(logging.WARNING, "sluiceway.cluster.peers"):
            assert peers.current() == [
                Peer("a", "10.0.0.1", 61613),
                Peer("d", "::1", 7000),
            ]
            assert len(peers.current()) == 2
        # A member whose address cannot be read is told of once, not every interval.
        warned = [r.getMessage() for r in caplog.records]
        assert warned == [
            "not linking to a member: member e gives its STOMP address as "
            "'nowhere': expected host:port"
        ]
    finally:
        peers.close()


def test_a_database_that_cannot_be_reached_is_named_in_the_error() -> None:
    url = f"postgresql://sluiceway:secret@127.0.0.1:{free_port()}/nothing"
    peers = DatabasePeers(Database(url, connect_timeout=1.0), "c1", "b")
    with pytest.raises(DatabaseError) as refused:
        peers.current()
    assert "cannot reach the database postgresql://sluiceway@127.0.0.1" in str(refused.value)
    assert "secret" not in str(refused.value)


def test_links_follow_the_members_the_database_names(
    pg_url: str, make_broker: Callable[..., BrokerThread], stomp_clients: Callable[..., Any]
) -> None:
    database = Database(pg_url)
    ensure_schema(database)
    a = Member("a", make_broker())
    b = Member("b", make_broker())
    member_row(pg_url, "c1", "a", "OPERATING", f"127.0.0.1:{a.broker.port}")
    member_row(pg_url, "c1", "b", "OPERATING", f"127.0.0.1:{b.broker.port}")
    try:
        links = b.link_to(DatabasePeers(database, "c1", "b"))
        _, got = consumer_at(stomp_clients, b, a)
        bodies = produce_at(stomp_clients, a, 100, persistent="true")
        got.wait_messages(len(bodies), DELIVERY_WAIT)
        assert bodies_of(got) == bodies
        wait_until(lambda: undelivered(a, QUEUE) == 0)

        member_row(pg_url, "c1", "a", "FAILED", f"127.0.0.1:{a.broker.port}")
        wait_until(lambda: not b.call(lambda: dict(links.links)), DELIVERY_WAIT)
    finally:
        b.stop_links()


def test_a_broker_configured_as_a_member_links_to_the_others(
    pg_url: str, make_broker: Callable[..., BrokerThread], stomp_clients: Callable[..., Any]
) -> None:
    ensure_schema(Database(pg_url))
    a = Member("a", make_broker())
    b = Member("b", make_broker())
    member_row(pg_url, "c1", "a", "OPERATING", f"127.0.0.1:{a.broker.port}")
    config = build_config(
        {
            "imq.cluster.ha": "true",
            "imq.persist.store": "jdbc",
            "imq.persist.jdbc.postgresql.property.url": pg_url,
            "imq.brokerid": "b",
            "imq.cluster.clusterid": "c1",
            "imq.cluster.consumerFlowLimit": "25",
            "imq.cluster.heartbeat.interval": "0.4",
            "imq.cluster.monitor.interval": "0.2",
        }
    )
    core = b.broker.broker
    assert core is not None
    links = cluster_links(core, config, ("0.0.0.0", b.broker.port))  # noqa: S104  (no bind)
    assert links.settings.local_host == "127.0.0.1"
    assert links.settings.flow_limit == 25
    try:
        b.run(links)
        _, got = consumer_at(stomp_clients, b, a)
        bodies = produce_at(stomp_clients, a, 60, persistent="true")
        got.wait_messages(len(bodies), DELIVERY_WAIT)
        assert bodies_of(got) == bodies
        assert {frame.headers["sluiceway_via"] for frame in got.messages} == {"a"}
    finally:
        b.stop_links()


def test_a_closed_kept_connection_opens_no_other(pg_url: str) -> None:
    """The links close their database connections when they stop, maybe while a reading is on
    its way on another thread: that reading fails, and none opens a connection afterwards (one
    would outlive the broker)."""
    kept = KeptConnection(Database(pg_url))
    assert kept.run(lambda connection: connection.execute("SELECT 1").fetchone(), "read") == (1,)
    started, go_on = threading.Event(), threading.Event()
    outcome: list[BaseException | object] = []

    def slow(connection: Any) -> object:
        started.set()
        go_on.wait(10)
        return connection.execute("SELECT 2").fetchone()

    def reading() -> None:
        try:
            outcome.append(kept.run(slow, "read slowly"))
        except DatabaseError as error:
            outcome.append(error)

    reader = threading.Thread(target=reading)
    reader.start()
    assert started.wait(10)
    kept.close()
    go_on.set()
    reader.join(10)
    assert len(outcome) == 1
    assert isinstance(outcome[0], DatabaseError)
    with pytest.raises(DatabaseError, match="links have stopped"):
        kept.run(lambda connection: connection.execute("SELECT 3"), "read again")
    assert kept._connection is None
