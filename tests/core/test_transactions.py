"""BEGIN / COMMIT / ABORT covering SENDs and ACKs, in the core."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import pytest

from sluiceway.core.broker import Broker
from sluiceway.errors import BadRequest, ResourceFull
from tests.core.helpers import Client, bodies


def test_sends_are_invisible_until_commit(broker: Broker) -> None:
    producer, consumer = Client(broker), Client(broker)
    consumer.subscribe("/queue/q")
    producer.connection.begin("tx")
    producer.send("/queue/q", b"1", transaction="tx")
    producer.send("/queue/q", b"2", transaction="tx")
    assert consumer.take() == []
    producer.connection.commit("tx")
    assert bodies(consumer.take()) == [b"1", b"2"]


def test_abort_discards_sends(broker: Broker) -> None:
    producer, consumer = Client(broker), Client(broker)
    consumer.subscribe("/queue/q")
    producer.connection.begin("tx")
    producer.send("/queue/q", b"1", transaction="tx")
    producer.connection.abort("tx")
    assert consumer.take() == []
    with pytest.raises(BadRequest, match="not open"):
        producer.connection.commit("tx")


def test_transacted_acks_count_as_unconsumed_until_commit(broker: Broker) -> None:
    producer, consumer = Client(broker), Client(broker)
    for i in range(20):
        producer.send("/queue/q", b"%d" % i)
    consumer.subscribe("/queue/q", limit=10, threshold=50)
    first = consumer.take()
    consumer.connection.begin("tx")
    for delivery in first[:6]:
        consumer.ack(delivery, transaction="tx")
    assert consumer.take() == []  # acknowledged, but not consumed before the COMMIT
    consumer.connection.commit("tx")
    assert len(consumer.take()) == 6


def test_abort_redelivers_what_it_acknowledged(broker: Broker) -> None:
    producer, consumer = Client(broker), Client(broker)
    consumer.subscribe("/queue/q")
    producer.send("/queue/q", b"m")
    (delivery,) = consumer.take()
    consumer.connection.begin("tx")
    consumer.ack(delivery, transaction="tx")
    consumer.connection.abort("tx")
    (again,) = consumer.take()
    assert again.message.body == b"m"
    assert again.delivery_count == 2


def test_transacted_nack_applies_at_commit(broker: Broker) -> None:
    producer, consumer = Client(broker), Client(broker)
    consumer.subscribe("/queue/q")
    producer.send("/queue/q", b"m")
    (delivery,) = consumer.take()
    consumer.connection.begin("tx")
    consumer.nack(delivery, transaction="tx")
    assert consumer.take() == []
    consumer.connection.commit("tx")
    assert bodies(consumer.take()) == [b"m"]


def test_disconnect_aborts_open_transactions(broker: Broker) -> None:
    producer, consumer = Client(broker), Client(broker)
    consumer.subscribe("/queue/q")
    producer.send("/queue/q", b"acked-in-tx")
    (delivery,) = consumer.take()
    consumer.connection.begin("tx")
    consumer.ack(delivery, transaction="tx")
    producer.connection.begin("ptx")
    producer.send("/queue/q", b"never", transaction="ptx")
    producer.connection.close()
    consumer.connection.close()
    other = Client(broker)
    other.subscribe("/queue/q")
    assert bodies(other.take()) == [b"acked-in-tx"]


def test_transaction_limits(make_broker: Callable[[Mapping[str, str]], Broker]) -> None:
    broker = make_broker(
        {
            "imq.transaction.producer.maxNumMsgs": "2",
            "imq.transaction.consumer.maxNumMsgs": "2",
            "imq.stomp.max_transactions": "1",
        }
    )
    producer, consumer = Client(broker), Client(broker)
    producer.connection.begin("tx")
    producer.send("/queue/q", transaction="tx")
    producer.send("/queue/q", transaction="tx")
    with pytest.raises(ResourceFull, match=r"imq\.transaction\.producer\.maxNumMsgs"):
        producer.send("/queue/q", transaction="tx")
    with pytest.raises(ResourceFull, match=r"imq\.stomp\.max_transactions"):
        producer.connection.begin("tx2")
    producer.connection.commit("tx")
    consumer.subscribe("/queue/q")
    delivered = consumer.take()
    consumer.connection.begin("ctx")
    consumer.ack(delivered[0], transaction="ctx")
    consumer.ack(delivered[1], transaction="ctx")
    producer.send("/queue/q")
    (third,) = consumer.take()
    with pytest.raises(ResourceFull, match=r"imq\.transaction\.consumer\.maxNumMsgs"):
        consumer.ack(third, transaction="ctx")
    assert third.message.id in third.subscription.unacked  # refused, not lost


def test_begin_twice_is_refused(broker: Broker) -> None:
    client = Client(broker)
    client.connection.begin("tx")
    with pytest.raises(BadRequest, match="already open"):
        client.connection.begin("tx")
