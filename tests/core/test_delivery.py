"""Queues, topics, dispatch policies, acknowledgements and redelivery in the core."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import pytest

from sluiceway.config import BrokerConfig
from sluiceway.core.broker import Broker
from sluiceway.core.model.queue import Queue
from sluiceway.core.model.store import MemoryStore
from sluiceway.core.model.subscription import AckMode
from sluiceway.core.values.selector import compile_selector
from sluiceway.errors import BadRequest, Conflict, Forbidden, NotFound, Status
from sluiceway.naming import parse_destination
from sluiceway.testing import FakeClock
from tests.core.helpers import ANY_SIZE, Client, bodies


def distribute(broker: Broker, count: int, consumers: int) -> list[int]:
    """Send `count` messages to a queue with `consumers` ready consumers; how many each gets."""
    producer = Client(broker)
    clients = [Client(broker) for _ in range(consumers)]
    for client in clients:
        client.subscribe("/queue/work", limit=1000)
    for i in range(count):
        producer.send("/queue/work", b"%d" % i)
    return [len(client.take()) for client in clients]


def test_openmq_policy_first_ready_consumer_takes_its_window(broker: Broker) -> None:
    assert distribute(broker, 100, 4) == [100, 0, 0, 0]


def test_fair_policy_spreads_a_small_backlog(
    make_broker: Callable[[Mapping[str, str]], Broker],
) -> None:
    broker = make_broker({"imq.autocreate.queue.dispatchPolicy": "fair"})
    assert distribute(broker, 100, 4) == [25, 25, 25, 25]


def test_fair_policy_favours_the_consumer_with_least_outstanding(
    make_broker: Callable[[Mapping[str, str]], Broker],
) -> None:
    broker = make_broker({"imq.autocreate.queue.dispatchPolicy": "fair"})
    producer, busy, idle = Client(broker), Client(broker), Client(broker)
    busy.subscribe("/queue/work")
    for i in range(4):
        producer.send("/queue/work", b"%d" % i)
    assert len(busy.take()) == 4
    idle.subscribe("/queue/work")
    for i in range(4, 10):
        producer.send("/queue/work", b"%d" % i)
    # The newcomer has nothing outstanding, so it takes turns only once it has caught up.
    assert (len(busy.take()), len(idle.take())) == (1, 5)


def test_openmq_policy_moves_on_when_the_first_window_is_full(broker: Broker) -> None:
    producer, first, second = Client(broker), Client(broker), Client(broker)
    first.subscribe("/queue/work", limit=30)
    second.subscribe("/queue/work", limit=30)
    for i in range(50):
        producer.send("/queue/work", b"%d" % i)
    assert (len(first.take()), len(second.take())) == (30, 20)


def test_queue_delivers_each_message_once_in_order(broker: Broker) -> None:
    producer, consumer = Client(broker), Client(broker)
    consumer.subscribe("/queue/q")
    for i in range(20):
        producer.send("/queue/q", b"%d" % i)
    assert bodies(consumer.take()) == [b"%d" % i for i in range(20)]


def test_priority_higher_first_then_fifo(broker: Broker) -> None:
    producer, consumer = Client(broker), Client(broker)
    for body, priority in [(b"a", 4), (b"b", 9), (b"c", 0), (b"d", 9), (b"e", 4)]:
        producer.send("/queue/q", body, priority=priority)
    consumer.subscribe("/queue/q")
    assert bodies(consumer.take()) == [b"b", b"d", b"a", b"e", b"c"]


def test_topic_reaches_every_subscriber_present(broker: Broker) -> None:
    producer, one, two = Client(broker), Client(broker), Client(broker)
    producer.send("/topic/t", b"before anyone")
    one.subscribe("/topic/t")
    two.subscribe("/topic/t")
    producer.send("/topic/t", b"m1")
    late = Client(broker)
    late.subscribe("/topic/t")
    producer.send("/topic/t", b"m2")
    assert bodies(one.take()) == [b"m1", b"m2"]
    assert bodies(two.take()) == [b"m1", b"m2"]
    assert bodies(late.take()) == [b"m2"]
    topic = one.connection.subscriptions["s1"].destination
    assert topic.stats.discarded == 1


def test_nack_redelivers_with_count(broker: Broker) -> None:
    producer, consumer = Client(broker), Client(broker)
    consumer.subscribe("/queue/q")
    producer.send("/queue/q", b"m")
    (first,) = consumer.take()
    assert first.delivery_count == 1
    consumer.nack(first)
    (second,) = consumer.take()
    assert second.message.body == b"m"
    assert second.delivery_count == 2


def test_topic_nack_redelivers_to_that_subscriber_only(broker: Broker) -> None:
    producer, one, two = Client(broker), Client(broker), Client(broker)
    one.subscribe("/topic/t")
    two.subscribe("/topic/t")
    producer.send("/topic/t", b"m")
    (to_one,) = one.take()
    (to_two,) = two.take()
    one.nack(to_one)
    (again,) = one.take()
    assert again.delivery_count == 2
    assert to_two.delivery_count == 1
    assert two.take() == []


def test_client_ack_is_cumulative_and_nack_too(broker: Broker) -> None:
    producer, consumer = Client(broker), Client(broker)
    consumer.subscribe("/queue/q", ack=AckMode.CLIENT)
    for i in range(6):
        producer.send("/queue/q", b"%d" % i)
    delivered = consumer.take()
    assert consumer.ack(delivered[2]) == 3
    assert consumer.nack(delivered[4]) == 2  # messages 3 and 4
    assert bodies(consumer.take()) == [b"3", b"4"]
    with pytest.raises(BadRequest):
        consumer.ack(delivered[0])  # already acknowledged


def test_client_individual_ack_leaves_others(broker: Broker) -> None:
    producer, consumer = Client(broker), Client(broker)
    subscription = consumer.subscribe("/queue/q")
    for i in range(3):
        producer.send("/queue/q", b"%d" % i)
    delivered = consumer.take()
    consumer.ack(delivered[1])
    assert [m.body for m in subscription.unacked.values()] == [b"0", b"2"]


def test_ack_on_auto_subscription_is_refused(broker: Broker) -> None:
    producer, consumer = Client(broker), Client(broker)
    consumer.subscribe("/queue/q", ack=AckMode.AUTO)
    producer.send("/queue/q")
    (delivery,) = consumer.take()
    with pytest.raises(BadRequest, match="ack:auto"):
        consumer.ack(delivery)


def test_disconnect_returns_unacked_for_redelivery(broker: Broker) -> None:
    producer, first = Client(broker), Client(broker)
    first.subscribe("/queue/q")
    for i in range(3):
        producer.send("/queue/q", b"%d" % i)
    delivered = first.take()
    first.ack(delivered[0])
    first.connection.close()
    second = Client(broker)
    second.subscribe("/queue/q")
    again = second.take()
    assert bodies(again) == [b"1", b"2"]
    assert [d.delivery_count for d in again] == [2, 2]


def test_redelivered_message_returns_to_its_place(broker: Broker) -> None:
    producer, consumer = Client(broker), Client(broker)
    consumer.subscribe("/queue/q", limit=2, threshold=0)
    for i in range(4):
        producer.send("/queue/q", b"%d" % i)
    first = consumer.take()
    consumer.nack(first[1])
    consumer.nack(first[0])
    assert bodies(consumer.take()) == [b"0", b"1"]


def test_unsubscribe_hands_staged_messages_to_other_consumers(broker: Broker) -> None:
    producer, first, second = Client(broker), Client(broker), Client(broker)
    first.subscribe("/queue/q")
    second.subscribe("/queue/q")
    for i in range(5):
        producer.send("/queue/q", b"%d" % i)
    first.connection.unsubscribe("s1")  # nothing was written yet
    taken = second.take()
    assert bodies(taken) == [b"%d" % i for i in range(5)]
    assert all(d.delivery_count == 1 for d in taken)


def test_round_robin_between_subscriptions_of_one_connection(broker: Broker) -> None:
    producer, consumer = Client(broker), Client(broker)
    for i in range(3):
        producer.send("/queue/a", b"a%d" % i)
        producer.send("/queue/b", b"b%d" % i)
    consumer.subscribe("/queue/a", "sa")
    consumer.subscribe("/queue/b", "sb")
    assert bodies(consumer.take()) == [b"a0", b"b0", b"a1", b"b1", b"a2", b"b2"]


def test_take_stops_once_the_bodies_reach_the_byte_budget(broker: Broker) -> None:
    producer, consumer = Client(broker), Client(broker)
    consumer.subscribe("/queue/sized")
    for i in range(6):
        producer.send("/queue/sized", bytes([i]) * 64)
    # 64 + 64 reach 100: two; a budget smaller than one body still takes one; none left over.
    assert [d.message.body[0] for d in consumer.connection.take(10, 100)] == [0, 1]
    assert [d.message.body[0] for d in consumer.connection.take(10, 1)] == [2]
    assert [d.message.body[0] for d in consumer.connection.take(10, ANY_SIZE)] == [3, 4, 5]


def test_take_respects_the_limit_and_on_ready_fires(broker: Broker) -> None:
    producer, consumer = Client(broker), Client(broker)
    consumer.subscribe("/queue/q")
    assert consumer.ready_calls == 0
    for i in range(25):
        producer.send("/queue/q", b"%d" % i)
    assert consumer.ready_calls == 1
    assert len(consumer.connection.take(10, ANY_SIZE)) == 10
    assert consumer.connection.has_pending_output


def test_expired_message_is_never_delivered(broker: Broker, clock: FakeClock) -> None:
    producer, consumer = Client(broker), Client(broker)
    producer.send("/queue/q", b"old", expires=clock.time_ms() - 1)
    producer.send("/queue/q", b"fresh", expires=clock.time_ms() + 60_000)
    consumer.subscribe("/queue/q")
    assert bodies(consumer.take()) == [b"fresh"]


def test_sweep_removes_expired_pending_messages(broker: Broker, clock: FakeClock) -> None:
    producer = Client(broker)
    for i in range(5):
        producer.send("/queue/q", b"%d" % i, expires=clock.time_ms() + 1000 * (i + 1))
    clock.advance(2.5)
    assert broker.sweep_expired() == 2
    queue = broker.destination(parse_destination("/queue/q"))
    assert queue.pending_count == 3
    assert queue.stats.expired == 2


def test_tick_sweeps_on_the_configured_interval(broker: Broker, clock: FakeClock) -> None:
    producer = Client(broker)
    producer.send("/queue/q", expires=clock.time_ms() + 1000)
    clock.advance(30)
    broker.tick()
    assert (
        broker.destination(parse_destination("/queue/q")).pending_count == 1
    )  # swept only every 60 s
    clock.advance(31)
    broker.tick()
    assert broker.destination(parse_destination("/queue/q")).pending_count == 0


def test_stalled_connection_gives_staged_messages_back(broker: Broker, clock: FakeClock) -> None:
    producer, stalled, healthy = Client(broker), Client(broker), Client(broker)
    stalled.subscribe("/queue/q")
    for i in range(10):
        producer.send("/queue/q", b"%d" % i)
    stalled.connection.set_writable(False)
    healthy.subscribe("/queue/q")
    assert healthy.take() == []  # everything sits staged on the stalled connection
    clock.advance(6)
    broker.tick()
    assert len(healthy.take()) == 10


def test_persistent_queue_messages_are_given_to_the_store(clock: FakeClock) -> None:
    store = MemoryStore()
    broker = Broker(BrokerConfig(), clock=clock, store=store)
    producer, consumer = Client(broker), Client(broker)
    producer.send("/queue/q", b"p", persistent=True)
    producer.send("/queue/q", b"n", persistent=False)
    assert len(store) == 1
    consumer.subscribe("/queue/q")
    for delivery in consumer.take():
        consumer.ack(delivery)
    assert len(store) == 0


def test_duplicate_subscription_id_conflicts(broker: Broker) -> None:
    consumer = Client(broker)
    consumer.subscribe("/queue/q")
    with pytest.raises(Conflict) as raised:
        consumer.subscribe("/queue/other")
    assert raised.value.status is Status.CONFLICT


def test_autocreate_off_refuses_unknown_destinations(
    make_broker: Callable[[Mapping[str, str]], Broker],
) -> None:
    broker = make_broker({"imq.autocreate.queue": "false"})
    client = Client(broker)
    with pytest.raises(NotFound, match=r"imq\.autocreate\.queue is false"):
        client.send("/queue/nowhere")
    client.send("/topic/fine")


def test_system_names_are_reserved(broker: Broker) -> None:
    with pytest.raises(Forbidden):
        Client(broker).send("/queue/mq.sys.mine")


def test_unknown_subscription_on_unsubscribe(broker: Broker) -> None:
    with pytest.raises(BadRequest, match="'nope'"):
        Client(broker).connection.unsubscribe("nope")


def test_selective_consumers_take_only_what_matches(broker: Broker) -> None:
    producer, eu, us = Client(broker), Client(broker), Client(broker)
    for i, region in enumerate(["EU", "US", "EU", "ASIA", "US"]):
        producer.connection.send(
            parse_destination("/queue/r"),
            b"%d" % i,
            (("region", region),),
            priority=4,
            expires=0,
            persistent=False,
        )
    for client, region in ((eu, "EU"), (us, "US")):
        client.connection.subscribe(
            "s",
            parse_destination("/queue/r"),
            AckMode.CLIENT_INDIVIDUAL,
            requested_limit=10,
            threshold=50,
            prefetch=True,
            selector=compile_selector(f"region = '{region}'"),
        )
    assert bodies(eu.take()) == [b"0", b"2"]
    assert bodies(us.take()) == [b"1", b"4"]
    queue = broker.registry.get(parse_destination("/queue/r"))
    assert isinstance(queue, Queue)
    assert [m.body for m in queue.pending] == [b"3"]  # nobody matches ASIA: it stays


def test_browser_walks_the_queue_and_ends_with_a_marker(broker: Broker) -> None:
    producer, browser = Client(broker), Client(broker)
    for i in range(5):
        producer.send("/queue/b", b"%d" % i, priority=9 if i == 3 else 4)
    browser.connection.subscribe(
        "look",
        parse_destination("/queue/b"),
        AckMode.AUTO,
        requested_limit=2,
        threshold=50,
        prefetch=True,
        browser=True,
    )
    seen = browser.take()
    assert bodies(seen[:5]) == [b"3", b"0", b"1", b"2", b"4"]  # delivery order
    assert dict(seen[5].message.headers) == {
        "browser": "end",
        "next-sequence": "6",  # after the highest sequence number the browse returned
        "head-sequence": "5",
        "first-sequence": "1",  # the oldest message waiting
        "message-count": "5",  # browsing took none of them
        "consumer-flow-limit": "1000",  # the queue's consumerFlowLimit
    }
    queue = broker.registry.get(parse_destination("/queue/b"))
    assert queue is not None
    assert queue.pending_count == 5  # nothing consumed
    assert queue.stats.msgs_out == 0


def paced_consumers(broker: Broker, clock: FakeClock) -> tuple[Client, Client, Client]:
    """A fair queue with a slow consumer (5 ms a message) and a fast one (1 ms), both measured,
    then 1,000 more messages: (producer, slow, fast), with what each holds in `received`."""
    producer, slow, fast = Client(broker), Client(broker), Client(broker)
    slow.subscribe("/queue/work", limit=100)
    fast.subscribe("/queue/work", limit=100)
    for i in range(40):
        producer.send("/queue/work", b"%d" % i)
    slow.take()
    fast.take()
    for _ in range(5):
        clock.advance(0.001)
        fast.ack(fast.received.pop(0))
    slow.ack(slow.received.pop(0))  # 5 ms after it was given its first messages
    for i in range(40, 1040):
        producer.send("/queue/work", b"%d" % i)
    slow.take()
    fast.take()
    return producer, slow, fast


def test_fair_policy_gives_a_slow_consumer_only_the_work_a_fast_one_holds(
    make_broker: Callable[[Mapping[str, str]], Broker], clock: FakeClock
) -> None:
    broker = make_broker({"imq.autocreate.queue.dispatchPolicy": "fair"})
    _, slow, fast = paced_consumers(broker, clock)
    # The fast one uses up its window (the 15 it held and 80 of credit: 95 ms of work). The
    # slow one holds what it works off in the time a full window of the fast one takes (100 ms:
    # 20 messages), not a window of its own.
    assert len(fast.received) == 95
    assert 19 <= len(slow.received) <= 21


def test_fair_policy_gives_a_paced_consumer_one_more_for_each_it_acknowledges(
    make_broker: Callable[[Mapping[str, str]], Broker], clock: FakeClock
) -> None:
    broker = make_broker({"imq.autocreate.queue.dispatchPolicy": "fair"})
    _, slow, _ = paced_consumers(broker, clock)
    queue = broker.registry.get(parse_destination("/queue/work"))
    assert isinstance(queue, Queue)
    held, pending = len(slow.received), queue.pending_count
    # Its window (100) has room, so only its pace held it back: each acknowledgement, 5 ms
    # after the last, lets the next message in.
    for _ in range(3):
        clock.advance(0.005)
        slow.ack(slow.received.pop(0))
        slow.take()
        assert len(slow.received) == held
    assert queue.pending_count == pending - 3


def test_fair_policy_without_measurable_pace_counts_outstanding_messages(
    make_broker: Callable[[Mapping[str, str]], Broker],
) -> None:
    # On a clock that does not move, every pace is 0: no consumer may be starved for it.
    broker = make_broker({"imq.autocreate.queue.dispatchPolicy": "fair"})
    producer, first, second = Client(broker), Client(broker), Client(broker)
    first.subscribe("/queue/work", limit=100)
    second.subscribe("/queue/work", limit=100)
    for i in range(10):
        producer.send("/queue/work", b"%d" % i)
    for client in (first, second):
        client.take()
        client.ack(client.received.pop(0))
    for i in range(10, 50):
        producer.send("/queue/work", b"%d" % i)
    assert (len(first.take()), len(second.take())) == (20, 20)


def test_a_batch_hands_its_messages_to_consumers_when_it_closes(broker: Broker) -> None:
    producer, consumer, subscriber = Client(broker), Client(broker), Client(broker)
    queue = consumer.subscribe("/queue/work", limit=3)
    topic = subscriber.subscribe("/topic/news", limit=3)
    work = broker.registry.resolve(parse_destination("/queue/work"))
    later = broker.clock.time_ms() + 3_600_000  # (an expiry time takes the pending list)
    with broker.context.batch:
        for i in range(5):
            producer.send("/queue/work", b"q%d" % i, expires=later)
            producer.send("/topic/news", b"t%d" % i, expires=later)
        # Held back until the batch closes: nothing staged yet, everything pending.
        assert (len(queue.staged), len(topic.staged)) == (0, 0)
        assert work.pending_count == 5
    # Then the same as message by message: each window filled, in order, the rest waiting.
    assert bodies(consumer.take()) == [b"q0", b"q1", b"q2"]
    assert bodies(subscriber.take()) == [b"t0", b"t1", b"t2"]
    assert work.pending_count == 2


def test_a_message_nothing_waits_before_goes_straight_to_a_ready_consumer(
    broker: Broker,
) -> None:
    producer, consumer, subscriber = Client(broker), Client(broker), Client(broker)
    queue = consumer.subscribe("/queue/work", limit=2)
    topic = subscriber.subscribe("/topic/news", limit=2)
    work = broker.registry.resolve(parse_destination("/queue/work"))
    with broker.context.batch:
        for i in range(3):
            producer.send("/queue/work", b"q%d" % i)
            producer.send("/topic/news", b"t%d" % i)
        # Staged at once while the windows had room; the third waits in the pending lists.
        assert (len(queue.staged), len(topic.staged)) == (2, 2)
        assert work.pending_count == 1
    assert broker.ledger.used > 0
    assert bodies(consumer.take()) == [b"q0", b"q1"]
    assert bodies(subscriber.take()) == [b"t0", b"t1"]
    for client in (consumer, subscriber):
        for delivery in client.received:
            client.ack(delivery)
    assert bodies(consumer.take()) == [b"q2"]
    assert bodies(subscriber.take()) == [b"t2"]


def test_batches_nest_and_only_the_outermost_close_hands_over(broker: Broker) -> None:
    producer, consumer = Client(broker), Client(broker)
    consumer.subscribe("/queue/work")
    later = broker.clock.time_ms() + 3_600_000  # (an expiry time takes the pending list)
    with broker.context.batch:
        with broker.context.batch:
            producer.send("/queue/work", b"inner", expires=later)
        assert consumer.take() == []
        producer.send("/queue/work", b"outer", expires=later)
    assert bodies(consumer.take()) == [b"inner", b"outer"]
    producer.send("/queue/work", b"alone", expires=later)  # no batch open: handed over at once
    assert bodies(consumer.take()) == [b"alone"]


def test_auto_acknowledged_messages_are_consumed_a_take_at_a_time(broker: Broker) -> None:
    producer, consumer = Client(broker), Client(broker)
    subscription = consumer.subscribe("/queue/auto", ack=AckMode.AUTO, limit=4, threshold=50)
    for i in range(10):
        producer.send("/queue/auto", b"%d" % i)
    queue = broker.registry.resolve(parse_destination("/queue/auto"))
    first = consumer.connection.take(3, ANY_SIZE)
    # Consumed when written: the window has its credit back and the queue counts them.
    assert bodies(first) == [b"0", b"1", b"2"]
    assert queue.stats.consumed == 3
    assert subscription.window.outstanding == len(subscription.staged)
    assert bodies(consumer.take()) == [b"%d" % i for i in range(3, 10)]
    assert queue.stats.consumed == 10
    assert subscription.window.outstanding == 0
    assert broker.ledger.used == 0
