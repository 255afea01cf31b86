"""Destination and system limits, limit behaviours, and producer registration, in the core."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import pytest

from sluiceway.config import LimitBehavior
from sluiceway.core.broker import Broker
from sluiceway.core.features.dead_letters import DMQ_NAME
from sluiceway.core.model.queue import Queue
from sluiceway.core.model.subscription import AckMode
from sluiceway.errors import BadRequest, Conflict, EntityTooLarge, Forbidden, ResourceFull
from sluiceway.naming import parse_destination
from tests.core.helpers import Client, bodies

MakeBroker = Callable[[Mapping[str, str]], Broker]
Q = "/queue/q"


def queue_with(make_broker: MakeBroker, **properties: str) -> Broker:
    """A broker whose queue `q` is defined with the given destination properties."""
    return make_broker({f"imq.destination.queue.q.{k}": v for k, v in properties.items()})


def dmq_bodies(broker: Broker) -> list[bytes]:
    reader = Client(broker)
    reader.subscribe(DMQ_NAME.path, ack=AckMode.AUTO)
    return bodies(reader.take())


# -- REJECT_NEWEST -------------------------------------------------------------------------------


def test_reject_newest_refuses_a_reported_message_naming_the_limit(make_broker: MakeBroker) -> None:
    broker = queue_with(make_broker, maxNumMsgs="2")
    producer = Client(broker)
    producer.send(Q, b"1", persistent=True)
    producer.send(Q, b"2", persistent=True)
    with pytest.raises(ResourceFull) as refused:
        producer.send(Q, b"3", persistent=True)
    error = refused.value
    assert (error.status, error.destination, error.limit, error.limit_value) == (
        414,
        Q,
        "maxNumMsgs",
        "2",
    )
    assert "maxNumMsgs is 2 messages" in str(error)
    assert dmq_bodies(broker) == []  # refused messages never reach the dead message queue


def test_reject_newest_drops_an_unreported_message_and_counts_it(make_broker: MakeBroker) -> None:
    broker = queue_with(make_broker, maxNumMsgs="1")
    producer = Client(broker)
    producer.send(Q, b"kept")
    producer.send(Q, b"dropped")  # non-persistent, no receipt asked: the producer hears nothing
    producer.send(Q, b"refused-with-receipt", report=False)
    with pytest.raises(ResourceFull):
        producer.send(Q, b"asked", report=True)  # non-persistent with a receipt: refused
    queue = broker.destination(parse_destination(Q))
    assert queue.stats.dropped == 2
    consumer = Client(broker)
    consumer.subscribe(Q, ack=AckMode.AUTO)
    assert bodies(consumer.take()) == [b"kept"]


def test_max_total_msg_bytes_counts_bodies(make_broker: MakeBroker) -> None:
    broker = queue_with(make_broker, maxTotalMsgBytes="10")
    producer = Client(broker)
    producer.send(Q, b"x" * 6, report=True)
    with pytest.raises(ResourceFull) as refused:
        producer.send(Q, b"y" * 5, report=True)
    assert refused.value.limit == "maxTotalMsgBytes"
    producer.send(Q, b"z" * 4, report=True)  # exactly at the limit is allowed


def test_unconsumed_messages_count_until_acknowledged(make_broker: MakeBroker) -> None:
    broker = queue_with(make_broker, maxNumMsgs="2")
    producer, consumer = Client(broker), Client(broker)
    consumer.subscribe(Q)
    producer.send(Q, b"1", report=True)
    producer.send(Q, b"2", report=True)
    delivered = consumer.take()
    with pytest.raises(ResourceFull):  # delivered but unacknowledged still count
        producer.send(Q, b"3", report=True)
    consumer.ack(delivered[0])
    producer.send(Q, b"3", report=True)


@pytest.mark.parametrize(
    ("properties", "size", "limit"),
    [
        ({"imq.destination.queue.q.maxBytesPerMsg": "100"}, 101, "maxBytesPerMsg"),
        ({"imq.message.max_size": "50"}, 51, "imq.message.max_size"),
    ],
)
def test_a_message_larger_than_allowed_is_refused_with_423(
    make_broker: MakeBroker, properties: dict[str, str], size: int, limit: str
) -> None:
    broker = make_broker(properties)
    producer = Client(broker)
    with pytest.raises(EntityTooLarge) as refused:
        producer.send(Q, b"x" * size, report=True)
    assert (refused.value.status, refused.value.limit) == (423, limit)
    producer.send(Q, b"x" * size)  # not reported: dropped and counted
    assert broker.destination(parse_destination(Q)).stats.dropped == 1
    producer.send(Q, b"x" * (size - 1), report=True)


def test_auto_created_destinations_get_open_mq_auto_defaults(broker: Broker) -> None:
    Client(broker).send(Q)
    settings = broker.destination(parse_destination(Q)).settings
    assert (settings.max_num_msgs, settings.max_bytes_per_msg) == (100_000, 10 * 1024 * 1024)
    assert settings.limit_behavior is LimitBehavior.REJECT_NEWEST
    assert settings.use_dmq


# -- system-wide limits ------------------------------------------------------------------------


def test_system_max_count_applies_whatever_the_behavior(make_broker: MakeBroker) -> None:
    broker = make_broker(
        {
            "imq.system.max_count": "3",
            "imq.destination.queue.a.limitBehavior": "FLOW_CONTROL",
            "imq.destination.queue.b.limitBehavior": "REMOVE_OLDEST",
        }
    )
    producer = Client(broker)
    producer.send("/queue/a", report=True)
    producer.send("/queue/b", report=True)
    producer.send("/topic/nobody", report=True)  # discarded: holds nothing
    producer.send("/queue/c", report=True)
    for path in ("/queue/a", "/queue/b", "/queue/c"):
        with pytest.raises(ResourceFull) as refused:
            producer.send(path, report=True)
        assert (refused.value.limit, refused.value.limit_value) == ("imq.system.max_count", "3")
    assert producer.held == []  # refused, never held, even under FLOW_CONTROL


def test_system_max_size_counts_all_destinations(make_broker: MakeBroker) -> None:
    broker = make_broker({"imq.system.max_size": "10"})
    producer = Client(broker)
    producer.send("/queue/a", b"12345", report=True)
    producer.send("/queue/b", b"12345", report=True)
    with pytest.raises(ResourceFull) as refused:
        producer.send("/queue/c", b"1", report=True)
    assert refused.value.limit == "imq.system.max_size"
    assert broker.context.system.count == 2


def test_topic_copies_count_once_per_subscription(make_broker: MakeBroker) -> None:
    broker = make_broker({"imq.system.max_count": "4"})
    subscribers = [Client(broker) for _ in range(2)]
    for client in subscribers:
        client.subscribe("/topic/t", limit=1)
    producer = Client(broker)
    producer.send("/topic/t", report=True)
    producer.send("/topic/t", report=True)
    assert broker.context.system.count == 4
    with pytest.raises(ResourceFull):
        producer.send("/topic/t", report=True)
    for client in subscribers:
        for delivery in client.take():
            client.ack(delivery)
    assert broker.context.system.count == 2


# -- REMOVE_OLDEST / REMOVE_LOW_PRIORITY and the dead message queue ------------------------------


def test_remove_oldest_evicts_to_the_dmq_with_its_properties(make_broker: MakeBroker) -> None:
    broker = queue_with(make_broker, maxNumMsgs="2", limitBehavior="REMOVE_OLDEST")
    producer = Client(broker)
    for body in (b"1", b"2", b"3", b"4"):
        producer.send(Q, body, report=True)  # never refused: room is made
    consumer = Client(broker)
    consumer.subscribe(Q, ack=AckMode.AUTO)
    assert bodies(consumer.take()) == [b"3", b"4"]
    reader = Client(broker)
    reader.subscribe(DMQ_NAME.path, ack=AckMode.AUTO)
    dead = reader.take()
    assert bodies(dead) == [b"1", b"2"]
    headers = dict(dead[0].message.headers)
    assert headers["JMS_SUN_DMQ_UNDELIVERED_REASON"] == "OLDEST"
    assert headers["JMS_SUN_DMQ_UNDELIVERED_DESTINATION"] == Q
    assert headers["JMS_SUN_DMQ_DELIVERY_COUNT"] == "0"
    assert headers["JMS_SUN_DMQ_BODY_TRUNCATED"] == "false"
    assert int(headers["JMS_SUN_DMQ_UNDELIVERED_TIMESTAMP"]) == broker.clock.time_ms()
    assert headers["JMS_SUN_DMQ_DEAD_BROKER"] == broker.instance_id
    assert "REMOVE_OLDEST" in headers["JMS_SUN_DMQ_UNDELIVERED_COMMENT"]


def test_remove_low_priority_evicts_the_lowest_then_oldest(make_broker: MakeBroker) -> None:
    broker = queue_with(make_broker, maxNumMsgs="3", limitBehavior="REMOVE_LOW_PRIORITY")
    producer = Client(broker)
    producer.send(Q, b"p5-a", priority=5)
    producer.send(Q, b"p1-a", priority=1)
    producer.send(Q, b"p1-b", priority=1)
    producer.send(Q, b"p9", priority=9)  # evicts p1-a
    producer.send(Q, b"p7", priority=7)  # evicts p1-b
    consumer = Client(broker)
    consumer.subscribe(Q, ack=AckMode.AUTO)
    assert bodies(consumer.take()) == [b"p9", b"p7", b"p5-a"]
    assert dmq_bodies(broker) == [b"p1-a", b"p1-b"]


def test_remove_oldest_makes_room_for_the_bytes_too(make_broker: MakeBroker) -> None:
    broker = queue_with(make_broker, maxTotalMsgBytes="10", limitBehavior="REMOVE_OLDEST")
    producer = Client(broker)
    for body in (b"aaaa", b"bbbb", b"cc"):
        producer.send(Q, body)
    producer.send(Q, b"dddddddd")  # 8 bytes: the two oldest must go, then 10 bytes are held
    with pytest.raises(ResourceFull):  # larger than the whole destination
        producer.send(Q, b"e" * 11, report=True)
    consumer = Client(broker)
    consumer.subscribe(Q, ack=AckMode.AUTO)
    assert bodies(consumer.take()) == [b"cc", b"dddddddd"]
    assert dmq_bodies(broker) == [b"aaaa", b"bbbb"]  # the refused one evicted nothing


def test_without_use_dmq_evicted_messages_are_discarded(make_broker: MakeBroker) -> None:
    broker = queue_with(make_broker, maxNumMsgs="1", limitBehavior="REMOVE_OLDEST", useDMQ="false")
    producer = Client(broker)
    producer.send(Q, b"1")
    producer.send(Q, b"2")
    assert broker.destination(parse_destination(Q)).stats.dead == 1
    assert dmq_bodies(broker) == []


def test_expired_messages_go_to_the_dmq_without_expiration(broker: Broker) -> None:
    producer = Client(broker)
    expires = broker.clock.time_ms() + 1000
    producer.send(Q, b"late", expires=expires, persistent=True)
    broker.clock.advance(2)  # type: ignore[attr-defined]
    assert broker.sweep_expired() == 1
    reader = Client(broker)
    reader.subscribe(DMQ_NAME.path, ack=AckMode.AUTO)
    (dead,) = reader.take()
    assert dead.message.body == b"late"
    assert dead.message.expires == 0
    assert dead.message.persistent
    headers = dict(dead.message.headers)
    assert headers["JMS_SUN_DMQ_UNDELIVERED_REASON"] == "EXPIRED"
    assert headers["original-message-id"] != dead.message.id


def test_an_expired_topic_message_goes_to_the_dmq_once(broker: Broker) -> None:
    subscribers = [Client(broker) for _ in range(3)]
    for subscriber in subscribers:
        subscriber.subscribe("/topic/t", limit=1)
    producer = Client(broker)
    producer.send("/topic/t", b"first")
    producer.send("/topic/t", b"late", expires=broker.clock.time_ms() + 1000)
    broker.clock.advance(2)  # type: ignore[attr-defined]
    assert broker.sweep_expired() == 3  # one copy per subscription
    assert dmq_bodies(broker) == [b"late"]
    assert broker.destination(parse_destination("/topic/t")).stats.expired == 3


def test_max_delivery_count_makes_a_message_dead(make_broker: MakeBroker) -> None:
    broker = queue_with(make_broker, maxDeliveryCount="2")
    Client(broker).send(Q, b"poison")
    consumer = Client(broker)
    consumer.subscribe(Q)
    for _ in range(2):
        (delivery,) = consumer.take()
        consumer.nack(delivery)
    assert consumer.take() == []
    reader = Client(broker)
    reader.subscribe(DMQ_NAME.path, ack=AckMode.AUTO)
    (dead,) = reader.take()
    headers = dict(dead.message.headers)
    assert headers["JMS_SUN_DMQ_UNDELIVERED_REASON"] == "UNDELIVERABLE"
    assert headers["JMS_SUN_DMQ_DELIVERY_COUNT"] == "2"


def test_truncate_body_keeps_only_the_headers(make_broker: MakeBroker) -> None:
    broker = make_broker(
        {
            "imq.destination.DMQ.truncateBody": "true",
            "imq.destination.queue.q.maxNumMsgs": "1",
            "imq.destination.queue.q.limitBehavior": "REMOVE_OLDEST",
        }
    )
    producer = Client(broker)
    producer.send(Q, b"big body")
    producer.send(Q, b"next")
    reader = Client(broker)
    reader.subscribe(DMQ_NAME.path, ack=AckMode.AUTO)
    (dead,) = reader.take()
    assert dead.message.body == b""
    assert dict(dead.message.headers)["JMS_SUN_DMQ_BODY_TRUNCATED"] == "true"


def test_the_dmq_keeps_its_newest_1000(broker: Broker) -> None:
    dmq = broker.destination(DMQ_NAME)
    assert (dmq.settings.max_num_msgs, dmq.settings.max_total_msg_bytes) == (1000, 10 * 1024**2)
    assert dmq.settings.limit_behavior is LimitBehavior.REMOVE_OLDEST
    producer = Client(broker)
    expires = broker.clock.time_ms() + 1
    for i in range(1005):
        producer.send(Q, b"%d" % i, expires=expires)
    broker.clock.advance(1)  # type: ignore[attr-defined]
    broker.sweep_expired()
    assert dmq.pending_count == 1000
    assert dmq_bodies(broker)[0] == b"5"
    assert dmq.stats.dead == 5  # overflow of the DMQ itself is discarded, not sent on


def test_the_dmq_cannot_be_destroyed_paused_or_flow_controlled(broker: Broker) -> None:
    with pytest.raises(Forbidden):
        broker.destroy_destination(DMQ_NAME)
    with pytest.raises(Forbidden):
        broker.pause(DMQ_NAME)
    with pytest.raises(Forbidden):
        broker.update_destination(DMQ_NAME, {"limitBehavior": "FLOW_CONTROL"})
    assert broker.update_destination(DMQ_NAME, {"maxNumMsgs": "5"}).max_num_msgs == 5


# -- producers and consumers ---------------------------------------------------------------------


def test_max_num_producers_refuses_another_connection(make_broker: MakeBroker) -> None:
    broker = queue_with(make_broker, maxNumProducers="2")
    first, second, third = Client(broker), Client(broker), Client(broker)
    first.send(Q)
    second.send(Q)
    first.send(Q)  # already a producer
    with pytest.raises(Conflict) as refused:
        third.send(Q)
    assert (refused.value.status, refused.value.limit) == (409, "maxNumProducers")
    first.connection.close()
    third.send(Q)  # a closed connection is no longer a producer


def test_backup_consumers_get_nothing_until_promoted(make_broker: MakeBroker) -> None:
    broker = queue_with(make_broker, maxNumActiveConsumers="1", maxNumBackupConsumers="1")
    active, backup, third = Client(broker), Client(broker), Client(broker)
    active.subscribe(Q, ack=AckMode.AUTO)
    backup.subscribe(Q, ack=AckMode.AUTO)
    with pytest.raises(Conflict) as refused:
        third.subscribe(Q)
    assert refused.value.status == 409
    producer = Client(broker)
    producer.send(Q, b"1")
    assert bodies(active.take()) == [b"1"]
    assert backup.take() == []
    active.connection.unsubscribe("s1")
    producer.send(Q, b"2")
    assert bodies(backup.take()) == [b"2"]
    third.subscribe(Q)  # a backup slot is free again


def test_raising_max_active_consumers_promotes_backups(make_broker: MakeBroker) -> None:
    broker = queue_with(make_broker, maxNumActiveConsumers="1", maxNumBackupConsumers="2")
    clients = [Client(broker) for _ in range(3)]
    for client in clients:
        client.subscribe(Q, ack=AckMode.AUTO)
    queue = broker.destination(parse_destination(Q))
    assert isinstance(queue, Queue)
    assert (len(queue.consumers), len(queue.backups)) == (1, 2)
    broker.update_destination(parse_destination(Q), {"maxNumActiveConsumers": "3"})
    assert (len(queue.consumers), len(queue.backups)) == (3, 0)


# -- run-time changes ---------------------------------------------------------------------------


def test_update_destination_takes_open_mq_names_and_checks_them(broker: Broker) -> None:
    name = parse_destination(Q)
    broker.create_destination(name, {"maxNumMsgs": "1"})
    settings = broker.update_destination(
        name, {"maxNumMsgs": "2", "limitBehavior": "remove_oldest"}
    )
    assert settings.max_num_msgs == 2
    assert settings.limit_behavior is LimitBehavior.REMOVE_OLDEST
    with pytest.raises(BadRequest, match="maxNumMsg"):
        broker.update_destination(name, {"maxNumMsg": "2"})
    with pytest.raises(BadRequest, match="limitBehavior"):
        broker.update_destination(name, {"limitBehavior": "SOMETIMES"})
    with pytest.raises(Conflict):
        broker.create_destination(name)


def test_destroy_refuses_a_destination_in_use(broker: Broker) -> None:
    consumer = Client(broker)
    consumer.subscribe(Q)
    name = parse_destination(Q)
    with pytest.raises(Conflict):
        broker.destroy_destination(name)
    consumer.connection.unsubscribe("s1")
    Client(broker).send(Q)
    broker.destroy_destination(name)
    assert broker.registry.get(name) is None
    assert broker.context.system.count == 0


def test_purge_removes_waiting_messages(broker: Broker) -> None:
    producer = Client(broker)
    for _ in range(3):
        producer.send(Q)
    assert broker.purge(parse_destination(Q)) == 3
    assert broker.context.system.count == 0
