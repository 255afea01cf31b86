"""Messages across the members of a cluster: real brokers on real sockets, linked by the test
with a static list of members, and stomp.py clients."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from sluiceway.cluster.demand import link_client_id
from sluiceway.cluster.peers import Peer, StaticPeers
from sluiceway.testing import BrokerProcess, BrokerThread
from tests.cluster.links_support import Member, cluster, received, undelivered
from tests.e2e.conftest import stomp_clients
from tests.e2e.stomppy import Recorder, subscribe, sync
from tests.e2e.support import wait_until

__all__ = ["cluster", "stomp_clients"]  # fixtures

pytestmark = pytest.mark.timeout(90)

Cluster = Callable[..., list[Member]]
Clients = Callable[..., tuple[Any, Recorder]]
QUEUE = "/queue/orders"
TOPIC = "/topic/prices"
DELIVERY_WAIT = 30.0  # seconds for every message to cross, on a loaded machine


def send_all(
    connection: Any, recorder: Recorder, bodies: list[str], to: str = QUEUE, **headers: str
) -> None:
    """Send `bodies` in order and wait until the broker has accepted every one."""
    for body in bodies:
        connection.send(to, body, headers=headers)
    sync(connection, recorder)


def ack_each(consumer: Any, got: Recorder, count: int) -> list[str]:
    """Acknowledge the first `count` messages as they come; their bodies."""
    bodies: list[str] = []
    while len(bodies) < count:
        done = len(bodies)
        got.wait_messages(done + 1, DELIVERY_WAIT)
        frame = got.messages[done]
        consumer.ack(frame.headers["ack"])
        bodies.append(frame.body)
    return bodies


def bodies_of(recorder: Recorder) -> list[str]:
    return [frame.body for frame in list(recorder.messages)]


def consumer_at(
    clients: Clients, member: Member, home: Member, ack: str = "auto", **headers: str
) -> tuple[Any, Recorder]:
    """A stomp.py consumer of QUEUE at `member`, once its link to `home` carries the queue."""
    connection, recorder = clients(member.broker.port)
    subscribe(connection, recorder, QUEUE, "s", ack=ack, **headers)
    member.wait_routes(home.broker_id, {QUEUE})
    return connection, recorder


def produce_at(clients: Clients, member: Member, count: int, **headers: str) -> list[str]:
    """`count` messages sent to QUEUE at `member`; their bodies, in order."""
    producer, sent = clients(member.broker.port)
    bodies = [f"m{i}" for i in range(count)]
    send_all(producer, sent, bodies, **headers)
    return bodies


def test_a_queue_crosses_to_a_consumer_on_another_member_once_and_in_order(
    cluster: Cluster, stomp_clients: Clients
) -> None:
    a, b = cluster(2)
    _, got = consumer_at(stomp_clients, b, a)
    bodies = produce_at(stomp_clients, a, 300, persistent="true", priority="4", flavour="mint")

    got.wait_messages(len(bodies), DELIVERY_WAIT)
    assert bodies_of(got) == bodies
    first = got.messages[0].headers
    assert first["sluiceway_via"] == "a"
    assert first["persistent"] == "true"
    assert first["priority"] == "4"
    assert first["flavour"] == "mint"  # the producer's headers cross with the message
    assert first["sluiceway_origin_id"] != first["message-id"]
    wait_until(lambda: undelivered(a, QUEUE) == 0)
    assert received(b, QUEUE) == len(bodies)


def test_non_persistent_messages_cross_too(cluster: Cluster, stomp_clients: Clients) -> None:
    a, b = cluster(2)
    _, got = consumer_at(stomp_clients, b, a, "client-individual")
    bodies = produce_at(stomp_clients, a, 50, persistent="false")

    got.wait_messages(len(bodies), DELIVERY_WAIT)
    assert bodies_of(got) == bodies
    assert {frame.headers["persistent"] for frame in got.messages} == {"false"}


def test_consumers_on_two_members_share_a_queue_each_message_once(
    cluster: Cluster, stomp_clients: Clients
) -> None:
    a, b = cluster(2)
    # The consumer here takes ten and holds them: the queue's other messages go to the link.
    here, got_here = consumer_at(stomp_clients, a, b, "client-individual", consumer_flow_limit="10")
    _, got_there = consumer_at(stomp_clients, b, a)
    bodies = produce_at(stomp_clients, a, 400, persistent="true")

    def total() -> int:
        return len(got_here.messages) + len(got_there.messages)

    wait_until(lambda: total() >= len(bodies), DELIVERY_WAIT)
    everything = Counter(bodies_of(got_here) + bodies_of(got_there))
    assert everything == Counter(bodies)  # each once in the cluster, none lost
    assert len(got_here.messages) == 10
    for frame in got_here.messages:
        here.ack(frame.headers["ack"])
    # Each consumer sees the single producer's order among the messages it gets.
    for recorder in (got_here, got_there):
        numbers = [int(body[1:]) for body in bodies_of(recorder)]
        assert numbers == sorted(numbers)


def test_a_topic_reaches_every_subscriber_on_every_member_once(
    cluster: Cluster, stomp_clients: Clients
) -> None:
    members = cluster(3)
    recorders = []
    for member in members:
        connection, recorder = stomp_clients(member.broker.port)
        subscribe(connection, recorder, TOPIC, "s", ack="auto")
        recorders.append(recorder)
    for member in members:
        for other in members:
            if other is not member:
                member.wait_routes(other.broker_id, {TOPIC})
    a, _, c = members
    from_a, sent_a = stomp_clients(a.broker.port)
    from_c, sent_c = stomp_clients(c.broker.port)
    bodies_a = [f"a{i}" for i in range(60)]
    bodies_c = [f"c{i}" for i in range(60)]
    send_all(from_a, sent_a, bodies_a, TOPIC)
    send_all(from_c, sent_c, bodies_c, TOPIC)

    for recorder in recorders:
        recorder.wait_messages(120, DELIVERY_WAIT)
        assert Counter(bodies_of(recorder)) == Counter(bodies_a + bodies_c)
    # Each member published each message once: its own, and one copy of every other's. A
    # message that bounced back would be published again.
    for member in members:
        assert received(member, TOPIC) == 120
    for recorder in recorders:
        assert len(recorder.messages) == 120


def test_a_durable_subscription_gets_what_another_member_published_while_it_was_away(
    cluster: Cluster, stomp_clients: Clients
) -> None:
    a, b = cluster(2)
    durable = {"durable_subscription_name": "audit"}
    away, got_before = stomp_clients(b.broker.port, **{"client-id": "auditor"})
    subscribe(away, got_before, TOPIC, "s", ack="auto", **durable)
    b.wait_routes("a", {TOPIC})
    away.disconnect()
    producer, sent = stomp_clients(a.broker.port)
    bodies = [f"t{i}" for i in range(30)]
    send_all(producer, sent, bodies, TOPIC)
    # Nobody is attached on b, yet the subscription there keeps the topic coming.
    wait_until(lambda: received(b, TOPIC) == len(bodies), DELIVERY_WAIT)
    assert b.routes("a") == {TOPIC}

    back, got = stomp_clients(b.broker.port, **{"client-id": "auditor"})
    subscribe(back, got, TOPIC, "s", ack="auto", **durable)
    got.wait_messages(len(bodies), DELIVERY_WAIT)
    assert bodies_of(got) == bodies


def test_a_slow_consumer_holds_what_crosses_to_its_window_and_the_link_window(
    cluster: Cluster, stomp_clients: Clients
) -> None:
    consumer_window, link_window = 5, 10
    a, b = cluster(2, flow_limit=link_window)
    consumer, got = consumer_at(stomp_clients, b, a, "client-individual", consumer_flow_limit="5")
    bodies = produce_at(stomp_clients, a, 100, persistent="true")

    got.wait_messages(consumer_window, DELIVERY_WAIT)
    # The consumer has no room left: its member lets the queue go at the other.
    b.wait_routes("a", set(), DELIVERY_WAIT)
    crossed = received(b, QUEUE)
    assert consumer_window <= crossed <= consumer_window + link_window
    assert undelivered(a, QUEUE) >= len(bodies) - crossed
    assert len(got.messages) == consumer_window

    # Consuming lets the rest come, a window at a time.
    ack_each(consumer, got, len(bodies))
    assert Counter(bodies_of(got)) == Counter(bodies)
    wait_until(lambda: undelivered(a, QUEUE) == 0)


def limited(limit: int, behavior: str) -> dict[str, dict[str, str]]:
    """Properties for member b: QUEUE holds at most `limit` messages there."""
    return {
        "b": {
            "imq.destination.queue.orders.maxNumMsgs": str(limit),
            "imq.destination.queue.orders.limitBehavior": behavior,
        }
    }


def test_a_full_destination_on_the_consuming_member_holds_the_link_and_its_home(
    cluster: Cluster, stomp_clients: Clients
) -> None:
    limit, link_window = 10, 30
    a, b = cluster(2, flow_limit=link_window, properties=limited(limit, "FLOW_CONTROL"))
    consumer, got = consumer_at(stomp_clients, b, a, "client-individual")
    bodies = produce_at(stomp_clients, a, 200, persistent="true")

    got.wait_messages(limit, DELIVERY_WAIT)
    # b takes `limit` and holds the link's next SEND, so its RECEIPT and those behind it wait
    # and the link acknowledges nothing more: a sends it no more than its window.
    rest = len(bodies) - link_window
    wait_until(lambda: undelivered(a, QUEUE) <= rest, DELIVERY_WAIT)
    assert received(b, QUEUE) == limit
    assert undelivered(a, QUEUE) == rest

    ack_each(consumer, got, len(bodies))  # consuming makes room, a window at a time
    assert bodies_of(got) == bodies


def test_messages_the_consuming_member_refuses_stay_at_home_and_cross_once(
    cluster: Cluster, stomp_clients: Clients
) -> None:
    limit = 5
    a, b = cluster(2, properties=limited(limit, "REJECT_NEWEST"))
    consumer, got = consumer_at(stomp_clients, b, a, "client-individual")
    bodies = produce_at(stomp_clients, a, 4 * limit, persistent="true")

    got.wait_messages(limit, DELIVERY_WAIT)
    # The next one is refused there: given back to a, which keeps the rest meanwhile.
    wait_until(lambda: undelivered(a, QUEUE) == len(bodies) - limit, DELIVERY_WAIT)
    links = b.links
    assert links is not None
    assert b.call(lambda: links.links["a"].forwarded) == limit

    ack_each(consumer, got, len(bodies))  # room again: the rest crosses, each once
    assert Counter(bodies_of(got)) == Counter(bodies)


def test_stopping_the_forwarding_member_loses_nothing_and_brings_back_nothing_acked(
    make_broker: Callable[..., BrokerThread], stomp_clients: Clients, tmp_path: Any
) -> None:
    kept = {"imq.persist.file.directory": str(tmp_path / "b")}
    a = Member("a", make_broker())
    b = Member("b", make_broker(kept))
    try:
        b.link_to(StaticPeers([a.peer]), flow_limit=20)
        window = {"consumer_flow_limit": "20"}
        consumer, got = consumer_at(stomp_clients, b, a, "client-individual", **window)
        bodies = produce_at(stomp_clients, a, 300, persistent="true")

        acked_at_b = ack_each(consumer, got, 60)
        sync(consumer, got)  # the ACKs are in
    finally:
        b.stop_links()
    b.broker.stop()  # its consumer's unacknowledged messages stay in its store

    again = Member("b", make_broker(kept))
    consumer_b, kept_at_b = stomp_clients(again.broker.port)
    subscribe(consumer_b, kept_at_b, QUEUE, "s", ack="auto")
    consumer_a, left_at_a = stomp_clients(a.broker.port)
    subscribe(consumer_a, left_at_a, QUEUE, "s", ack="auto")

    def total() -> int:
        return len(acked_at_b) + len(kept_at_b.messages) + len(left_at_a.messages)

    wait_until(lambda: total() >= len(bodies), DELIVERY_WAIT)
    everything = acked_at_b + bodies_of(kept_at_b) + bodies_of(left_at_a)
    assert Counter(everything) == Counter(bodies)  # nothing lost, nothing twice
    # What went back to the home broker from the link was delivered there before: flagged.
    returned = [f for f in left_at_a.messages if f.headers["redelivered"] == "true"]
    assert len(returned) <= 20


def test_a_member_that_restarts_is_linked_again_and_nothing_arrives_twice(
    make_broker: Callable[..., BrokerThread], stomp_clients: Clients, tmp_path: Any
) -> None:
    kept = {"imq.persist.file.directory": str(tmp_path / "a")}
    a = Member("a", make_broker(kept))
    b = Member("b", make_broker())
    peers = StaticPeers([a.peer])
    try:
        b.link_to(peers, flow_limit=50)
        _, got = consumer_at(stomp_clients, b, a)
        bodies = produce_at(stomp_clients, a, 400, persistent="true")
        got.wait_messages(50, DELIVERY_WAIT)
        a.broker.stop()  # while messages cross
        restarted = Member("a", make_broker(kept))
        peers.peers = [restarted.peer]  # the member is back, on another port
        got.wait_messages(len(bodies), DELIVERY_WAIT)
        assert Counter(bodies_of(got)) == Counter(bodies)
        wait_until(lambda: undelivered(restarted, QUEUE) == 0)
    finally:
        b.stop_links()


def test_a_link_cut_short_loses_nothing_and_what_comes_back_is_flagged(
    cluster: Cluster, stomp_clients: Clients
) -> None:
    a, b = cluster(2)
    _, got_there = consumer_at(stomp_clients, b, a)
    bodies = produce_at(stomp_clients, a, 3000, persistent="true")
    got_there.wait_messages(50, DELIVERY_WAIT)
    b.stop_links(grace=0)  # mid-flow, as if the member crashed
    wait_until(lambda: links_at(a, b) == 0)
    home = a.destination(QUEUE)
    assert home is not None
    returned = a.call(lambda: home.stats.redelivered)  # given back by the closed link
    here, got_here = stomp_clients(a.broker.port)
    subscribe(here, got_here, QUEUE, "s", ack="auto")

    def everywhere() -> set[str]:  # (the batch cut short may still reach the consumer there)
        return set(bodies_of(got_there)) | set(bodies_of(got_here))

    wait_until(lambda: everywhere() == set(bodies), DELIVERY_WAIT)
    seen_there = set(bodies_of(got_there))
    assert all(count == 1 for count in Counter(bodies_of(got_here)).values())
    flagged = [f.body for f in got_here.messages if f.headers["redelivered"] == "true"]
    assert len(flagged) == returned
    # What crossed and comes back at its home was delivered there before: always flagged.
    assert set(flagged) >= {f.body for f in got_here.messages if f.body in seen_there}


def links_at(member: Member, of: Member) -> int:
    """The connections of the links of `of` that `member` holds."""
    core = member.broker.broker
    assert core is not None
    client_id = link_client_id(of.broker_id)
    return member.call(lambda: sum(c.client_id == client_id for c in core.connections.values()))


def test_a_home_member_killed_and_restarted_delivers_each_message_once(
    make_broker: Callable[..., BrokerThread], stomp_clients: Clients, tmp_path: Any
) -> None:
    directory = str(tmp_path / "a")
    b = Member("b", make_broker())
    with BrokerProcess(data_dir=directory) as home:
        peers = StaticPeers([Peer("a", "127.0.0.1", home.port)])
        try:
            links = b.link_to(peers, flow_limit=100)
            consumer, got = stomp_clients(b.broker.port)
            subscribe(consumer, got, QUEUE, "s", ack="auto")
            b.wait_routes("a", {QUEUE})
            producer, sent = stomp_clients(home.port)
            bodies = [f"m{i}" for i in range(1000)]
            send_all(producer, sent, bodies, persistent="true")
            got.wait_messages(100, DELIVERY_WAIT)
            home.kill()  # while messages cross: its last ACKs may be lost with it
            with BrokerProcess(data_dir=directory) as again:
                peers.peers = [Peer("a", "127.0.0.1", again.port)]
                got.wait_messages(len(bodies), DELIVERY_WAIT)
                recognised = b.call(lambda: links.links["a"].duplicates)
                # (About a window of them, on the machine this was written on: the home's last
                # ACKs are not synced when it is killed.)
                assert Counter(bodies_of(got)) == Counter(bodies), f"{recognised} recognised"
        finally:
            b.stop_links()
