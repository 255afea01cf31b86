"""The value classes of the compiled path that write out what a named tuple gave them (a named
tuple's __new__ is interpreted Python in the compiled build): equality and a readable repr."""

from __future__ import annotations

from sluiceway.core.broker import Broker
from sluiceway.core.model.holding import Sent
from sluiceway.core.model.subscription import Delivery
from sluiceway.naming import parse_destination
from sluiceway.session.headers import SendRequest

from .helpers import Client


def request(priority: int = 4) -> SendRequest:
    return SendRequest(
        destination=parse_destination("/queue/a"),
        priority=priority,
        expires=0,
        persistent=True,
        transaction=None,
        headers=(("k", "v"),),
    )


def test_a_send_request_compares_and_prints_by_its_fields() -> None:
    assert request() == request()
    assert request() != request(priority=9)
    assert hash(request()) == hash(request())
    shown = repr(request())
    assert shown.startswith("SendRequest(")
    assert "priority=4" in shown
    assert "headers=(('k', 'v'),)" in shown


def test_a_sent_and_a_delivery_compare_and_print_by_their_fields(broker: Broker) -> None:
    consumer, producer = Client(broker), Client(broker)
    subscription = consumer.subscribe("/queue/a", "s1")
    producer.send("/queue/a", b"one")
    (delivery,) = consumer.take()
    message = delivery.message
    assert delivery == Delivery(subscription, message, 1)
    assert delivery != Delivery(subscription, message, 2)
    assert hash(delivery) == hash(Delivery(subscription, message, 1))
    shown = f"Delivery(subscription='s1', message={message.id!r}, delivery_count=1)"
    assert repr(delivery) == shown
    assert Sent(message, None) == Sent(message, None)
    assert hash(Sent(message, None)) == hash(Sent(message, None))
    assert repr(Sent(message, None)).startswith(f"Sent(message=Message(id={message.id!r}")
