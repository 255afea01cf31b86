"""Queues, topics, acknowledgements, redelivery, transactions and dispatch over real sockets."""

from __future__ import annotations

import time

import pytest

from sluiceway.testing import BrokerThread
from tests.e2e.conftest import BrokerFactory, ClientFactory
from tests.e2e.rawclient import RawClient
from tests.e2e.stomppy import connect, subscribe, sync, wait_until, with_receipt


def test_queue_gives_each_message_to_exactly_one_consumer(broker: BrokerThread) -> None:
    one, rec_one = connect(broker.port)
    two, rec_two = connect(broker.port)
    for connection, recorder in ((one, rec_one), (two, rec_two)):
        subscribe(connection, recorder, "/queue/work", "w", ack="auto", consumer_flow_limit="5")
    producer, _ = connect(broker.port)
    for i in range(200):
        producer.send("/queue/work", f"{i}")
    wait_until(lambda: len(rec_one.messages) + len(rec_two.messages) >= 200)
    sync(one, rec_one)
    sync(two, rec_two)
    got = [int(f.body) for f in rec_one.take() + rec_two.take()]
    assert sorted(got) == list(range(200))  # every message, none twice
    for connection in (one, two, producer):
        connection.disconnect()


def test_order_preserved_per_producer_for_a_single_consumer(raw: ClientFactory) -> None:
    first, second, consumer = raw(), raw(), raw()
    consumer.subscribe("/queue/ordered", ack="auto")
    for i in range(300):
        first.send("SEND", {"destination": "/queue/ordered"}, b"a%d" % i)
        second.send("SEND", {"destination": "/queue/ordered"}, b"b%d" % i)
    received = [m.body for m in consumer.receive(600)]
    for prefix in (b"a", b"b"):
        own = [body for body in received if body.startswith(prefix)]
        assert own == [prefix + b"%d" % i for i in range(300)]


def test_topic_reaches_every_subscriber_present_when_sent(raw: ClientFactory) -> None:
    producer, one, two = raw(), raw(), raw()
    producer.request("SEND", {"destination": "/topic/news"}, b"nobody listening")
    one.subscribe("/topic/news", ack="auto")
    two.subscribe("/topic/news", ack="auto")
    producer.request("SEND", {"destination": "/topic/news"}, b"both")
    late = raw()
    late.subscribe("/topic/news", ack="auto")
    producer.request("SEND", {"destination": "/topic/news"}, b"all three")
    assert [m.body for m in one.receive(2)] == [b"both", b"all three"]
    assert [m.body for m in two.receive(2)] == [b"both", b"all three"]
    assert [m.body for m in late.receive(1)] == [b"all three"]
    for client in (one, two, late):
        client.sync()
        assert client.drain() == []


def test_autocreate_can_be_turned_off(make_broker: BrokerFactory) -> None:
    broker = make_broker({"imq.autocreate.queue": "false"})
    client = RawClient(broker.port)
    client.connect()
    client.request("SEND", {"destination": "/topic/allowed"}, b"x")
    client.send("SEND", {"destination": "/queue/missing", "receipt": "r"}, b"x")
    error = client.expect("ERROR")
    assert error.headers["status"] == "404"
    assert error.headers["receipt-id"] == "r"
    assert b"imq.autocreate.queue" in error.body
    client.expect_closed()
    client.close()


def test_message_headers(raw: ClientFactory) -> None:
    producer, consumer = raw(), raw()
    consumer.subscribe("/queue/h", ack="client")
    producer.request(
        "SEND",
        {
            "destination": "/queue/h",
            "content-type": "application/json",
            "persistent": "true",
            "priority": "7",
            "correlation-id": "c-1",
        },
        b'{"a":1}',
    )
    (message,) = consumer.receive(1)
    headers = message.headers
    assert headers["destination"] == "/queue/h"
    assert headers["subscription"] == "s1"
    assert headers["message-id"]
    assert headers["ack"]
    assert headers["content-type"] == "application/json"
    assert headers["persistent"] == "true"
    assert headers["priority"] == "7"
    assert headers["correlation-id"] == "c-1"
    assert headers["redelivered"] == "false"
    assert headers["delivery-count"] == "1"
    assert headers["content-length"] == "7"
    assert abs(int(headers["timestamp"]) - time.time() * 1000) < 60_000


def test_priority_higher_first_within_a_queue(raw: ClientFactory) -> None:
    producer, consumer = raw(), raw()
    for body, priority in [(b"low", "1"), (b"high", "9"), (b"normal", None), (b"high2", "9")]:
        headers = {"destination": "/queue/prio"}
        if priority is not None:
            headers["priority"] = priority
        producer.send("SEND", headers, body)
    producer.sync()
    consumer.subscribe("/queue/prio")
    assert [m.body for m in consumer.receive(4)] == [b"high", b"high2", b"normal", b"low"]


def test_expired_message_is_never_delivered(raw: ClientFactory) -> None:
    producer, consumer = raw(), raw()
    past = str(time.time_ns() // 1_000_000 - 1000)
    future = str(time.time_ns() // 1_000_000 + 600_000)
    producer.send("SEND", {"destination": "/queue/exp2", "expires": past}, b"stale")
    producer.send("SEND", {"destination": "/queue/exp2", "expires": future}, b"fresh")
    producer.send("SEND", {"destination": "/queue/exp2", "expires": "0"}, b"forever")
    producer.sync()
    consumer.subscribe("/queue/exp2")
    assert [m.body for m in consumer.receive(2)] == [b"fresh", b"forever"]
    consumer.sync()
    assert consumer.drain() == []


def test_client_ack_is_cumulative(broker: BrokerThread) -> None:
    producer, _ = connect(broker.port)
    for i in range(5):
        producer.send("/queue/cum", f"{i}")
    consumer, recorder = connect(broker.port)
    with_receipt(
        recorder,
        lambda r: consumer.subscribe("/queue/cum", id="c", ack="client", headers={"receipt": r}),
    )
    frames = recorder.wait_messages(5)
    consumer.ack(frames[2].headers["ack"])  # acknowledges 0, 1 and 2
    consumer.disconnect()
    again, recorder2 = connect(broker.port)
    again.subscribe("/queue/cum", id="c", ack="client-individual")
    redelivered = recorder2.wait_messages(2)
    assert [f.body for f in redelivered] == ["3", "4"]
    assert all(f.headers["redelivered"] == "true" for f in redelivered)
    assert all(f.headers["delivery-count"] == "2" for f in redelivered)
    producer.disconnect()
    again.disconnect()


def test_nack_redelivers_with_redelivered_flag(raw: ClientFactory) -> None:
    producer, consumer = raw(), raw()
    consumer.subscribe("/queue/nack")
    producer.request("SEND", {"destination": "/queue/nack"}, b"retry me")
    (first,) = consumer.receive(1)
    consumer.ack(first, command="NACK")
    (second,) = consumer.receive(1)
    assert second.body == b"retry me"
    assert second.headers["redelivered"] == "true"
    assert second.headers["delivery-count"] == "2"
    assert second.headers["message-id"] == first.headers["message-id"]


def test_disconnect_returns_unacked_messages(raw: ClientFactory) -> None:
    producer, first = raw(), raw()
    first.subscribe("/queue/back", consumer_flow_limit="3")
    for i in range(5):
        producer.send("SEND", {"destination": "/queue/back"}, b"%d" % i)
    got = first.receive(3)
    first.ack(got[0])
    first.request("DISCONNECT")
    first.expect_closed()
    second = raw()
    second.subscribe("/queue/back")
    messages = second.receive(4)
    assert [m.body for m in messages] == [b"1", b"2", b"3", b"4"]
    assert [m.headers["redelivered"] for m in messages] == ["true", "true", "false", "false"]


def test_transaction_covers_sends_and_acks(raw: ClientFactory) -> None:
    producer, consumer = raw(), raw()
    consumer.subscribe("/queue/tx")
    producer.request("BEGIN", {"transaction": "t1"})
    producer.request("SEND", {"destination": "/queue/tx", "transaction": "t1"}, b"one")
    producer.request("SEND", {"destination": "/queue/tx", "transaction": "t1"}, b"two")
    consumer.sync()
    assert consumer.drain() == []  # not before the COMMIT
    producer.request("COMMIT", {"transaction": "t1"})
    first, second = consumer.receive(2)
    producer.request("BEGIN", {"transaction": "t2"})
    producer.request("SEND", {"destination": "/queue/tx", "transaction": "t2"}, b"aborted")
    producer.request("ABORT", {"transaction": "t2"})
    consumer.request("BEGIN", {"transaction": "c1"})
    consumer.request("ACK", {"id": first.headers["ack"], "transaction": "c1"})
    consumer.request("ACK", {"id": second.headers["ack"], "transaction": "c1"})
    consumer.request("ABORT", {"transaction": "c1"})  # the acknowledged messages come back
    again = consumer.receive(2)
    assert [m.body for m in again] == [b"one", b"two"]
    assert all(m.headers["redelivered"] == "true" for m in again)
    consumer.request("BEGIN", {"transaction": "c2"})
    for message in again:
        consumer.request("ACK", {"id": message.headers["ack"], "transaction": "c2"})
    consumer.request("COMMIT", {"transaction": "c2"})
    consumer.sync()
    assert consumer.drain() == []  # "aborted" was never sent


@pytest.mark.parametrize(
    ("policy", "expected"),
    [("openmq", [100, 0, 0, 0]), ("fair", [25, 25, 25, 25])],
)
def test_distribution_of_100_messages_over_4_ready_consumers(
    make_broker: BrokerFactory, policy: str, expected: list[int]
) -> None:
    broker = make_broker({"imq.autocreate.queue.dispatchPolicy": policy})
    consumers = []
    for _ in range(4):
        consumer = RawClient(broker.port)
        consumer.connect()
        consumer.subscribe("/queue/dist", consumer_flow_limit="1000")
        consumers.append(consumer)
    producer = RawClient(broker.port)
    producer.connect()
    for i in range(100):
        producer.send("SEND", {"destination": "/queue/dist"}, b"%d" % i)
    producer.sync()
    counts = []
    for consumer in consumers:
        consumer.sync()
        counts.append(len(consumer.drain()))
    assert counts == expected
    for client in (*consumers, producer):
        client.close()


def test_distribution_with_stomp_py_consumers(make_broker: BrokerFactory) -> None:
    broker = make_broker({"imq.autocreate.queue.dispatchPolicy": "fair"})
    consumers = []
    for n in range(4):
        connection, recorder = connect(broker.port)
        subscribe(connection, recorder, "/queue/dist2", f"c{n}")
        consumers.append((connection, recorder))
    producer, _ = connect(broker.port)
    for i in range(100):
        producer.send("/queue/dist2", f"{i}")
    wait_until(lambda: sum(len(r.messages) for _, r in consumers) >= 100)
    for connection, recorder in consumers:
        sync(connection, recorder)
    assert [len(r.take()) for _, r in consumers] == [25, 25, 25, 25]
    for connection, _ in consumers:
        connection.disconnect()
    producer.disconnect()
