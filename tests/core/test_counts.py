"""The counts clients make grow, in the core: open transactions and what they hold, a topic's
cursors and a queue's lease groups. Each limit refuses the first request past it, changes nothing
doing so (nothing in memory, nothing in the journal), counts the refusal, and frees a place when
one is given up; what the journal holds at a restart is kept even beyond the limits."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from sluiceway.config import BrokerConfig
from sluiceway.core.broker import Broker
from sluiceway.core.features.cursors import CursorRead
from sluiceway.core.features.leases import LeaseRead
from sluiceway.core.model.queue import Queue
from sluiceway.core.model.subscription import AckMode
from sluiceway.core.model.topic import Topic
from sluiceway.core.values.counts import CountLimit
from sluiceway.errors import ResourceFull
from sluiceway.naming import parse_destination
from sluiceway.testing import FakeClock
from tests.core.helpers import Client, bodies
from tests.persist.test_lease_persistence import Restartable

MakeBroker = Callable[[Mapping[str, str]], Broker]
Q, T = "/queue/q", "/topic/t"
QUEUE, TOPIC = parse_destination(Q), parse_destination(T)


def refusal(error: pytest.ExceptionInfo[ResourceFull]) -> tuple[int, str | None, str | None]:
    """What the client sees of a refusal: the status and the limit headers."""
    return error.value.status, error.value.limit, error.value.limit_value


def open_cursor(client: Client, group: str, path: str = T) -> None:
    """Open cursor `group` as a browser SUBSCRIBE with the cursor header does, then end the
    read."""
    sub_id = f"cursor-{group}"
    client.connection.subscribe(
        sub_id,
        parse_destination(path),
        AckMode.AUTO,
        requested_limit=1000,
        threshold=50,
        prefetch=True,
        browser=True,
        cursor=CursorRead(group),
    )
    client.take()
    client.connection.unsubscribe(sub_id)


def read_lease(client: Client, group: str, number: int = 1, path: str = Q) -> None:
    sub_id = f"lease-{group}-{number}"
    client.connection.subscribe(
        sub_id,
        parse_destination(path),
        AckMode.AUTO,
        requested_limit=1000,
        threshold=50,
        prefetch=True,
        lease=LeaseRead(group, number),
    )
    client.take()
    client.connection.unsubscribe(sub_id)


# -- transactions ----------------------------------------------------------------------------------


def test_the_defaults() -> None:
    config = BrokerConfig()
    assert (config.max_transactions, config.tx_max_messages) == (100, 10_000)
    assert config.tx_max_bytes == 64 * 1024 * 1024
    assert (config.cursor_max_groups, config.lease_max_groups) == (100, 1000)


def test_a_begin_past_the_limit_is_refused_and_counted(make_broker: MakeBroker) -> None:
    broker = make_broker({"imq.stomp.max_transactions": "2"})
    client = Client(broker)
    client.connection.begin("a")
    client.connection.begin("b")
    with pytest.raises(ResourceFull, match=r"2 open transactions.*imq\.stomp\.max_transactions"):
        client.connection.begin("c")
    assert broker.refusals[CountLimit.TRANSACTIONS] == 1
    assert len(client.connection.transactions) == 2
    client.connection.commit("a")  # a place is free again
    client.connection.begin("c")
    assert len(client.connection.transactions) == 2


def test_the_limit_error_names_the_property_in_its_headers(make_broker: MakeBroker) -> None:
    broker = make_broker({"imq.stomp.max_transactions": "1"})
    client = Client(broker)
    client.connection.begin("a")
    with pytest.raises(ResourceFull) as error:
        client.connection.begin("b")
    assert refusal(error) == (414, "imq.stomp.max_transactions", "1")
    assert "raise imq.stomp.max_transactions" in str(error.value)


def test_messages_held_by_a_connections_transactions_are_bounded_together(
    make_broker: MakeBroker,
) -> None:
    broker = make_broker({"imq.stomp.transactions.max_messages": "3"})
    producer, consumer = Client(broker), Client(broker)
    connection = producer.connection
    connection.begin("a")
    connection.begin("b")
    producer.send(Q, b"a1", transaction="a")
    producer.send(Q, b"a2", transaction="a")
    producer.send(Q, b"b1", transaction="b")
    with pytest.raises(ResourceFull) as error:
        producer.send(Q, b"b2", transaction="b")
    assert refusal(error) == (414, "imq.stomp.transactions.max_messages", "3")
    assert "transaction 'b' stays open" in str(error.value)
    assert (connection.transactions.messages, connection.transactions.bytes) == (3, 6)
    assert broker.refusals[CountLimit.TRANSACTION_MESSAGES] == 1
    # The transaction is still usable: committing it publishes what it held before.
    connection.commit("b")
    producer.send(Q, b"b3", transaction="a")  # b's message left: room for one more
    connection.commit("a")
    consumer.subscribe(Q)
    assert bodies(consumer.take()) == [b"b1", b"a1", b"a2", b"b3"]
    assert (connection.transactions.messages, connection.transactions.bytes) == (0, 0)


def test_bytes_held_by_transactions_are_bounded_but_one_message_always_fits(
    make_broker: MakeBroker,
) -> None:
    broker = make_broker({"imq.stomp.transactions.max_bytes": "10"})
    producer = Client(broker)
    transactions = producer.connection.transactions
    producer.connection.begin("a")
    producer.send(Q, b"x" * 25, transaction="a")  # larger than the limit, but alone: accepted
    with pytest.raises(ResourceFull) as error:
        producer.send(Q, b"y", transaction="a")
    assert refusal(error) == (414, "imq.stomp.transactions.max_bytes", "10")
    assert transactions.bytes == 25
    producer.connection.abort("a")
    assert (transactions.messages, transactions.bytes) == (0, 0)
    producer.connection.begin("b")
    producer.send(Q, b"x" * 6, transaction="b")
    producer.send(Q, b"x" * 4, transaction="b")  # exactly the limit
    with pytest.raises(ResourceFull):
        producer.send(Q, b"z", transaction="b")
    assert broker.refusals[CountLimit.TRANSACTION_BYTES] == 2
    assert transactions.bytes == 10


def test_a_refused_send_registers_no_producer_and_stores_nothing(make_broker: MakeBroker) -> None:
    broker = make_broker({"imq.transaction.producer.maxNumMsgs": "1"})
    producer = Client(broker)
    producer.connection.begin("a")
    producer.send(Q, transaction="a")
    changes = broker.store.changes
    with pytest.raises(ResourceFull) as error:
        producer.send("/queue/other", transaction="a")
    assert refusal(error) == (414, "imq.transaction.producer.maxNumMsgs", "1")
    assert broker.store.changes == changes
    assert {d.name.path for d in producer.connection.produced_to} == {Q}
    assert broker.refusals[CountLimit.TRANSACTION_SENDS] == 1


def test_a_rolled_back_commit_and_a_disconnect_release_what_was_held(
    make_broker: MakeBroker,
) -> None:
    broker = make_broker({"imq.system.max_count": "1", "imq.stomp.transactions.max_messages": "2"})
    producer = Client(broker)
    transactions = producer.connection.transactions
    producer.connection.begin("a")
    producer.send(Q, transaction="a")
    producer.send(Q, transaction="a")
    with pytest.raises(ResourceFull, match="rolled back"):  # imq.system.max_count refuses it
        producer.connection.commit("a")
    assert (len(transactions), transactions.messages, transactions.bytes) == (0, 0, 0)
    producer.connection.begin("b")
    producer.send(Q, transaction="b")
    producer.connection.close()
    assert (len(transactions), transactions.messages, transactions.bytes) == (0, 0, 0)


def test_a_lowered_limit_keeps_what_is_held_and_refuses_more(broker: Broker) -> None:
    producer = Client(broker)
    producer.connection.begin("a")
    producer.send(Q, transaction="a")
    producer.send(Q, transaction="a")
    broker.update_properties({"imq.stomp.transactions.max_messages": "1"})
    with pytest.raises(ResourceFull):
        producer.send(Q, transaction="a")
    producer.connection.commit("a")  # what it held is published
    assert broker.destination(QUEUE).held_count == 2


# -- cursors ---------------------------------------------------------------------------------------


def test_a_new_cursor_past_the_limit_is_refused_and_writes_nothing(
    make_broker: MakeBroker,
) -> None:
    broker = make_broker({"imq.cursor.max_groups": "2"})
    reader = Client(broker)
    open_cursor(reader, "a")
    open_cursor(reader, "b")
    changes = broker.store.changes
    with pytest.raises(ResourceFull) as error:
        open_cursor(reader, "c")
    assert refusal(error) == (414, "imq.cursor.max_groups", "2")
    assert error.value.destination == T
    assert broker.store.changes == changes
    assert reader.connection.subscriptions == {}  # the read's subscription was not made
    topic = broker.destination(TOPIC)
    assert isinstance(topic, Topic)
    assert sorted(topic.cursors) == ["a", "b"]
    assert broker.refusals[CountLimit.CURSORS] == 1
    open_cursor(reader, "a")  # an existing cursor opens as before
    open_cursor(reader, "c", path="/topic/other")  # the limit is per topic
    broker.cursors.delete(TOPIC, "b")  # a place is free again
    open_cursor(reader, "c")
    assert sorted(topic.cursors) == ["a", "c"]


# -- lease groups ----------------------------------------------------------------------------------


def test_a_lease_in_a_new_group_past_the_limit_is_refused_and_writes_nothing(
    make_broker: MakeBroker,
) -> None:
    broker = make_broker({"imq.lease.max_groups": "2"})
    producer, reader = Client(broker), Client(broker)
    for i in range(4):
        producer.send(Q, b"%d" % i, persistent=True)
    read_lease(reader, "a")
    read_lease(reader, "b")
    queue = broker.destination(QUEUE)
    assert isinstance(queue, Queue)
    changes, pending = broker.store.changes, len(queue.pending)
    with pytest.raises(ResourceFull) as error:
        read_lease(reader, "c")
    assert refusal(error) == (414, "imq.lease.max_groups", "2")
    assert "lease c/1 would start a new one" in str(error.value)
    assert (broker.store.changes, len(queue.pending)) == (changes, pending)
    assert reader.connection.subscriptions == {}
    assert broker.leases.group_count(QUEUE) == 2
    assert broker.refusals[CountLimit.LEASE_GROUPS] == 1
    # The groups in use go on: their next leases are read, and finished groups still count.
    broker.leases.acknowledge(QUEUE, "a", 1)
    read_lease(reader, "a", 2)
    with pytest.raises(ResourceFull):
        read_lease(reader, "c")
    read_lease(reader, "c", path="/queue/other")  # the limit is per queue
    assert broker.leases.most_groups() == 2


# -- recovery --------------------------------------------------------------------------------------


def test_recovery_keeps_cursors_and_groups_beyond_a_lowered_limit(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    node = Restartable(tmp_path, FakeClock())
    reader = Client(node.broker)
    for group in ("a", "b", "c"):
        open_cursor(reader, group)
        read_lease(reader, group)
    node.properties = {"imq.cursor.max_groups": "2", "imq.lease.max_groups": "1"}
    with caplog.at_level(logging.WARNING, logger="sluiceway"):
        broker = node.restart()
    assert sorted(node.topic().cursors) == ["a", "b", "c"]
    assert broker.leases.group_count(QUEUE) == 3
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("3 cursors" in w and "imq.cursor.max_groups (2)" in w for w in warnings)
    assert any("3 lease groups" in w and "imq.lease.max_groups (1)" in w for w in warnings)
    # Existing ones go on; new ones are refused.
    reader = Client(broker)
    open_cursor(reader, "a")
    read_lease(reader, "b", 2)
    with pytest.raises(ResourceFull):
        open_cursor(reader, "d")
    with pytest.raises(ResourceFull):
        read_lease(reader, "d")
