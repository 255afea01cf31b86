"""Eviction (REMOVE_OLDEST, REMOVE_LOW_PRIORITY) and the dead message queue over real sockets:
expired, evicted and undeliverable messages arrive in /queue/mq.sys.dmq with the JMS_SUN_DMQ_*
headers; useDMQ, maxDeliveryCount, imq.destination.DMQ.truncateBody,
imq.message.expiration.interval; the queue's own protection.
"""

from __future__ import annotations

import pytest

from sluiceway.config import LimitBehavior
from sluiceway.core.broker import PauseTarget
from sluiceway.errors import Forbidden
from sluiceway.naming import parse_destination
from sluiceway.testing import BrokerThread
from tests.e2e.conftest import BrokerFactory, ClientFactory, StompFactory
from tests.e2e.limits import (
    DMQ,
    MIB,
    assert_accepted,
    assert_dead,
    bodies,
    expect_error_and_close,
    now_ms,
    on_loop,
    send_raw,
    send_receipted,
    settings_of,
    stat,
)
from tests.e2e.stomppy import subscribe, sync, wait_until

# -- 5. REMOVE_OLDEST and REMOVE_LOW_PRIORITY -----------------------------------------------------


def test_remove_oldest_evicts_to_the_dmq_stomp_py(
    make_broker: BrokerFactory, stomp_clients: StompFactory
) -> None:
    broker = make_broker(
        {
            "imq.destination.queue.ro.maxNumMsgs": "3",
            "imq.destination.queue.ro.limitBehavior": "REMOVE_OLDEST",
            "imq.destination.topic.ro.maxNumMsgs": "2",
            "imq.destination.topic.ro.limitBehavior": "REMOVE_OLDEST",
            "imq.destination.queue.nodmq.maxNumMsgs": "1",
            "imq.destination.queue.nodmq.limitBehavior": "REMOVE_OLDEST",
            "imq.destination.queue.nodmq.useDMQ": "false",
        }
    )
    watcher, dead = stomp_clients(broker.port)
    subscribe(watcher, dead, DMQ, "dmq", ack="auto")
    since = now_ms()
    producer, recorder = stomp_clients(broker.port)
    for i in range(5):
        receipt = send_receipted(
            producer, recorder, "/queue/ro", f"m{i}", persistent="true", n=f"{i}"
        )
        assert_accepted(receipt)  # the producer is never told
    assert recorder.errors == []

    consumer, received = stomp_clients(broker.port)
    subscribe(consumer, received, "/queue/ro", "c", ack="auto")
    received.wait_messages(3)
    sync(consumer, received)
    assert bodies(received.take()) == ["m2", "m3", "m4"]

    evicted = dead.wait_messages(2)
    sync(watcher, dead)
    assert bodies(dead.take()) == ["m0", "m1"]
    for i, frame in enumerate(evicted):
        assert_dead(frame.headers, reason="OLDEST", origin="/queue/ro", since_ms=since)
        assert frame.headers["n"] == f"{i}"  # the original's own headers are kept
        assert frame.headers["persistent"] == "true"
    assert stat(broker, "/queue/ro", "dead") == 2

    # A topic evicts from its subscriber's backlog. The subscriber's window of one holds t0,
    # which is delivered, unacknowledged, and counts: only one more fits, so t1-t3 are evicted.
    subscribe(consumer, received, "/topic/ro", "t", consumer_flow_prefetch="false")
    for i in range(5):
        assert_accepted(send_receipted(producer, recorder, "/topic/ro", f"t{i}"))
    (first,) = received.wait_messages(1)
    evicted = dead.wait_messages(3)
    sync(watcher, dead)
    assert bodies(dead.take()) == ["t1", "t2", "t3"]
    for frame in evicted:
        assert_dead(frame.headers, reason="OLDEST", origin="/topic/ro", since_ms=since)
    consumer.ack(first.headers["ack"])
    received.wait_messages(2)
    sync(consumer, received)
    assert bodies(received.take()) == ["t0", "t4"]

    # Without useDMQ, evicted messages are discarded.
    for i in range(3):
        assert_accepted(send_receipted(producer, recorder, "/queue/nodmq", f"n{i}"))
    sync(watcher, dead)
    assert dead.take() == []
    assert stat(broker, "/queue/nodmq", "dead") == 2


def test_remove_low_priority_evicts_lowest_then_oldest_stomp_py(
    make_broker: BrokerFactory, stomp_clients: StompFactory
) -> None:
    broker = make_broker(
        {
            "imq.destination.queue.rl.maxNumMsgs": "3",
            "imq.destination.queue.rl.limitBehavior": "REMOVE_LOW_PRIORITY",
        }
    )
    watcher, dead = stomp_clients(broker.port)
    subscribe(watcher, dead, DMQ, "dmq", ack="auto")
    since = now_ms()
    producer, recorder = stomp_clients(broker.port)
    # After a, b, c the queue is full: d evicts b (priority 1, older than d), e then evicts d.
    for body, priority in (("a", 4), ("b", 1), ("c", 9), ("d", 1), ("e", 7)):
        receipt = send_receipted(producer, recorder, "/queue/rl", body, priority=f"{priority}")
        assert_accepted(receipt)

    consumer, received = stomp_clients(broker.port)
    subscribe(consumer, received, "/queue/rl", "c", ack="auto")
    received.wait_messages(3)
    sync(consumer, received)
    assert bodies(received.take()) == ["c", "e", "a"]  # highest priority first

    evicted = dead.wait_messages(2)
    sync(watcher, dead)
    assert bodies(dead.take()) == ["b", "d"]
    for frame in evicted:
        assert_dead(frame.headers, reason="LOW_PRIORITY", origin="/queue/rl", since_ms=since)
        assert frame.headers["priority"] == "1"


# -- 6. the dead message queue --------------------------------------------------------------------


def test_expired_messages_go_to_the_dmq(make_broker: BrokerFactory, clients: ClientFactory) -> None:
    broker = make_broker({"imq.message.expiration.interval": "1"})
    watcher = clients(broker.port)
    watcher.subscribe(DMQ, "dmq", ack="auto")
    subscriber = clients(broker.port)
    subscriber.subscribe("/topic/exp", "t", consumer_flow_prefetch="false")
    producer = clients(broker.port)
    send_raw(producer, "/topic/exp", b"held")
    (held,) = subscriber.receive(1)  # its one-message window is now taken
    since = now_ms()
    expires = since + 200
    # /queue/swept never has a consumer: only the periodic sweep can find its expired message.
    send_raw(producer, "/queue/swept", b"swept", expires=f"{expires}", n="1")
    # /queue/late gets a consumer once its message expired: it must never be delivered.
    send_raw(producer, "/queue/late", b"late", expires=f"{expires}", n="2")
    send_raw(producer, "/queue/late", b"kept")
    # The topic subscriber's copy expires in its backlog, behind "held".
    send_raw(producer, "/topic/exp", b"topical", expires=f"{expires}", n="3")
    wait_until(lambda: now_ms() > expires)  # an expiry is a wall-clock deadline
    consumer = clients(broker.port)
    consumer.subscribe("/queue/late", "c", ack="auto")
    (kept,) = consumer.receive(1)
    assert kept.body == b"kept"

    copies = watcher.receive(3)
    by_origin = {m.headers["JMS_SUN_DMQ_UNDELIVERED_DESTINATION"]: m for m in copies}
    expected = {"/queue/swept": (b"swept", "1"), "/queue/late": (b"late", "2")}
    expected["/topic/exp"] = (b"topical", "3")
    assert sorted(by_origin) == sorted(expected)
    for origin, (body, n) in expected.items():
        copy = by_origin[origin]
        assert_dead(copy.headers, reason="EXPIRED", origin=origin, since_ms=expires)
        assert copy.body == body
        assert copy.headers["n"] == n
        assert stat(broker, origin, "expired") == 1
    subscriber.ack(held)
    for client in (consumer, subscriber, watcher):
        client.sync()
        assert client.drain() == []


def test_max_delivery_count_makes_a_message_undeliverable(
    make_broker: BrokerFactory, clients: ClientFactory
) -> None:
    broker = make_broker({"imq.destination.queue.redo.maxDeliveryCount": "2"})
    watcher = clients(broker.port)
    watcher.subscribe(DMQ, "dmq", ack="auto")
    client = clients(broker.port)
    client.subscribe("/queue/redo", "s")
    since = now_ms()
    send_raw(client, "/queue/redo", b"poison", n="7")
    (first,) = client.receive(1)
    assert first.headers["delivery-count"] == "1"
    client.ack(first, "NACK")
    (second,) = client.receive(1)
    assert second.headers["message-id"] == first.headers["message-id"]
    assert second.headers["delivery-count"] == "2"
    assert second.headers["redelivered"] == "true"
    client.ack(second, "NACK")

    (dead,) = watcher.receive(1)
    assert_dead(
        dead.headers,
        reason="UNDELIVERABLE",
        origin="/queue/redo",
        since_ms=since,
        delivery_count="2",
    )
    assert dead.headers["original-message-id"] == first.headers["message-id"]
    assert dead.headers["n"] == "7"
    assert dead.body == b"poison"
    client.sync()
    assert client.drain() == []  # not delivered a third time
    watcher.sync()
    assert watcher.drain() == []


def test_truncate_body_keeps_only_the_headers(
    make_broker: BrokerFactory, clients: ClientFactory
) -> None:
    broker = make_broker(
        {
            "imq.destination.DMQ.truncateBody": "true",
            "imq.destination.queue.tr.maxNumMsgs": "1",
            "imq.destination.queue.tr.limitBehavior": "REMOVE_OLDEST",
        }
    )
    watcher = clients(broker.port)
    watcher.subscribe(DMQ, "dmq", ack="auto")
    producer = clients(broker.port)
    since = now_ms()
    send_raw(producer, "/queue/tr", b"first body", kept="yes")
    send_raw(producer, "/queue/tr", b"second body")
    (dead,) = watcher.receive(1)
    assert_dead(dead.headers, reason="OLDEST", origin="/queue/tr", since_ms=since, truncated=True)
    assert dead.body == b""
    assert dead.headers["content-length"] == "0"
    assert dead.headers["kept"] == "yes"


def test_dmq_exists_and_is_protected(broker: BrokerThread, clients: ClientFactory) -> None:
    settings = settings_of(broker, DMQ)
    assert settings.max_num_msgs == 1000
    assert settings.max_total_msg_bytes == 10 * MIB
    assert settings.limit_behavior is LimitBehavior.REMOVE_OLDEST
    name = parse_destination(DMQ)
    with pytest.raises(Forbidden):
        on_loop(broker, lambda b: b.destroy_destination(name))
    with pytest.raises(Forbidden):
        on_loop(broker, lambda b: b.pause(name, PauseTarget.ALL))
    settings_of(broker, DMQ)  # still there

    client = clients(broker.port, failed_receipts="true")
    assert_accepted(client.subscribe(DMQ, "anyone").headers)
    refused = send_raw(client, "/queue/mq.mine")
    assert refused.headers["status"] == "403", refused
    refused = client.subscribe("/topic/mq.theirs", "t")
    assert refused.headers["status"] == "403", refused
    plain = clients(broker.port)
    plain.send("SEND", {"destination": "/queue/mq.mine"}, b"x")
    assert expect_error_and_close(plain).headers["status"] == "403"
