"""Queue leases in the core: reading, acknowledging, releasing, expiring, and their bounds;
a lease's messages kept in order, spilled to the swap area over the threshold, read back."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from sluiceway.core.broker import Broker
from sluiceway.core.containers.pending import CHUNK_MESSAGES
from sluiceway.core.features.dead_letters import DMQ_NAME
from sluiceway.core.features.leases import LeasedMessages, LeaseRead
from sluiceway.core.model.queue import Queue
from sluiceway.core.model.store import MemoryStore
from sluiceway.core.model.subscription import AckMode, Delivery
from sluiceway.core.values.memory import MemoryLedger, message_cost
from sluiceway.core.values.message import Message
from sluiceway.errors import BadRequest, Gone, NotFound, ResourceFull
from sluiceway.naming import parse_destination
from sluiceway.persist.swap import SwapArea
from sluiceway.testing import FakeClock
from tests.core.helpers import Client, bodies
from tests.core.swapping import assert_swap_empty

MakeBroker = Callable[[Mapping[str, str]], Broker]
Q = "/queue/q"
QUEUE = parse_destination(Q)


def read(
    client: Client, group: str, number: int, path: str = Q, **sizes: Any
) -> tuple[list[Delivery], dict[str, str]]:
    """Read lease GROUP/number as a SUBSCRIBE with the lease header does; return its messages
    and the end marker's headers."""
    sub_id = f"lease-{len(client.connection.subscriptions) + 1}"
    client.connection.subscribe(
        sub_id,
        parse_destination(path),
        AckMode.CLIENT_INDIVIDUAL,  # ignored: a lease read acknowledges nothing
        requested_limit=1000,
        threshold=50,
        prefetch=True,
        lease=LeaseRead(group, number, **sizes),
    )
    taken = client.take()
    client.connection.unsubscribe(sub_id)
    end = dict(taken[-1].message.headers)
    assert end["browser"] == "end"
    return taken[:-1], end


def queue(broker: Broker) -> Queue:
    found = broker.registry.get(QUEUE)
    assert isinstance(found, Queue)
    return found


def fill(client: Client, count: int, path: str = Q) -> None:
    for i in range(count):
        client.send(path, b"%d" % i, persistent=True)


def test_a_lease_takes_the_head_of_the_queue_and_reads_the_same_again(broker: Broker) -> None:
    producer, reader = Client(broker), Client(broker)
    fill(producer, 5)
    messages, end = read(reader, "g", 1, max_messages=3)
    assert bodies(messages) == [b"0", b"1", b"2"]
    assert {dict(d.message.headers)["lease"] for d in messages} == {"g/1"}
    assert [d.delivery_count for d in messages] == [1, 1, 1]
    assert end["lease"] == "g/1"
    assert (end["lease-state"], end["lease-count"]) == ("open", "3")
    assert int(end["lease-expires"]) == broker.clock.time_ms() + 600_000  # imq.lease.ttl
    assert end["message-count"] == "2"  # leased messages are not waiting any more
    assert queue(broker).fullness().count == 5  # ...but they still count in its limits
    again, end = read(reader, "g", 1)
    assert bodies(again) == [b"0", b"1", b"2"]
    assert [d.delivery_count for d in again] == [1, 1, 1]  # reading again delivers nothing new
    assert (end["lease-state"], end["lease-count"]) == ("open", "3")


def test_acknowledging_consumes_and_is_idempotent(broker: Broker) -> None:
    producer, reader = Client(broker), Client(broker)
    fill(producer, 4)
    read(reader, "g", 1, max_messages=3)
    assert broker.leases.acknowledge(QUEUE, "g", 1).value == "acknowledged"
    assert queue(broker).fullness().count == 1
    assert queue(broker).stats.consumed == 3
    assert broker.leases.acknowledge(QUEUE, "g", 1).value == "acknowledged"
    assert broker.leases.release(QUEUE, "g", 1).value == "acknowledged"  # too late to release
    messages, end = read(reader, "g", 1)
    assert messages == []
    assert (end["lease-state"], end["lease-count"]) == ("acknowledged", "0")
    messages, _ = read(reader, "g", 2)
    assert bodies(messages) == [b"3"]


def test_releasing_gives_the_messages_back_redelivered(broker: Broker) -> None:
    producer, reader = Client(broker), Client(broker)
    fill(producer, 3)
    read(reader, "g", 1)
    assert broker.leases.release(QUEUE, "g", 1).value == "expired"
    assert broker.leases.release(QUEUE, "g", 1).value == "expired"  # idempotent
    with pytest.raises(Gone) as gone:
        broker.leases.acknowledge(QUEUE, "g", 1)
    assert gone.value.status == 410
    assert "g/1" in str(gone.value)
    messages, _ = read(reader, "g", 2)
    assert bodies(messages) == [b"0", b"1", b"2"]  # back in their places, in queue order
    assert [d.delivery_count for d in messages] == [2, 2, 2]
    assert queue(broker).stats.redelivered == 3


def test_a_lease_past_its_ttl_expires_on_the_tick(broker: Broker, clock: FakeClock) -> None:
    producer, reader, consumer = Client(broker), Client(broker), Client(broker)
    fill(producer, 2)
    read(reader, "g", 1, ttl_ms=5000)
    consumer.subscribe(Q)
    assert consumer.take() == []  # leased: not for other consumers
    clock.advance(4.9)
    broker.tick()
    assert consumer.take() == []
    clock.advance(0.2)
    broker.tick()
    delivered = consumer.take()
    assert bodies(delivered) == [b"0", b"1"]
    assert [d.delivery_count for d in delivered] == [2, 2]  # as after a NACK
    with pytest.raises(Gone):
        broker.leases.acknowledge(QUEUE, "g", 1)
    assert read(reader, "g", 1)[1]["lease-state"] == "expired"


def test_an_acknowledgement_after_the_deadline_is_refused_before_the_tick(
    broker: Broker, clock: FakeClock
) -> None:
    producer, reader = Client(broker), Client(broker)
    fill(producer, 1)
    read(reader, "g", 1, ttl_ms=1000)
    clock.advance(1.0)
    with pytest.raises(Gone):
        broker.leases.acknowledge(QUEUE, "g", 1)
    assert queue(broker).pending_count == 1


def test_numbers_below_the_highest_are_never_new_leases(broker: Broker) -> None:
    producer, reader = Client(broker), Client(broker)
    fill(producer, 4)
    read(reader, "g", 5, max_messages=1)
    messages, end = read(reader, "g", 3)  # never used, and lower: not a new lease
    assert messages == []
    assert (end["lease-state"], end["lease-count"], end["lease-expires"]) == ("expired", "0", "0")
    assert queue(broker).pending_count == 3
    with pytest.raises(NotFound) as unknown:
        broker.leases.acknowledge(QUEUE, "g", 6)  # above the highest: never read
    assert unknown.value.status == 404
    with pytest.raises(NotFound):
        broker.leases.acknowledge(QUEUE, "other", 1)
    with pytest.raises(Gone):
        broker.leases.acknowledge(QUEUE, "g", 3)


def test_a_lease_read_while_the_queue_is_empty_stays_empty(broker: Broker) -> None:
    producer, reader = Client(broker), Client(broker)
    messages, end = read(reader, "g", 1)
    assert messages == []
    assert (end["lease-state"], end["lease-count"]) == ("open", "0")
    assert end["next-sequence"] == "1"
    fill(producer, 2)
    messages, end = read(reader, "g", 1)
    assert messages == []
    assert end["lease-count"] == "0"
    assert broker.leases.acknowledge(QUEUE, "g", 1).value == "acknowledged"
    assert queue(broker).pending_count == 2


def test_open_leases_per_group_are_capped(make_broker: MakeBroker) -> None:
    broker = make_broker({"imq.lease.max_open": "2"})
    producer, reader = Client(broker), Client(broker)
    fill(producer, 5)
    read(reader, "g", 1, max_messages=1)
    read(reader, "g", 2, max_messages=1)
    with pytest.raises(ResourceFull) as full:
        read(reader, "g", 3, max_messages=1)
    assert (full.value.status, full.value.limit, full.value.limit_value) == (
        414,
        "imq.lease.max_open",
        "2",
    )
    read(reader, "other", 1, max_messages=1)  # the cap is per group
    broker.leases.acknowledge(QUEUE, "g", 1)
    assert bodies(read(reader, "g", 3, max_messages=1)[0]) == [b"3"]


def test_a_group_remembers_a_bounded_number_of_finished_leases(make_broker: MakeBroker) -> None:
    broker = make_broker({"imq.lease.max_open": "2"})
    producer, reader = Client(broker), Client(broker)
    fill(producer, 4)
    for number in range(1, 5):
        read(reader, "g", number, max_messages=1)
        broker.leases.acknowledge(QUEUE, "g", number)
    assert read(reader, "g", 4)[1]["lease-state"] == "acknowledged"
    assert read(reader, "g", 3)[1]["lease-state"] == "acknowledged"
    assert read(reader, "g", 1)[1]["lease-state"] == "expired"  # forgotten
    with pytest.raises(Gone):
        broker.leases.acknowledge(QUEUE, "g", 1)


def test_lease_sizes_by_count_and_bytes(make_broker: MakeBroker) -> None:
    broker = make_broker({"imq.lease.max_messages": "4", "imq.lease.max_bytes": "10"})
    producer, reader = Client(broker), Client(broker)
    for size in (3, 3, 3, 3, 3, 3):
        producer.send(Q, b"x" * size)
    assert len(read(reader, "g", 1, max_messages=100)[0]) == 3  # 9 bytes; a 4th would be 12
    assert len(read(reader, "g", 2, max_messages=100, max_bytes=4)[0]) == 1
    producer.send(Q, b"y" * 50)
    messages, _ = read(reader, "g", 3, max_bytes=1)
    assert bodies(messages) == [b"xxx"]
    # One message is always taken, however large, so a lease can always make progress.
    messages, _ = read(reader, "g", 4, max_bytes=1)
    assert bodies(messages) == [b"xxx"]
    assert bodies(read(reader, "g", 5, max_bytes=1)[0]) == [b"y" * 50]


def test_a_strict_byte_cap_may_leave_a_lease_empty(broker: Broker) -> None:
    producer, reader = Client(broker), Client(broker)
    for size in (3, 3, 8):
        producer.send(Q, b"x" * size)
    messages, end = read(reader, "g", 1, max_bytes=7, strict_bytes=True)
    assert bodies(messages) == [b"xxx", b"xxx"]
    assert (end["lease-count"], end["lease-bytes"]) == ("2", "6")
    messages, end = read(reader, "g", 2, max_bytes=7, strict_bytes=True)
    assert messages == []  # the next message alone exceeds the cap: it stays in the queue
    assert (end["lease-state"], end["lease-count"], end["lease-bytes"]) == ("open", "0", "0")
    assert queue(broker).pending_count == 1


def test_a_lease_made_without_its_messages_is_read_after(broker: Broker) -> None:
    producer, planner, reader = Client(broker), Client(broker), Client(broker)
    fill(producer, 5)
    messages, end = read(planner, "g", 1, max_messages=3, send=False)
    assert messages == []
    assert (end["lease-state"], end["lease-count"], end["lease-high"]) == ("open", "3", "1")
    assert queue(broker).pending_count == 2
    assert bodies(read(reader, "g", 1)[0]) == [b"0", b"1", b"2"]


def test_a_read_that_may_not_create_answers_what_is_there(broker: Broker) -> None:
    producer, reader = Client(broker), Client(broker)
    fill(producer, 3)
    messages, end = read(reader, "g", 7, create=False)
    assert messages == []
    assert (end["lease-state"], end["lease-high"]) == ("unread", "-1")
    assert queue(broker).pending_count == 3  # nothing was taken, no group was made
    read(reader, "g", 4, max_messages=1)
    messages, end = read(reader, "g", 9, create=False)
    assert (end["lease-state"], end["lease-high"]) == ("unread", "4")
    messages, end = read(reader, "g", 4, create=False)
    assert bodies(messages) == [b"0"]  # an existing lease is read as usual
    assert (end["lease-state"], end["lease-high"]) == ("open", "4")
    assert broker.leases.group_count(QUEUE) == 1


def test_the_default_lease_size_is_the_queue_consumer_flow_limit(make_broker: MakeBroker) -> None:
    broker = make_broker({"imq.destination.queue.q.consumerFlowLimit": "2"})
    producer, reader = Client(broker), Client(broker)
    fill(producer, 5)
    messages, end = read(reader, "g", 1)
    assert len(messages) == 2
    assert end["consumer-flow-limit"] == "2"


def test_released_too_often_the_messages_go_to_the_dead_message_queue(
    make_broker: MakeBroker,
) -> None:
    broker = make_broker({"imq.destination.queue.q.maxDeliveryCount": "2"})
    producer, reader = Client(broker), Client(broker)
    fill(producer, 1)
    read(reader, "g", 1)
    broker.leases.release(QUEUE, "g", 1)
    read(reader, "g", 2)
    broker.leases.release(QUEUE, "g", 2)
    assert queue(broker).pending_count == 0
    dead = Client(broker)
    dead.subscribe(DMQ_NAME.path, ack=AckMode.AUTO)
    assert bodies(dead.take()) == [b"0"]


def test_a_lease_on_a_topic_is_refused(broker: Broker) -> None:
    with pytest.raises(BadRequest, match="topic"):
        read(Client(broker), "g", 1, path="/topic/t")


def test_ended_leases_do_not_pile_up_in_the_deadline_heap(broker: Broker) -> None:
    reader = Client(broker)
    for number in range(500):
        read(reader, "g", number)
        broker.leases.acknowledge(QUEUE, "g", number)
    broker.tick()
    assert broker.leases.open_count == 0
    assert len(broker.leases._deadlines) <= 64  # a bound, however many leases came and went


def test_destroying_the_queue_ends_its_leases(broker: Broker) -> None:
    producer, reader = Client(broker), Client(broker)
    fill(producer, 3)
    read(reader, "g", 1, max_messages=2)
    broker.destroy_destination(QUEUE)
    assert broker.leases.open_count == 0
    store = broker.store
    assert isinstance(store, MemoryStore)
    assert len(store) == 0  # the leased messages went with the queue
    with pytest.raises(Gone):
        broker.leases.acknowledge(QUEUE, "g", 1)


def leased_message(seq: int) -> Message:
    return Message(
        id=f"m{seq}",
        destination=QUEUE,
        body=b"%d" % seq,
        headers=(("k", "v"),),
        priority=4,
        expires=0,
        persistent=True,
        timestamp=1,
        seq=seq,
        delivery_count=1,
        location=1000 + seq,
        marks=[2000 + seq],
    )


def test_messages_read_in_order_from_any_position_without_a_swap_area() -> None:
    ledger = MemoryLedger()
    leased = LeasedMessages(ledger, None)
    for seq in range(1, 11):
        leased.append(leased_message(seq))
    assert (len(leased), leased.bytes) == (10, 11)
    assert ledger.used == sum(message_cost(m.size) for m in leased.read_at(0, 100))
    assert [m.seq for m in leased.read_at(3, 4)] == [4, 5, 6, 7]
    assert [m.seq for m in leased.read_at(8, 100)] == [9, 10]
    assert leased.read_at(10, 5) == []
    drained = [m.seq for batch in leased.drain() for m in batch]
    assert drained == list(range(1, 11))
    assert (len(leased), ledger.used) == (0, 0)


def test_over_the_threshold_messages_spill_and_read_back_with_their_bookkeeping(
    swap: SwapArea, swap_dir: Path
) -> None:
    ledger = MemoryLedger(threshold=message_cost(1) * 5)
    leased = LeasedMessages(ledger, swap)
    count = 3 * CHUNK_MESSAGES + 7
    for seq in range(1, count + 1):
        leased.append(leased_message(seq))
    assert swap.segment_count >= 1
    assert ledger.used < message_cost(1) * (CHUNK_MESSAGES + 6)  # only the head and one chunk
    window = leased.read_at(CHUNK_MESSAGES - 2, 5)  # across the head and the first chunk
    assert [m.seq for m in window] == list(range(CHUNK_MESSAGES - 1, CHUNK_MESSAGES + 4))
    everything = leased.read_at(0, count)
    assert [m.seq for m in everything] == list(range(1, count + 1))
    last = everything[-1]
    assert (last.location, last.marks, last.delivery_count) == (1000 + count, [2000 + count], 1)
    drained = [m for batch in leased.drain() for m in batch]
    assert [m.seq for m in drained] == list(range(1, count + 1))
    assert drained[CHUNK_MESSAGES].location == 1000 + CHUNK_MESSAGES + 1
    assert ledger.used == 0
    assert_swap_empty(swap, swap_dir)
