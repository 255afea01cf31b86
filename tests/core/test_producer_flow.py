"""Producer flow control in the core: held SENDs, release order, deadlines, pauses, memory."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import pytest

from sluiceway.core.broker import Broker, PauseTarget
from sluiceway.core.model.subscription import AckMode
from sluiceway.core.values.memory import MemoryLevel
from sluiceway.errors import ResourceFull
from sluiceway.naming import parse_destination
from sluiceway.testing import FakeClock
from tests.core.helpers import Client, bodies

MakeBroker = Callable[[Mapping[str, str]], Broker]
Q = "/queue/q"


def flow_controlled(make_broker: MakeBroker, limit: int = 2, **extra: str) -> Broker:
    return make_broker(
        {
            "imq.destination.queue.q.maxNumMsgs": str(limit),
            "imq.destination.queue.q.limitBehavior": "FLOW_CONTROL",
            **extra,
        }
    )


def test_a_full_flow_controlled_queue_holds_the_send_until_there_is_room(
    make_broker: MakeBroker,
) -> None:
    broker = flow_controlled(make_broker)
    producer, consumer = Client(broker), Client(broker)
    for body in (b"1", b"2", b"3"):
        producer.send(Q, body, persistent=True)
    assert len(producer.held) == 1
    assert producer.outcomes == []  # nothing refused, nothing accepted yet
    consumer.subscribe(Q, limit=1)
    (first,) = consumer.take()
    assert producer.outcomes == []  # delivered but not acknowledged: still full
    consumer.ack(first)
    assert [error for _, error in producer.outcomes] == [None]  # accepted: its receipt is due
    assert bodies(consumer.take()) == [b"2"]


def test_later_sends_of_a_held_connection_wait_behind_in_order(make_broker: MakeBroker) -> None:
    broker = flow_controlled(make_broker, limit=1)
    producer = Client(broker)
    producer.send(Q, b"1")
    producer.send(Q, b"2")  # held: the queue is full
    producer.send("/queue/other", b"x")  # held behind it: one producer's SENDs keep their order
    assert len(producer.held) == 2
    assert broker.registry.get(parse_destination("/queue/other")) is not None
    consumer = Client(broker)
    consumer.subscribe(Q, ack=AckMode.AUTO)
    assert bodies(consumer.take()) == [b"1"]  # consumed as written: room for the held one
    assert bodies(consumer.take()) == [b"2"]
    other = Client(broker)
    other.subscribe("/queue/other", ack=AckMode.AUTO)
    assert bodies(other.take()) == [b"x"]
    assert [error for _, error in producer.outcomes] == [None, None]


def test_producing_and_consuming_on_one_connection_completes(make_broker: MakeBroker) -> None:
    """The case that deadlocks brokers which stop reading a flow-controlled connection: one
    connection fills the queue it consumes with client acknowledgements."""
    broker = flow_controlled(make_broker, limit=10)
    client = Client(broker)
    client.subscribe(Q, limit=5)
    received: list[bytes] = []
    for i in range(100):
        client.send(Q, b"%d" % i, persistent=True)
        for delivery in client.take():
            received.append(delivery.message.body)
            client.ack(delivery)
    while len(received) < 100:
        deliveries = client.take()
        assert deliveries, f"stalled after {len(received)} messages"
        for delivery in deliveries:
            received.append(delivery.message.body)
            client.ack(delivery)
    assert received == [b"%d" % i for i in range(100)]
    assert all(error is None for _, error in client.outcomes)


def test_held_producers_resume_in_the_order_they_were_paused(make_broker: MakeBroker) -> None:
    broker = flow_controlled(make_broker, limit=3)
    filler = Client(broker)
    for _ in range(3):
        filler.send(Q, b"fill")
    producers = [Client(broker) for _ in range(3)]
    for index, producer in enumerate(producers):
        producer.send(Q, b"p%d" % index)
    held = broker.producers.held()
    assert [h.connection for h in held] == [p.connection.number for p in producers]
    consumer = Client(broker)
    consumer.subscribe(Q, ack=AckMode.AUTO, limit=1, threshold=0)
    order: list[bytes] = []
    while len(order) < 6:
        order.extend(bodies(consumer.take(1)))
    assert order == [b"fill", b"fill", b"fill", b"p0", b"p1", b"p2"]


def test_room_goes_to_held_producers_before_a_newcomer(make_broker: MakeBroker) -> None:
    """A consumer's ACK and another producer's SEND can arrive in one read, before the broker
    releases anything: the held producer still gets the room first."""
    broker = flow_controlled(make_broker, limit=1)
    waiting, newcomer, consumer = Client(broker), Client(broker), Client(broker)
    waiting.send(Q, b"first")
    waiting.send(Q, b"held")
    consumer.subscribe(Q, limit=1)
    (delivery,) = consumer.take()
    consumer.connection.ack(delivery.subscription, delivery.message.id, None)  # no settle yet
    held = newcomer.connection.send(
        parse_destination(Q), b"newcomer", (), priority=4, expires=0, persistent=True
    ).held
    assert held is not None  # it waits behind the producer already waiting
    assert held.reason.limit == "maxNumMsgs"
    broker.settle()
    assert [error for _, error in waiting.outcomes] == [None]
    assert bodies(consumer.take()) == [b"held"]


def test_release_rounds_share_room_by_producer_batch(make_broker: MakeBroker) -> None:
    """Under FLOW_CONTROL each held connection takes at most maxNumMsgs / maxNumProducers per
    round (Open MQ's producer batch), so the first released cannot take all the room."""
    broker = flow_controlled(
        make_broker, limit=4, **{"imq.destination.queue.q.maxNumProducers": "2"}
    )
    first, second = Client(broker), Client(broker)
    for i in range(4):
        first.send(Q, b"a%d" % i)
    for i in range(4):
        first.send(Q, b"A%d" % i)  # held
    for i in range(4):
        second.send(Q, b"B%d" % i)  # held
    broker.purge(parse_destination(Q))  # room for 4 at once
    consumer = Client(broker)
    consumer.subscribe(Q, ack=AckMode.AUTO, limit=4)
    assert bodies(consumer.take()) == [b"A0", b"A1", b"B0", b"B1"]


def test_every_held_producer_has_a_visible_reason(
    make_broker: MakeBroker, clock: FakeClock
) -> None:
    broker = flow_controlled(make_broker, limit=1)
    producer = Client(broker)
    producer.send(Q, b"1")
    clock.advance(3)
    producer.send(Q, b"2", persistent=True)
    (held,) = broker.producers.held()
    assert held.connection == producer.connection.number
    assert (held.destination, held.limit, held.reason) == (Q, "maxNumMsgs", "destination full")
    assert "maxNumMsgs is 1 messages" in held.detail
    assert held.since == clock.monotonic()
    assert (held.held_sends, held.held_bytes) == (1, 1)


def test_a_held_send_fails_after_the_deadline_saying_why(
    make_broker: MakeBroker, clock: FakeClock
) -> None:
    broker = flow_controlled(make_broker, limit=1, **{"imq.producer.hold.timeout": "5000"})
    producer = Client(broker)
    producer.send(Q, b"1")
    producer.send(Q, b"2", persistent=True)
    clock.advance(4.9)
    broker.tick()
    assert producer.outcomes == []
    clock.advance(0.2)
    broker.tick()
    ((_, error),) = producer.outcomes
    assert isinstance(error, ResourceFull)
    assert error.limit == "maxNumMsgs"
    assert "held for 5.1 s" in str(error)
    assert "imq.producer.hold.timeout (5000 ms)" in str(error)
    assert broker.producers.held() == []


def test_closing_a_connection_drops_its_held_sends(make_broker: MakeBroker) -> None:
    broker = flow_controlled(make_broker, limit=1)
    producer = Client(broker)
    producer.send(Q, b"1")
    producer.send(Q, b"2")
    producer.connection.close()
    assert broker.producers.held() == []
    assert broker.destination(parse_destination(Q)).producers == set()
    consumer = Client(broker)
    consumer.subscribe(Q, ack=AckMode.AUTO)
    assert bodies(consumer.take()) == [b"1"]


def test_a_transaction_is_not_held_and_is_refused_whole(make_broker: MakeBroker) -> None:
    broker = make_broker(
        {
            "imq.destination.queue.flow.maxNumMsgs": "1",
            "imq.destination.queue.flow.limitBehavior": "FLOW_CONTROL",
            "imq.destination.queue.reject.maxNumMsgs": "1",
        }
    )
    producer = Client(broker)
    producer.connection.begin("t1")
    producer.send("/queue/flow", b"1", transaction="t1")
    producer.send("/queue/flow", b"2", transaction="t1")
    producer.connection.commit("t1")  # FLOW_CONTROL: committed messages are accepted
    assert broker.destination(parse_destination("/queue/flow")).pending_count == 2
    producer.connection.begin("t2")
    producer.send("/queue/reject", b"1", transaction="t2")
    producer.send("/queue/reject", b"2", transaction="t2")
    with pytest.raises(ResourceFull, match="rolled back"):
        producer.connection.commit("t2")
    assert broker.destination(parse_destination("/queue/reject")).pending_count == 0


# -- pause and resume -----------------------------------------------------------------------------


def test_pause_producers_holds_sends_and_resume_releases_them(broker: Broker) -> None:
    name = parse_destination(Q)
    producer = Client(broker)
    producer.send(Q, b"before")
    broker.pause(name, PauseTarget.PRODUCERS)
    producer.send(Q, b"during", persistent=True)
    (held,) = broker.producers.held()
    assert held.reason == "producers paused"
    consumer = Client(broker)
    consumer.subscribe(Q, ack=AckMode.AUTO)
    assert bodies(consumer.take()) == [b"before"]  # consumers go on
    broker.resume(name, PauseTarget.PRODUCERS)
    assert bodies(consumer.take()) == [b"during"]
    assert [error for _, error in producer.outcomes] == [None]


def test_pause_consumers_stops_delivery_until_resumed(broker: Broker) -> None:
    name = parse_destination(Q)
    consumer = Client(broker)
    consumer.subscribe(Q, ack=AckMode.AUTO)
    broker.pause(name, PauseTarget.CONSUMERS)
    producer = Client(broker)
    producer.send(Q, b"1")
    assert producer.held == []  # producers go on
    assert consumer.take() == []
    broker.resume(name, PauseTarget.CONSUMERS)
    assert bodies(consumer.take()) == [b"1"]


def test_pause_all_on_a_topic(broker: Broker) -> None:
    name = parse_destination("/topic/t")
    subscriber = Client(broker)
    subscriber.subscribe("/topic/t", ack=AckMode.AUTO)
    broker.pause(name)
    producer = Client(broker)
    producer.send("/topic/t", b"1")
    assert len(producer.held) == 1
    assert subscriber.take() == []
    broker.resume(name)
    assert bodies(subscriber.take()) == [b"1"]


# -- memory levels --------------------------------------------------------------------------------


def test_memory_levels_follow_the_ledger(make_broker: MakeBroker) -> None:
    broker = make_broker({"imq.memory.budget": "100k", "imq.memory.hysteresis": "0"})
    ledger = broker.ledger
    producer = Client(broker)
    body = b"x" * 1000  # 1400 bytes each in the ledger
    levels = []
    for _ in range(71):
        producer.send(Q, body, report=True)
        levels.append(ledger.check())
    assert levels[57] is MemoryLevel.GREEN  # 58 x 1400 = 81,200 < 80 % of 102,400 = 81,920
    assert levels[58] is MemoryLevel.YELLOW  # 59 x 1400 = 82,600
    assert levels[65] is MemoryLevel.ORANGE  # 66 x 1400 = 92,400 >= 92,160
    assert ledger.credit == 50


def test_red_holds_producers_refuses_new_ones_and_recovers(make_broker: MakeBroker) -> None:
    broker = make_broker({"imq.memory.budget": "100k"})
    producer = Client(broker)
    body = b"x" * 1000
    while broker.ledger.check() is not MemoryLevel.RED:
        producer.send(Q, body)
    producer.send(Q, body, persistent=True)
    (held,) = broker.producers.held()
    assert (held.reason, held.limit) == ("memory low", "imq.memory.budget")
    with pytest.raises(ResourceFull, match="new producers are refused"):
        Client(broker).send(Q, body, persistent=True)
    consumer = Client(broker)
    consumer.subscribe(Q, ack=AckMode.AUTO, limit=10)
    consumer.take()  # 10 consumed: below RED again
    assert broker.ledger.level is not MemoryLevel.RED
    assert [error for _, error in producer.outcomes] == [None]


def test_the_ledger_returns_to_zero_when_everything_is_consumed(broker: Broker) -> None:
    producer = Client(broker)
    queue_consumer, topic_consumer = Client(broker), Client(broker)
    queue_consumer.subscribe(Q, limit=3)
    topic_consumer.subscribe("/topic/t", ack=AckMode.CLIENT, limit=3)
    for i in range(10):
        producer.send(Q, b"q%d" % i)
        producer.send("/topic/t", b"t%d" % i)
    browser = Client(broker)
    browser.connection.subscribe(
        "b",
        parse_destination(Q),
        AckMode.AUTO,
        requested_limit=2,
        threshold=50,
        prefetch=True,
        browser=True,
    )
    browser.take()
    assert broker.ledger.used > 0
    for _ in range(10):
        for delivery in queue_consumer.take():
            queue_consumer.ack(delivery)
        deliveries = topic_consumer.take()
        if deliveries:
            topic_consumer.ack(deliveries[-1])
    browser.connection.close()
    assert broker.ledger.used == 0
    assert broker.context.system.count == 0
