"""Earliest deadline first: the deadline list against a sorted model over long random histories,
and a queue with deliveryOrder=deadline in the core, on a fake clock."""

from __future__ import annotations

import functools
import random
from pathlib import Path
from typing import Final

import pytest

from sluiceway.config import build_config
from sluiceway.core.broker import Broker
from sluiceway.core.containers.deadlines import DeadlineList
from sluiceway.core.containers.pending import PRIORITY_LEVELS, PendingList
from sluiceway.core.model.queue import Queue
from sluiceway.core.values.memory import MemoryLedger, message_cost
from sluiceway.core.values.message import Message
from sluiceway.naming import parse_destination
from sluiceway.persist.swap import SwapArea
from sluiceway.testing import FakeClock
from tests.core.helpers import Client, bodies
from tests.core.swapping import SEGMENT_SIZE
from tests.core.test_pending import drain, make

START: Final = (PRIORITY_LEVELS, 0)


def delivery_key(message: Message) -> tuple[int, int, int, int]:
    """The order the list promises: deadlines first (earliest first), then priority, arrival."""
    if message.expires:
        return (0, message.expires, -message.priority, message.seq)
    return (1, 0, -message.priority, message.seq)


def test_deadlines_first_earliest_first_then_priority_and_arrival() -> None:
    pending = DeadlineList()
    messages = [
        make(1, priority=4),
        make(2, priority=9),
        make(3, priority=4, expires=5_000),
        make(4, priority=1, expires=2_000),
        make(5, priority=9, expires=5_000),
        make(6, priority=4, expires=5_000),
        make(7, priority=4),
    ]
    for message in messages:
        pending.append(message)
    assert len(pending) == 7
    assert [m.seq for m in pending] == [4, 5, 3, 6, 2, 1, 7]  # inspection shows the order too
    assert [m.seq for m in drain(pending)] == [4, 5, 3, 6, 2, 1, 7]


def test_browsing_and_selectors_see_every_message() -> None:
    pending = DeadlineList()
    for seq, expires in enumerate([0, 900, 0, 100, 500], start=1):
        pending.append(make(seq, priority=4, expires=expires))
    assert [m.seq for m in pending.following(START, 10)] == [1, 2, 3, 4, 5]  # browse order
    assert [m.seq for m in pending.following((4, 2), 2)] == [3, 4]
    taken: list[int] = []

    def choose(message: Message) -> bool:
        if message.seq % 2:
            taken.append(message.seq)
            return True
        return False

    assert pending.extract(choose, lambda: False) == 3
    assert taken == [5, 1, 3]  # in delivery order: deadline 500, then the two without one
    assert [m.seq for m in drain(pending)] == [4, 2]


def test_expired_ones_leave_from_the_top() -> None:
    pending = DeadlineList()
    for seq, expires in enumerate([3_000, 1_000, 0, 2_000], start=1):
        pending.append(make(seq, expires=expires))
    assert [m.seq for m in pending.remove_expired(2_000)] == [2, 4]
    assert [m.seq for m in drain(pending)] == [1, 3]


@pytest.mark.parametrize("lowest_priority", [False, True])
def test_eviction_takes_the_same_message_as_a_fifo_list(lowest_priority: bool) -> None:
    rng = random.Random(7)
    for _ in range(50):
        deadline, fifo = DeadlineList(), PendingList()
        for seq in range(1, 30):
            message = make(seq, priority=rng.randrange(10), expires=rng.choice([0, 0, seq * 7]))
            deadline.append(message)
            fifo.append(message)
        for _ in range(10):
            assert deadline.evict(lowest_priority=lowest_priority) is fifo.evict(
                lowest_priority=lowest_priority
            )


def has_parity(parity: int, message: Message) -> bool:
    return message.seq % 3 == parity


def test_a_long_random_history_against_the_model(tmp_path: Path) -> None:
    """Appends, pops, give-backs, evictions, selector scans and expiry sweeps, with the messages
    without a deadline spilling to a real swap area: the list always holds exactly the model's
    messages, gives them in the model's order, and its counts and the ledger agree."""
    rng = random.Random(2026)
    swap = SwapArea(tmp_path / "swap", segment_size=SEGMENT_SIZE)
    swap.open()
    ledger = MemoryLedger(threshold=message_cost(8) * 40)
    pending = DeadlineList(ledger, swap)
    model: list[Message] = []
    taken: list[Message] = []
    seq = 0
    for step in range(20_000):
        action = rng.random()
        if action < 0.45:
            seq += 1
            expires = rng.choice([0, 0, 1_000 + rng.randrange(50_000)])
            message = make(seq, priority=rng.randrange(10), expires=expires)
            pending.append(message)
            model.append(message)
        elif action < 0.75:
            popped = pending.pop()
            expected = min(model, key=delivery_key, default=None)
            assert popped is expected, step
            if popped is not None:
                model.remove(popped)
                taken.append(popped)
        elif action < 0.85 and taken:
            message = taken.pop(rng.randrange(len(taken)))
            pending.restore(message)
            model.append(message)
        elif action < 0.9:
            lowest = rng.random() < 0.5
            victim = pending.evict(lowest_priority=lowest)
            if victim is not None:
                model.remove(victim)
        elif action < 0.95:
            parity = rng.randrange(3)
            chosen = pending.extract(functools.partial(has_parity, parity), lambda: False)
            removed = [m for m in model if m.seq % 3 == parity]
            assert chosen == len(removed)
            model = [m for m in model if m.seq % 3 != parity]
        else:
            now = rng.randrange(60_000)
            expired = pending.remove_expired(now)
            assert all(m.expired(now) for m in expired)
            for message in expired:
                model.remove(message)
        assert len(pending) == len(model)
        assert pending.bytes == sum(len(m.body) for m in model)
    in_memory = len(model) - pending.spilled
    assert ledger.used == message_cost(8) * in_memory
    assert [m.seq for m in drain(pending)] == [m.seq for m in sorted(model, key=delivery_key)]
    assert ledger.used == 0
    swap.close()


def test_a_deadline_queue_delivers_earliest_deadline_first() -> None:
    clock = FakeClock()
    broker = Broker(build_config({"imq.autocreate.queue.deliveryOrder": "deadline"}), clock=clock)
    producer, consumer = Client(broker), Client(broker)
    now = clock.time_ms()
    for body, ttl in [(b"late", 9_000), (b"none", 0), (b"soon", 1_000), (b"mid", 5_000)]:
        producer.send("/queue/jobs", body, expires=now + ttl if ttl else 0)
    consumer.subscribe("/queue/jobs", limit=1, threshold=0)
    order = []
    for _ in range(4):
        (delivery,) = consumer.take()
        order.append(delivery.message.body)
        consumer.ack(delivery)
    assert order == [b"soon", b"mid", b"late", b"none"]


def test_changing_the_order_reorders_what_is_pending() -> None:
    clock = FakeClock()
    broker = Broker(build_config({}), clock=clock)
    producer, consumer = Client(broker), Client(broker)
    now = clock.time_ms()
    for body, ttl in [(b"a", 9_000), (b"b", 0), (b"c", 1_000)]:
        producer.send("/queue/switch", body, expires=now + ttl if ttl else 0)
    name = parse_destination("/queue/switch")
    broker.update_destination(name, {"deliveryOrder": "deadline"})
    queue = broker.destination(name)
    assert isinstance(queue, Queue)
    assert isinstance(queue.pending, DeadlineList)
    consumer.subscribe("/queue/switch")
    assert bodies(consumer.take()) == [b"c", b"a", b"b"]
    broker.update_destination(name, {"deliveryOrder": "fifo"})
    assert not isinstance(queue.pending, DeadlineList)


def test_deadline_misses_count_expired_and_late() -> None:
    clock = FakeClock()
    broker = Broker(build_config({"imq.autocreate.queue.deliveryOrder": "deadline"}), clock=clock)
    producer, consumer = Client(broker), Client(broker)
    now = clock.time_ms()
    producer.send("/queue/miss", b"expires", expires=now + 100)
    producer.send("/queue/miss", b"late", expires=now + 10_000)
    producer.send("/queue/miss", b"in time", expires=now + 20_000)
    clock.advance(1.0)  # the first can no longer be met: it expires instead of being delivered
    consumer.subscribe("/queue/miss")
    late, in_time = consumer.take()
    assert bodies([late, in_time]) == [b"late", b"in time"]
    clock.advance(10.0)
    consumer.ack(late)
    consumer.ack(in_time)
    stats = broker.destination(parse_destination("/queue/miss")).stats
    assert (stats.expired, stats.late) == (1, 1)


def test_a_message_the_consumer_cannot_finish_in_time_expires_at_once() -> None:
    """Under deadline order, a consumer measured at 100 ms a message is given a message due in
    400 ms while it holds one (done in about 200 ms: 305 judged on the safe side), but not one
    due in 400 ms while it holds two (300 ms: 455 judged): that one expires (to the dead
    message queue) and the next, due in a minute, is given."""
    clock = FakeClock()
    broker = Broker(build_config({"imq.autocreate.queue.deliveryOrder": "deadline"}), clock=clock)
    producer, consumer = Client(broker), Client(broker)
    sub = consumer.subscribe("/queue/sla", limit=5, threshold=100)
    for _ in range(3):
        producer.send("/queue/sla", b"work")
    held = consumer.take()
    for delivery in held[:2]:  # two consumed, 100 ms each: its pace
        clock.advance(0.1)
        consumer.ack(delivery)
    assert sub.pace == pytest.approx(0.1, rel=0.01)
    now = clock.time_ms()
    producer.send("/queue/sla", b"due soon", expires=now + 400)
    producer.send("/queue/sla", b"due later", expires=now + 10_000)
    assert bodies(consumer.take()) == [b"due soon", b"due later"]
    producer.send("/queue/sla", b"hopeless", expires=now + 500)
    producer.send("/queue/sla", b"fine", expires=now + 60_000)
    assert consumer.take() == []  # its window is used up
    clock.advance(0.1)
    consumer.ack(held[2])  # room again, two held: "hopeless" would be done too late
    assert bodies(consumer.take()) == [b"fine"]
    queue = broker.destination(parse_destination("/queue/sla"))
    assert queue.stats.expired == 1
    dmq = broker.destination(parse_destination("/queue/mq.sys.dmq"))
    assert dmq.pending_count == 1


def test_fifo_order_never_expires_early() -> None:
    clock = FakeClock()
    broker = Broker(build_config({}), clock=clock)
    producer, consumer = Client(broker), Client(broker)
    consumer.subscribe("/queue/plain", limit=5, threshold=100)
    for _ in range(3):
        producer.send("/queue/plain", b"work")
    held = consumer.take()
    clock.advance(1.0)
    consumer.ack(held[0])
    producer.send("/queue/plain", b"tight", expires=clock.time_ms() + 10)
    assert bodies(consumer.take()) == [b"tight"]  # delivered: JMS expiry is about delivery
