"""Consumer and connection flow control over real sockets, with raw frames and with stomp.py."""

from __future__ import annotations

import time
from typing import Any

import pytest

from sluiceway.testing import BrokerThread
from tests.e2e.conftest import BrokerFactory, ClientFactory
from tests.e2e.rawclient import RawClient
from tests.e2e.stomppy import connect, sync, with_receipt


def fill(client: RawClient, destination: str, count: int, size: int = 0) -> None:
    """Send `count` messages and wait until the broker has them all."""
    for i in range(count):
        body = (b"%d " % i).ljust(size, b".")
        client.send("SEND", {"destination": destination}, body)
    client.sync()


def numbers(frames: list[Any]) -> list[int]:
    return [int(f.body.split()[0]) for f in frames]


def test_limit_10_threshold_50_raw(raw: ClientFactory) -> None:
    producer, consumer = raw(), raw()
    fill(producer, "/queue/flow", 30)
    receipt = consumer.subscribe(
        "/queue/flow", consumer_flow_limit="10", consumer_flow_threshold="50"
    )
    assert receipt.headers["consumer-flow-limit"] == "10"
    assert receipt.headers["consumer-flow-threshold"] == "50"
    first = consumer.receive(10)
    consumer.sync()
    assert consumer.drain() == []  # no 11th
    for message in first[:4]:
        consumer.ack(message)
    consumer.sync()
    assert consumer.drain() == []  # 6 unconsumed is above floor(10*50/100) = 5
    consumer.ack(first[4])
    second = consumer.receive(5)
    consumer.sync()
    assert consumer.drain() == []  # exactly 5 more: 10 - 5 unconsumed
    assert numbers(first + second) == list(range(15))


def test_limit_10_threshold_50_stomp_py(broker: BrokerThread) -> None:
    producer, _ = connect(broker.port)
    for i in range(30):
        producer.send("/queue/flow", f"{i}")
    consumer, recorder = connect(broker.port)
    with_receipt(
        recorder,
        lambda r: consumer.subscribe(
            "/queue/flow",
            id="1",
            ack="client-individual",
            headers={"consumer-flow-limit": "10", "receipt": r},
        ),
    )
    first = recorder.wait_messages(10)
    sync(consumer, recorder)
    assert len(recorder.take()) == 10
    for frame in first[:5]:
        consumer.ack(frame.headers["ack"])
    second = recorder.wait_messages(5)
    sync(consumer, recorder)
    assert len(recorder.take()) == 5
    assert [int(f.body) for f in first + second] == list(range(15))
    producer.disconnect()
    consumer.disconnect()


def test_threshold_10_waits_for_nine_acks(raw: ClientFactory) -> None:
    producer, consumer = raw(), raw()
    fill(producer, "/queue/t10", 30)
    consumer.subscribe("/queue/t10", consumer_flow_limit="10", consumer_flow_threshold="10")
    first = consumer.receive(10)
    for message in first[:8]:
        consumer.ack(message)
    consumer.sync()
    assert consumer.drain() == []
    consumer.ack(first[8])
    assert len(consumer.receive(9)) == 9
    consumer.sync()
    assert consumer.drain() == []


def test_threshold_0_refills_the_whole_window_however_the_acks_are_read(
    raw: ClientFactory,
) -> None:
    producer, consumer = raw(), raw()
    consumer.subscribe("/queue/t0", consumer_flow_limit="10", consumer_flow_threshold="0")
    fill(producer, "/queue/t0", 20)
    first = consumer.receive(10)
    for message in first[:7]:
        consumer.ack(message)
    consumer.sync()  # the broker has read these 7, whatever reads it took
    assert consumer.drain() == []  # 3 unconsumed: above floor(10*0/100) = 0
    for message in first[7:]:
        consumer.ack(message)
    assert numbers(first + consumer.receive(10)) == list(range(20))
    consumer.sync()
    assert consumer.drain() == []


def test_destination_cap_of_3_beats_client_limit_of_10(make_broker: BrokerFactory) -> None:
    broker = make_broker({"imq.destination.queue.capped.consumerFlowLimit": "3"})
    client = RawClient(broker.port)
    client.connect()
    fill(client, "/queue/capped", 10)
    receipt = client.subscribe("/queue/capped", consumer_flow_limit="10")
    assert receipt.headers["consumer-flow-limit"] == "3"
    client.receive(3)
    client.sync()
    assert client.drain() == []
    client.close()


@pytest.mark.parametrize("header", ["activemq.prefetchSize", "prefetch-count"])
def test_other_brokers_prefetch_headers_are_message_counts(raw: ClientFactory, header: str) -> None:
    producer, consumer = raw(), raw()
    fill(producer, "/queue/prefetch", 20, size=4096)
    receipt = consumer.request(
        "SUBSCRIBE",
        {"destination": "/queue/prefetch", "id": "s", "ack": "client", header: "2"},
    )
    assert receipt.headers["consumer-flow-limit"] == "2"
    consumer.receive(2)  # two messages, not two bytes and not 2 KiB
    consumer.sync()
    assert consumer.drain() == []


def test_prefetch_off_one_message_at_a_time(broker: BrokerThread) -> None:
    producer, _ = connect(broker.port)
    for i in range(3):
        producer.send("/queue/one", f"{i}")
    consumer, recorder = connect(broker.port)
    receipt = with_receipt(
        recorder,
        lambda r: consumer.subscribe(
            "/queue/one",
            id="1",
            ack="client-individual",
            headers={"consumer-flow-prefetch": "false", "receipt": r},
        ),
    )
    assert receipt["consumer-flow-limit"] == "1"
    assert receipt["consumer-flow-prefetch"] == "false"
    for i in range(3):
        (frame,) = recorder.wait_messages(1)
        sync(consumer, recorder)
        assert [f.body for f in recorder.take()] == [f"{i}"]
        consumer.ack(frame.headers["ack"])
    producer.disconnect()
    consumer.disconnect()


def test_connection_limit_of_4_across_two_subscriptions(raw: ClientFactory) -> None:
    producer = raw()
    consumer = raw(connection_flow_limit="4", connection_flow_limit_enabled="true")
    fill(producer, "/queue/ca", 10)
    fill(producer, "/queue/cb", 10)
    consumer.subscribe("/queue/ca", "a", consumer_flow_limit="100")
    consumer.subscribe("/queue/cb", "b", consumer_flow_limit="100")
    first = consumer.receive(4)
    consumer.sync()
    assert consumer.drain() == []
    consumer.ack(first[0])
    consumer.ack(first[1])
    consumer.receive(2)
    consumer.sync()
    assert consumer.drain() == []


def test_connected_echoes_connection_flow_settings(raw: ClientFactory) -> None:
    client = raw(connect=False)
    connected = client.connect(
        connection_flow_count="7",
        connection_flow_limit="40",
        connection_flow_limit_enabled="true",
    )
    assert connected.headers["connection-flow-count"] == "7"
    assert connected.headers["connection-flow-limit"] == "40"
    assert connected.headers["connection-flow-limit-enabled"] == "true"


def test_message_expiring_while_consumer_waits_never_stalls_it(raw: ClientFactory) -> None:
    producer, consumer = raw(), raw()
    consumer.subscribe("/queue/exp", consumer_flow_prefetch="false")
    producer.send("SEND", {"destination": "/queue/exp"}, b"held")
    held = consumer.receive(1)[0]
    # Expires 0.3 s from now, while the consumer's one-message window is taken by "held".
    producer.request(
        "SEND",
        {"destination": "/queue/exp", "expires": str(_now_ms() + 300)},
        b"short-lived",
    )
    producer.request("SEND", {"destination": "/queue/exp"}, b"after")
    _wait_until(_now_ms() + 400)
    consumer.ack(held)
    (after,) = consumer.receive(1)
    assert after.body == b"after"


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _wait_until(deadline_ms: int) -> None:
    """Let wall-clock time pass (an expiry is a wall-clock deadline, nothing to wait on)."""
    while _now_ms() < deadline_ms:
        time.sleep(0.01)
