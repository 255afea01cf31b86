"""Adaptive consumer windows (consumer-flow-limit:auto, consumerFlowLimit=auto) over real sockets:
stomp.py and raw frames against a broker thread; the window as the admin model shows it."""

from __future__ import annotations

import time
from typing import Any

from sluiceway.admin.model import ConsumerSnapshot, consumers
from sluiceway.testing import BrokerThread
from tests.e2e.conftest import BrokerFactory, ClientFactory
from tests.e2e.stomppy import connect, end, with_receipt
from tests.e2e.support import wait_until

WAIT = 30.0  # generous: a loaded machine slows the consumer, never the rule


def snapshot(broker: BrokerThread, sub_id: str) -> ConsumerSnapshot:
    def find() -> ConsumerSnapshot:
        assert broker.broker is not None
        return next(c for c in consumers(broker.broker) if c.id == sub_id)

    return broker.call(find)


def test_stomp_py_consumer_gets_a_window_sized_to_its_pace(broker: BrokerThread) -> None:
    """A stomp.py consumer asking for auto is told the cap, and its window follows its pace: a
    consumer that takes 10 ms per message ends with a window far below prefetch 1000."""
    producer, _ = connect(broker.port)
    for i in range(400):
        producer.send("/queue/auto", f"{i}")
    consumer, recorder = connect(broker.port)
    receipt = with_receipt(
        recorder,
        lambda r: consumer.subscribe(
            "/queue/auto",
            id="slow",
            ack="client-individual",
            headers={"consumer-flow-limit": "auto", "receipt": r},
        ),
    )
    assert receipt["consumer-flow-limit"] == "1000"  # the destination's cap: the most it grows to
    assert receipt["consumer-flow-auto"] == "true"
    first = snapshot(broker, "slow")
    assert (first.window_auto, first.window_max) == (True, 1000)
    assert first.window_limit == 16  # until its pace is measured
    received: list[Any] = []
    while len(received) < 60:
        recorder.wait_messages(1, WAIT)
        for frame in recorder.take():
            time.sleep(0.01)  # the consumer's work
            consumer.ack(frame.headers["ack"])
            received.append(frame)
    wait_until(lambda: snapshot(broker, "slow").pace_ms is not None, WAIT)
    sized = snapshot(broker, "slow")
    assert sized.pace_ms is not None
    assert sized.pace_ms >= 5.0
    # 10 ms a message covers a loopback round trip and the slack in very few messages.
    assert sized.window_limit <= 16
    assert sized.outstanding <= 16
    end(consumer, recorder)
    producer.disconnect()


def test_auto_as_the_auto_created_queues_default(make_broker: BrokerFactory) -> None:
    """imq.autocreate.queue.consumerFlowLimit=auto: a consumer asking for 200 adapts within 200;
    one acknowledging nothing (ack:auto) keeps a fixed window."""
    broker = make_broker({"imq.autocreate.queue.consumerFlowLimit": "auto"})
    consumer, recorder = connect(broker.port)
    receipt = with_receipt(
        recorder,
        lambda r: consumer.subscribe(
            "/queue/tuned",
            id="a",
            ack="client",
            headers={"consumer-flow-limit": "200", "receipt": r},
        ),
    )
    assert (receipt["consumer-flow-limit"], receipt["consumer-flow-auto"]) == ("200", "true")
    plain = with_receipt(
        recorder,
        lambda r: consumer.subscribe("/queue/tuned", id="b", ack="auto", headers={"receipt": r}),
    )
    assert plain["consumer-flow-limit"] == "1000"
    assert "consumer-flow-auto" not in plain
    end(consumer, recorder)


def test_pool_size_is_a_floor(raw: ClientFactory, broker: BrokerThread) -> None:
    """consumer-pool-size: a slow consumer served by 12 handlers keeps a window of 12."""
    producer, consumer = raw(), raw()
    for i in range(200):
        producer.send("SEND", {"destination": "/queue/pooled"}, b"%d" % i)
    producer.sync()
    receipt = consumer.subscribe(
        "/queue/pooled", consumer_flow_limit="auto", consumer_pool_size="12", ack="client"
    )
    assert receipt.headers["consumer-flow-auto"] == "true"
    assert snapshot(broker, "s1").pool_size == 12
    assert snapshot(broker, "s1").window_limit == 16  # the initial window, above the pool
    for message in consumer.receive(16):
        time.sleep(0.02)  # slow enough that its pace alone would ask for about 4
        consumer.ack(message)
    wait_until(lambda: (snapshot(broker, "s1").pace_ms or 0.0) >= 10.0, WAIT)
    assert snapshot(broker, "s1").window_limit == 12


def test_bad_pool_size_is_refused(raw: ClientFactory) -> None:
    client = raw()
    client.send(
        "SUBSCRIBE", {"destination": "/queue/bad", "id": "s1", "consumer-pool-size": "many"}
    )
    error = client.expect("ERROR")
    assert "consumer-pool-size" in error.headers["message"]
    assert "handlers serving the consumer" in error.body.decode()
