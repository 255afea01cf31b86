"""Durable subscriptions across members: a subscriber that attaches on another member than the
one its subscription lives on gets what the subscription kept, and what it gets from then on,
each message once. Real brokers on real sockets, linked by the test with a static list of
members and a record of durable subscriptions shared in memory; stomp.py clients."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from sluiceway.cluster.durable_link import TOPIC_HEADER
from sluiceway.cluster.durables import durable_queue
from sluiceway.core.model.topic import Topic
from sluiceway.naming import parse_destination
from tests.cluster.links_support import Member, cluster, received, undelivered
from tests.e2e.conftest import stomp_clients
from tests.e2e.stomppy import Recorder, subscribe, sync, with_receipt
from tests.e2e.support import wait_until

__all__ = ["cluster", "stomp_clients"]  # fixtures

pytestmark = pytest.mark.timeout(120)

Cluster = Callable[..., list[Member]]
Clients = Callable[..., tuple[Any, Recorder]]
TOPIC = "/topic/prices"
CLIENT = "auditor"
NAME = "audit"
DURABLE = {"durable_subscription_name": NAME}
DELIVERY_WAIT = 30.0  # seconds for every message to cross, on a loaded machine


def publish(clients: Clients, member: Member, bodies: list[str]) -> None:
    producer, sent = clients(member.broker.port)
    for body in bodies:
        producer.send(TOPIC, body)
    sync(producer, sent)


def attach(
    clients: Clients, member: Member, ack: str = "client-individual", **headers: str
) -> tuple[Any, Recorder]:
    """The subscriber of durable subscription NAME of client CLIENT, attached at `member`."""
    connection, recorder = clients(member.broker.port, **{"client-id": CLIENT})
    subscribe(connection, recorder, TOPIC, "s", ack=ack, **DURABLE, **headers)
    return connection, recorder


def created(clients: Clients, home: Member, *others: Member) -> None:
    """The subscription made on `home` by its subscriber, who then left; `others` know."""
    first, _ = attach(clients, home)
    for member in others:
        knows(member, home.broker_id)
    first.disconnect()


def knows(member: Member, home: str) -> None:
    """Wait until `member` reads from the record that the subscription lives on `home`."""
    links = member.links
    assert links is not None
    wait_until(lambda: member.call(lambda: links.directory.home((CLIENT, NAME))) == home, 10.0)


def has_durable(member: Member) -> bool:
    broker = member.broker.broker
    assert broker is not None
    return member.call(lambda: (CLIENT, NAME) in broker.durables)


def durable_links(member: Member) -> int:
    links = member.links
    assert links is not None
    return member.call(lambda: len(links.durable_links))


def take(connection: Any, recorder: Recorder, count: int, start: int = 0) -> list[str]:
    """Messages `start` to `count` (exclusive), each acknowledged; their bodies."""
    frames = recorder.wait_messages(count, DELIVERY_WAIT)[start:count]
    for frame in frames:
        connection.ack(frame.headers["ack"])
    sync(connection, recorder)
    return [frame.body for frame in frames]


def test_a_subscriber_on_another_member_gets_what_its_subscription_kept_once(
    cluster: Cluster, stomp_clients: Clients
) -> None:
    a, b = cluster(2)
    created(stomp_clients, a, b)
    kept_at_a = [f"a{i}" for i in range(40)]
    kept_from_b = [f"b{i}" for i in range(40)]
    publish(stomp_clients, a, kept_at_a)
    publish(stomp_clients, b, kept_from_b)  # reaches the subscription on a through a's link
    wait_until(lambda: received(a, TOPIC) == 80, DELIVERY_WAIT)

    moved, got = attach(stomp_clients, b)
    bodies = take(moved, got, 80)
    assert sorted(bodies) == sorted(kept_at_a + kept_from_b)
    assert [body for body in bodies if body.startswith("a")] == kept_at_a  # in order per home
    assert [body for body in bodies if body.startswith("b")] == kept_from_b
    assert {frame.headers[TOPIC_HEADER] for frame in got.messages} == {TOPIC}
    # One subscription in the cluster: it lives on a, b made none of its own.
    assert has_durable(a)
    assert not has_durable(b)

    later = [f"later{i}" for i in range(20)]
    publish(stomp_clients, a, later[:10])
    publish(stomp_clients, b, later[10:])
    assert sorted(take(moved, got, 100, 80)) == sorted(later)
    moved.disconnect()
    wait_until(lambda: not durable_links(b), DELIVERY_WAIT)

    # Back home: the subscription gives what came since, and nothing it gave on b.
    back_home = [f"home{i}" for i in range(10)]
    publish(stomp_clients, b, back_home)
    home, again = attach(stomp_clients, a)
    assert take(home, again, 10) == back_home
    home.disconnect()
    assert len(again.messages) == 10


def test_the_subscriber_takes_what_its_window_allows_and_the_rest_waits_at_home(
    cluster: Cluster, stomp_clients: Clients
) -> None:
    a, b = cluster(2, flow_limit=10)
    created(stomp_clients, a, b)
    publish(stomp_clients, a, [f"m{i}" for i in range(100)])
    slow, got = attach(stomp_clients, b, ack="client", **{"consumer-flow-limit": "5"})
    got.wait_messages(5, DELIVERY_WAIT)
    queue = durable_queue(CLIENT, NAME).path
    # What crossed is the subscriber's window and at most one link window: the rest waits on a.
    wait_until(lambda: undelivered(a, TOPIC) + undelivered(b, queue) >= 95 - 10, DELIVERY_WAIT)
    assert undelivered(b, queue) <= 10
    assert len(got.messages) == 5
    slow.disconnect()


def test_a_second_subscriber_of_the_subscription_is_refused(
    cluster: Cluster, stomp_clients: Clients
) -> None:
    a, b = cluster(2)
    created(stomp_clients, a, b)
    attach(stomp_clients, b)
    other, recorder = stomp_clients(b.broker.port, **{"client-id": CLIENT})
    other.subscribe(TOPIC, "s2", ack="auto", headers={"durable-subscription-name": NAME})
    recorder.wait_for(lambda: bool(recorder.errors), DELIVERY_WAIT)
    assert "already has a subscriber attached" in recorder.errors[0].body


def test_ending_the_subscription_on_another_member_ends_it_at_home(
    cluster: Cluster, stomp_clients: Clients
) -> None:
    a, b = cluster(2)
    created(stomp_clients, a, b)
    publish(stomp_clients, a, ["kept"])
    moved, got = attach(stomp_clients, b)
    assert take(moved, got, 1) == ["kept"]
    with_receipt(
        got,
        lambda receipt: moved.unsubscribe(
            "s", headers={"durable-subscription-name": NAME, "receipt": receipt}
        ),
    )
    wait_until(lambda: not has_durable(a), DELIVERY_WAIT)
    assert b.destination(durable_queue(CLIENT, NAME).path) is None
    # Nothing keeps the topic's messages for it any more, anywhere.
    publish(stomp_clients, a, ["after"])
    wait_until(lambda: not undelivered(a, TOPIC), DELIVERY_WAIT)
    moved.disconnect()


def test_what_a_subscriber_left_unacknowledged_on_a_member_follows_it_to_the_next(
    cluster: Cluster, stomp_clients: Clients
) -> None:
    a, b, c = cluster(3)
    created(stomp_clients, a, b, c)
    bodies = [f"m{i}" for i in range(10)]
    publish(stomp_clients, a, bodies)
    left, got = attach(stomp_clients, b, ack="client")
    got.wait_messages(10, DELIVERY_WAIT)
    left.disconnect()  # none acknowledged: they wait in b's queue, a let go of them
    queue = durable_queue(CLIENT, NAME).path
    wait_until(lambda: undelivered(b, queue) == 10, DELIVERY_WAIT)

    later = [f"later{i}" for i in range(5)]
    publish(stomp_clients, a, later)
    moved, again = attach(stomp_clients, c)
    taken = take(moved, again, 15)
    assert sorted(taken) == sorted(bodies + later)
    wait_until(lambda: undelivered(b, queue) == 0, DELIVERY_WAIT)
    moved.disconnect()


def test_a_subscription_made_on_two_members_at_once_is_reported(
    cluster: Cluster, stomp_clients: Clients, caplog: pytest.LogCaptureFixture
) -> None:
    a, b = cluster(2)
    created(stomp_clients, a, b)
    # As if its subscriber had attached on b before b read the record: b made its own.
    broker = b.broker.broker
    assert broker is not None
    topic = b.call(lambda: broker.registry.resolve(parse_destination(TOPIC)))
    assert isinstance(topic, Topic)
    b.call(lambda: broker.durable_state(topic, CLIENT, NAME, None))
    assert has_durable(a)
    assert has_durable(b)

    def reported() -> bool:
        return any("exists here and on member a" in r.getMessage() for r in caplog.records)

    wait_until(reported, DELIVERY_WAIT)
