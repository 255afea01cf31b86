"""Consumer and connection flow control in the core, on a fake clock."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import pytest

from sluiceway.core.broker import Broker
from sluiceway.core.model.subscription import AckMode
from sluiceway.core.values.flow import (
    UNLIMITED,
    ConnectionFlow,
    ConsumerFlow,
    effective_limit,
    resume_count,
)
from sluiceway.testing import FakeClock
from tests.core.helpers import Client, bodies


@pytest.mark.parametrize(
    ("limit", "threshold", "expected"),
    [
        (1000, 50, 500),  # the Admin Guide's example: refill when 500 remain
        (1000, 10, 100),  # "wait for the application to consume at least 900"
        (10, 50, 5),
        (10, 10, 1),
        (10, 100, 9),  # capped at L-1, so a refill always has room for one message
        (1, 0, 0),
        (1, 100, 0),
        (3, 33, 0),  # floor(0.99)
    ],
)
def test_resume_count(limit: int, threshold: int, expected: int) -> None:
    assert resume_count(limit, threshold) == expected


@pytest.mark.parametrize(
    ("client", "destination", "expected"),
    [
        (10, 3, 3),
        (3, 10, 3),
        (10, -1, 10),
        (10, 0, 10),
        (-1, 3, 3),  # a client cannot bypass the destination's cap
        (0, 3, 3),
        (-1, -1, UNLIMITED),
        (0, 0, UNLIMITED),
    ],
)
def test_effective_limit(client: int, destination: int, expected: int) -> None:
    assert effective_limit(client, destination) == expected


def test_prefetch_off_means_one_at_a_time() -> None:
    flow = ConsumerFlow.negotiate(
        requested_limit=500, threshold=50, prefetch=False, destination_limit=1000
    )
    assert (flow.limit, flow.threshold, flow.prefetch, flow.resume_at) == (1, 0, False, 0)


def test_window_of_10_threshold_50(broker: Broker) -> None:
    """Exactly 10 arrive, no 11th until 5 are acked, then exactly 5 more."""
    producer, consumer = Client(broker), Client(broker)
    for i in range(40):
        producer.send("/queue/q", b"%d" % i)
    consumer.subscribe("/queue/q", limit=10, threshold=50)
    first = consumer.take()
    assert bodies(first) == [b"%d" % i for i in range(10)]
    for delivery in first[:4]:
        consumer.ack(delivery)
        assert consumer.take() == []
    consumer.ack(first[4])
    second = consumer.take()
    assert bodies(second) == [b"%d" % i for i in range(10, 15)]
    assert consumer.take() == []


def test_threshold_10_waits_for_nine_acks(broker: Broker) -> None:
    producer, consumer = Client(broker), Client(broker)
    for i in range(40):
        producer.send("/queue/q", b"%d" % i)
    consumer.subscribe("/queue/q", limit=10, threshold=10)
    first = consumer.take()
    assert len(first) == 10
    for delivery in first[:8]:
        consumer.ack(delivery)
        assert consumer.take() == []
    consumer.ack(first[8])
    assert len(consumer.take()) == 9


def test_cumulative_ack_refills_in_one_step(broker: Broker) -> None:
    producer, consumer = Client(broker), Client(broker)
    for i in range(40):
        producer.send("/queue/q", b"%d" % i)
    consumer.subscribe("/queue/q", ack=AckMode.CLIENT, limit=10, threshold=50)
    first = consumer.take()
    assert consumer.ack(first[6]) == 7  # covers the first seven
    assert len(consumer.take()) == 7  # batch = L - unconsumed = 10 - 3


def test_window_is_credit_not_a_batch(broker: Broker) -> None:
    """With fewer than L messages available, later arrivals keep flowing until L were sent."""
    producer, consumer = Client(broker), Client(broker)
    consumer.subscribe("/queue/q", limit=10, threshold=50)
    for i in range(3):
        producer.send("/queue/q", b"%d" % i)
    for delivery in consumer.take():
        consumer.ack(delivery)
    for i in range(3, 20):
        producer.send("/queue/q", b"%d" % i)
    # 3 were sent since the subscription started, so 7 more complete the window of 10.
    assert len(consumer.take()) == 7


def test_destination_cap_beats_client_limit(
    make_broker: Callable[[Mapping[str, str]], Broker],
) -> None:
    broker = make_broker({"imq.destination.queue.capped.consumerFlowLimit": "3"})
    producer, consumer = Client(broker), Client(broker)
    for i in range(10):
        producer.send("/queue/capped", b"%d" % i)
    subscription = consumer.subscribe("/queue/capped", limit=10)
    assert subscription.flow.limit == 3
    assert len(consumer.take()) == 3


def test_autocreate_cap_applies_to_new_queues(
    make_broker: Callable[[Mapping[str, str]], Broker],
) -> None:
    broker = make_broker({"imq.autocreate.queue.consumerFlowLimit": "4"})
    producer, consumer = Client(broker), Client(broker)
    for i in range(10):
        producer.send("/queue/fresh", b"%d" % i)
    consumer.subscribe("/queue/fresh", limit=100)
    assert len(consumer.take()) == 4


def test_prefetch_off_delivers_one_until_consumed(broker: Broker) -> None:
    producer, consumer = Client(broker), Client(broker)
    for i in range(5):
        producer.send("/queue/q", b"%d" % i)
    consumer.subscribe("/queue/q", prefetch=False)
    for i in range(5):
        (delivery,) = consumer.take()
        assert delivery.message.body == b"%d" % i
        assert consumer.take() == []
        consumer.ack(delivery)


def test_connection_limit_across_two_subscriptions(broker: Broker) -> None:
    producer = Client(broker)
    consumer = Client(broker, ConnectionFlow(limit=4, limit_enabled=True))
    consumer.subscribe("/queue/a", "sa", limit=100)
    consumer.subscribe("/queue/b", "sb", limit=100)
    for i in range(10):
        producer.send("/queue/a", b"a%d" % i)
        producer.send("/queue/b", b"b%d" % i)
    first = consumer.take()
    assert bodies(first) == [b"a0", b"b0", b"a1", b"b1"]
    assert consumer.take() == []
    consumer.ack(first[0])
    (one_more,) = consumer.take()
    assert consumer.take() == []
    assert one_more.message.body not in bodies(first)


def test_connection_limit_shares_freed_slots_among_subscriptions(broker: Broker) -> None:
    producer = Client(broker)
    consumer = Client(broker, ConnectionFlow(limit=4, limit_enabled=True))
    for i in range(10):
        producer.send("/queue/a", b"a%d" % i)
        producer.send("/queue/b", b"b%d" % i)
    consumer.subscribe("/queue/a", "sa", limit=100)  # takes all four slots first
    consumer.subscribe("/queue/b", "sb", limit=100)
    first = consumer.take()
    assert bodies(first) == [b"a0", b"a1", b"a2", b"a3"]
    consumer.ack(first[0])
    # The freed slot goes to the subscription holding nothing, not back to the first one.
    assert bodies(consumer.take()) == [b"b0"]


def test_connection_limit_disabled_by_default(broker: Broker) -> None:
    producer, consumer = Client(broker), Client(broker, ConnectionFlow(limit=4))
    for i in range(10):
        producer.send("/queue/a", b"%d" % i)
    consumer.subscribe("/queue/a", limit=100)
    assert len(consumer.take()) == 10


def test_auto_ack_counts_as_consumed_when_written(broker: Broker) -> None:
    producer, consumer = Client(broker), Client(broker)
    for i in range(50):
        producer.send("/queue/q", b"%d" % i)
    subscription = consumer.subscribe("/queue/q", ack=AckMode.AUTO, limit=10)
    assert len(consumer.take()) == 50
    assert subscription.window.outstanding == 0
    assert broker.registry.get(subscription.destination.name) is subscription.destination
    assert subscription.destination.stats.consumed == 50


def test_expired_staged_message_never_stalls_the_consumer(broker: Broker, clock: FakeClock) -> None:
    """Open MQ #219: the message that used up the window expired before it was written."""
    producer, consumer = Client(broker), Client(broker)
    consumer.subscribe("/queue/q", limit=2, threshold=0)
    consumer.connection.set_writable(False)  # messages stage but cannot be written yet
    producer.send("/queue/q", b"first")
    producer.send("/queue/q", b"short-lived", expires=clock.time_ms() + 500)
    producer.send("/queue/q", b"third")
    clock.advance(1.0)
    consumer.connection.set_writable(True)
    assert bodies(consumer.take()) == [b"first", b"third"]


def test_expired_message_waiting_for_credit_is_skipped(broker: Broker, clock: FakeClock) -> None:
    producer, consumer = Client(broker), Client(broker)
    consumer.subscribe("/queue/q", prefetch=False)
    producer.send("/queue/q", b"held")
    producer.send("/queue/q", b"short-lived", expires=clock.time_ms() + 200)
    producer.send("/queue/q", b"later")
    (held,) = consumer.take()
    clock.advance(1.0)
    consumer.ack(held)
    assert bodies(consumer.take()) == [b"later"]


def test_paused_since_is_recorded(broker: Broker, clock: FakeClock) -> None:
    producer, consumer = Client(broker), Client(broker)
    subscription = consumer.subscribe("/queue/q", limit=2, threshold=0)
    for _ in range(3):
        producer.send("/queue/q")
    assert subscription.paused_since == clock.monotonic()
    for delivery in consumer.take():
        consumer.ack(delivery)
    assert subscription.paused_since is None
