"""A durable subscriber moving between members of a cluster: broker processes on a real
PostgreSQL, stomp.py clients. It gets on another member what its subscription kept on the first,
each message once; when the member its subscription lives on is killed, the subscription is
taken over with the store and the subscriber, still attached elsewhere, goes on getting it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from sluiceway.cluster.durable_link import TOPIC_HEADER
from sluiceway.testing import BrokerProcess
from tests.cli.support import get, wait_until
from tests.cluster.members import start_member
from tests.cluster.test_links_durable import take
from tests.e2e.stomppy import Recorder, connect, subscribe, sync

pytestmark = pytest.mark.timeout(150)

TOPIC = "/topic/audit.trail"
CLIENT = "auditor"
NAME = "trail"
WAIT = 40.0  # seconds for messages to cross, or a takeover to end, on a loaded machine


@pytest.fixture
def clients() -> Iterator[list[Any]]:
    made: list[Any] = []
    yield made
    for connection in made:
        if connection.is_connected():
            connection.disconnect()


def attach(made: list[Any], member: BrokerProcess) -> tuple[Any, Recorder]:
    connection, recorder = connect(member.port, **{"client-id": CLIENT})
    made.append(connection)
    subscribe(
        connection, recorder, TOPIC, "s", ack="client-individual", durable_subscription_name=NAME
    )
    return connection, recorder


def publish(made: list[Any], member: BrokerProcess, bodies: list[str]) -> None:
    producer, sent = connect(member.port)
    made.append(producer)
    for body in bodies:
        producer.send(TOPIC, body, headers={"persistent": "true"})
    sync(producer, sent)
    producer.disconnect()


def homes(member: BrokerProcess) -> dict[tuple[str, str], str]:
    """Where `member` reads that the cluster's durable subscriptions live."""
    view = get(member.admin_port, "/cluster")
    return {(d["client_id"], d["name"]): d["broker_id"] for d in view["durables"]}


def test_a_durable_subscriber_moves_members_and_survives_its_homes_death(
    pg_url: str, clients: list[Any]
) -> None:
    with start_member(pg_url, "a") as a, start_member(pg_url, "b") as b:
        first, _ = attach(clients, a)
        first.disconnect()
        wait_until(lambda: homes(b) == {(CLIENT, NAME): "a"}, timeout=WAIT, what="b knows")
        kept = [f"kept{i}" for i in range(30)]
        publish(clients, a, kept[:15])
        publish(clients, b, kept[15:])

        moved, got = attach(clients, b)
        bodies = take(moved, got, 30)
        assert sorted(bodies) == sorted(kept)
        assert {frame.headers[TOPIC_HEADER] for frame in got.messages} == {TOPIC}
        assert homes(a) == homes(b) == {(CLIENT, NAME): "a"}  # one subscription, on a

        a.kill()  # kill -9: b takes a's store over, and the subscription with it
        wait_until(lambda: homes(b) == {(CLIENT, NAME): "b"}, timeout=WAIT, what="taken over")
        after = [f"after{i}" for i in range(20)]
        publish(clients, b, after)
        rest = take(moved, got, 50, 30)
        # Whatever a had handed over and not seen acknowledged comes again, flagged; every
        # message published after arrives, none that was acknowledged comes back unflagged.
        fresh = [f.body for f in got.messages[30:] if f.headers.get("redelivered") != "true"]
        assert sorted(set(rest) - set(kept)) == sorted(after)
        assert not set(fresh) & set(kept)
