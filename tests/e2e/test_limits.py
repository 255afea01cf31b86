"""Destination and system limits, active and backup consumers, producer counts and run-time
changes, over real sockets: raw frames, stomp.py, and the project's client.

Open MQ properties under test: maxNumMsgs, maxTotalMsgBytes, maxBytesPerMsg, imq.message.max_size,
imq.system.max_count, imq.system.max_size, limitBehavior (REJECT_NEWEST; FLOW_CONTROL and
REMOVE_OLDEST only as behaviours the system limits override), maxNumActiveConsumers,
maxNumBackupConsumers, maxNumProducers, imq.autocreate.destination.*. Eviction and the dead
message queue are in test_dead_messages.py.
"""

from __future__ import annotations

import pytest

from sluiceway.client import AckMode, ConnectionFactory, EntityTooLarge, ResourceFull
from sluiceway.config import LimitBehavior
from sluiceway.errors import Conflict
from sluiceway.naming import parse_destination
from sluiceway.testing import BrokerThread
from tests.e2e.conftest import BrokerFactory, ClientFactory, StompFactory
from tests.e2e.limits import (
    DMQ,
    GIB,
    KIB,
    MIB,
    assert_accepted,
    assert_dead,
    assert_refused,
    bodies,
    expect_error_and_close,
    now_ms,
    on_loop,
    send_raw,
    send_receipted,
    settings_of,
    stat,
    update,
)
from tests.e2e.stomppy import subscribe, sync, wait_until
from tests.e2e.support import eventually, wait_connection_count

# -- 1. REJECT_NEWEST: reported and unreported refusals -------------------------------------------


def test_persistent_send_over_max_num_msgs_gets_an_error_and_a_close_stomp_py(
    make_broker: BrokerFactory, stomp_clients: StompFactory
) -> None:
    broker = make_broker({"imq.destination.queue.rn.maxNumMsgs": "2"})
    producer, recorder = stomp_clients(broker.port)
    for i in range(2):
        producer.send("/queue/rn", f"{i}", headers={"persistent": "true"})
    sync(producer, recorder)
    assert recorder.errors == []
    producer.send("/queue/rn", "over", headers={"persistent": "true"})
    recorder.wait_for(lambda: bool(recorder.errors) and recorder.disconnected)
    (error,) = recorder.errors
    assert_refused(error.headers, 414, "/queue/rn", "maxNumMsgs", "2")
    assert "/queue/rn" in error.body
    assert "maxNumMsgs" in error.body

    consumer, received = stomp_clients(broker.port)
    subscribe(consumer, received, "/queue/rn", "s", ack="auto")
    received.wait_messages(2)
    sync(consumer, received)
    assert bodies(received.take()) == ["0", "1"]  # the refused one was not kept


def test_failed_receipt_keeps_the_connection_and_unacked_messages_count_stomp_py(
    make_broker: BrokerFactory, stomp_clients: StompFactory
) -> None:
    broker = make_broker({"imq.destination.queue.rn.maxNumMsgs": "2"})
    client, recorder = stomp_clients(broker.port, **{"failed-receipts": "true"})
    assert_accepted(send_receipted(client, recorder, "/queue/rn", "0", persistent="true"))
    assert_accepted(send_receipted(client, recorder, "/queue/rn", "1"))
    refused = send_receipted(client, recorder, "/queue/rn", "2", persistent="true")
    assert_refused(refused, 414, "/queue/rn", "maxNumMsgs", "2")
    assert "maxNumMsgs" in refused["detail"]
    # A non-persistent SEND that asks for a receipt is reported too.
    refused = send_receipted(client, recorder, "/queue/rn", "3")
    assert_refused(refused, 414, "/queue/rn", "maxNumMsgs", "2")

    # Delivered but unacknowledged messages still count against maxNumMsgs.
    subscribe(client, recorder, "/queue/rn", "s", ack="client-individual")
    first, second = recorder.wait_messages(2)
    assert [first.body, second.body] == ["0", "1"]
    refused = send_receipted(client, recorder, "/queue/rn", "4")
    assert_refused(refused, 414, "/queue/rn", "maxNumMsgs", "2")
    client.ack(first.headers["ack"])
    assert_accepted(send_receipted(client, recorder, "/queue/rn", "5", persistent="true"))
    (third,) = recorder.wait_messages(3)[2:]
    assert third.body == "5"
    assert recorder.errors == []
    assert not recorder.disconnected


def test_unreported_refusal_is_dropped_and_counted_stomp_py(
    make_broker: BrokerFactory, stomp_clients: StompFactory
) -> None:
    broker = make_broker({"imq.destination.queue.rn.maxNumMsgs": "1"})
    producer, recorder = stomp_clients(broker.port)
    producer.send("/queue/rn", "kept")
    producer.send("/queue/rn", "dropped")  # non-persistent, no receipt: nobody is told
    sync(producer, recorder)
    assert recorder.errors == []
    assert not recorder.disconnected
    assert stat(broker, "/queue/rn", "dropped") == 1

    producer.send("/queue/rn", "reported", headers={"receipt": "r-reported"})
    recorder.wait_for(lambda: bool(recorder.errors) and recorder.disconnected)
    (error,) = recorder.errors
    assert error.headers["receipt-id"] == "r-reported"
    assert_refused(error.headers, 414, "/queue/rn", "maxNumMsgs", "1")
    assert stat(broker, "/queue/rn", "dropped") == 1  # reported, so not counted as dropped

    consumer, received = stomp_clients(broker.port)
    subscribe(consumer, received, "/queue/rn", "s", ack="auto")
    received.wait_messages(1)
    sync(consumer, received)
    assert bodies(received.take()) == ["kept"]


# -- 2. byte limits -------------------------------------------------------------------------------


def test_byte_limits_over_the_wire(make_broker: BrokerFactory, clients: ClientFactory) -> None:
    broker = make_broker(
        {
            "imq.destination.queue.bytes.maxTotalMsgBytes": "100",
            "imq.destination.queue.small.maxBytesPerMsg": "10",
            "imq.message.max_size": "1k",
        }
    )
    client = clients(broker.port, failed_receipts="true")
    assert_accepted(send_raw(client, "/queue/bytes", b"x" * 60).headers)
    assert_accepted(send_raw(client, "/queue/bytes", b"x" * 40).headers)  # exactly 100 bytes
    refused = send_raw(client, "/queue/bytes", b"x")
    assert_refused(refused.headers, 414, "/queue/bytes", "maxTotalMsgBytes", "100")

    assert_accepted(send_raw(client, "/queue/small", b"x" * 10).headers)
    refused = send_raw(client, "/queue/small", b"x" * 11)
    assert_refused(refused.headers, 423, "/queue/small", "maxBytesPerMsg", "10")
    assert "11 bytes" in refused.headers["detail"]

    assert_accepted(send_raw(client, "/queue/any", b"x" * KIB).headers)
    refused = send_raw(client, "/queue/any", b"x" * (KIB + 1), persistent="true")
    assert_refused(refused.headers, 423, "/queue/any", "imq.message.max_size", "1024")

    # Too large, non-persistent and without a receipt: dropped and counted.
    client.send("SEND", {"destination": "/queue/small"}, b"x" * 11)
    client.sync()
    assert stat(broker, "/queue/small", "dropped") == 1

    # Without failed-receipts a reported refusal is an ERROR, then the connection is closed.
    plain = clients(broker.port)
    plain.send("SEND", {"destination": "/queue/bytes", "persistent": "true"}, b"x")
    error = expect_error_and_close(plain)
    assert_refused(error.headers, 414, "/queue/bytes", "maxTotalMsgBytes", "100")
    plain = clients(broker.port)
    plain.send("SEND", {"destination": "/queue/small", "receipt": "big"}, b"x" * 11)
    error = expect_error_and_close(plain)
    assert_refused(error.headers, 423, "/queue/small", "maxBytesPerMsg", "10")
    assert error.headers["receipt-id"] == "big"

    client.subscribe("/queue/bytes", "s", ack="auto")
    assert [len(m.body) for m in client.receive(2)] == [60, 40]
    client.sync()
    assert client.drain() == []


# -- 3. the project's client ----------------------------------------------------------------------


async def test_client_raises_refusals_and_stays_usable(make_broker: BrokerFactory) -> None:
    broker = make_broker(
        {
            "imq.destination.queue.full.maxNumMsgs": "1",
            "imq.destination.queue.tiny.maxBytesPerMsg": "8",
            "imq.destination.queue.solo.maxNumProducers": "1",
        }
    )
    factory = ConnectionFactory(f"stomp://127.0.0.1:{broker.port}")
    async with await factory.connect() as connection, await factory.connect() as other:
        session = connection.session(AckMode.AUTO)
        producer = session.producer("/queue/full")
        await producer.send("first", persistent=True)
        with pytest.raises(ResourceFull) as full:
            await producer.send("second", persistent=True)
        assert full.value.status == 414
        assert full.value.destination == "/queue/full"
        assert full.value.limit == "maxNumMsgs"
        assert full.value.limit_value == "1"
        assert "maxNumMsgs" in str(full.value)

        # Non-persistent without a receipt: not reported, dropped and counted.
        await producer.send("unheard", persistent=False)
        await eventually(lambda: stat(broker, "/queue/full", "dropped") == 1)

        with pytest.raises(EntityTooLarge) as large:
            await session.producer("/queue/tiny").send(b"123456789")
        assert large.value.status == 423
        assert large.value.destination == "/queue/tiny"
        assert large.value.limit == "maxBytesPerMsg"
        assert large.value.limit_value == "8"

        await session.producer("/queue/solo").send("mine")
        with pytest.raises(Conflict) as conflict:
            await other.session().producer("/queue/solo").send("theirs")
        assert conflict.value.status == 409
        assert conflict.value.destination == "/queue/solo"
        assert conflict.value.limit == "maxNumProducers"
        assert conflict.value.limit_value == "1"

        # Both connections are still open and usable.
        consumer = await session.consumer("/queue/full")
        message = await consumer.receive(timeout=5)
        assert message is not None
        assert message.text == "first"
        await producer.send("third", persistent=True)
        message = await consumer.receive(timeout=5)
        assert message is not None
        assert message.text == "third"
        await other.session().producer("/queue/elsewhere").send("fine")


# -- 4. system-wide limits ------------------------------------------------------------------------

BEHAVIOURS = {
    "imq.destination.queue.fc.limitBehavior": "FLOW_CONTROL",
    "imq.destination.queue.fc.maxNumMsgs": "10",
    "imq.destination.queue.ro.limitBehavior": "REMOVE_OLDEST",
    "imq.destination.queue.ro.maxNumMsgs": "10",
}


def test_system_max_count_refuses_whatever_the_limit_behaviour(
    make_broker: BrokerFactory, clients: ClientFactory
) -> None:
    broker = make_broker({"imq.system.max_count": "4", **BEHAVIOURS})
    subscriber = clients(broker.port)
    subscriber.subscribe("/topic/sys", "t1")
    subscriber.subscribe("/topic/sys", "t2")
    producer = clients(broker.port, failed_receipts="true")
    assert_accepted(send_raw(producer, "/queue/fc").headers)
    assert_accepted(send_raw(producer, "/queue/ro").headers)
    assert_accepted(send_raw(producer, "/topic/sys").headers)  # counts once per subscription
    copies = subscriber.receive(2)  # delivered, unacknowledged: they still count

    for destination in ("/queue/fc", "/queue/ro", "/queue/plain", "/topic/sys"):
        refused = send_raw(producer, destination, persistent="true")
        assert_refused(refused.headers, 414, destination, "imq.system.max_count", "4")
    # Unreported: dropped and counted; REMOVE_OLDEST evicted nothing to make room.
    producer.send("SEND", {"destination": "/queue/ro"}, b"quiet")
    producer.sync()
    assert stat(broker, "/queue/ro", "dropped") == 1
    assert stat(broker, "/queue/ro", "dead") == 0

    # Acknowledging one topic copy makes room for exactly one message.
    subscriber.ack(copies[0])
    subscriber.sync()
    assert_accepted(send_raw(producer, "/queue/fc").headers)
    refused = send_raw(producer, "/queue/fc")
    assert_refused(refused.headers, 414, "/queue/fc", "imq.system.max_count", "4")

    plain = clients(broker.port)
    plain.send("SEND", {"destination": "/queue/fc", "persistent": "true"}, b"x")
    error = expect_error_and_close(plain)
    assert_refused(error.headers, 414, "/queue/fc", "imq.system.max_count", "4")


def test_system_max_size_refuses_whatever_the_limit_behaviour_stomp_py(
    make_broker: BrokerFactory, stomp_clients: StompFactory
) -> None:
    broker = make_broker({"imq.system.max_size": "100", **BEHAVIOURS})
    client, recorder = stomp_clients(broker.port, **{"failed-receipts": "true"})
    assert_accepted(send_receipted(client, recorder, "/queue/fc", "x" * 60))
    assert_accepted(send_receipted(client, recorder, "/queue/ro", "x" * 40))  # 100 bytes in all
    for destination in ("/queue/fc", "/queue/ro", "/queue/plain"):
        refused = send_receipted(client, recorder, destination, "x")
        assert_refused(refused, 414, destination, "imq.system.max_size", "100")
    assert stat(broker, "/queue/ro", "dead") == 0

    producer, told = stomp_clients(broker.port)
    producer.send("/queue/ro", "x", headers={"persistent": "true"})
    told.wait_for(lambda: bool(told.errors) and told.disconnected)
    assert_refused(told.errors[0].headers, 414, "/queue/ro", "imq.system.max_size", "100")
    assert "imq.system.max_size" in told.errors[0].body


# -- 7. active and backup consumers ---------------------------------------------------------------


def test_backup_consumer_receives_only_once_the_active_one_leaves(
    make_broker: BrokerFactory, clients: ClientFactory
) -> None:
    broker = make_broker(
        {
            "imq.destination.queue.ab.maxNumActiveConsumers": "1",
            "imq.destination.queue.ab.maxNumBackupConsumers": "1",
        }
    )
    active, backup = clients(broker.port), clients(broker.port)
    active.subscribe("/queue/ab", "a")
    assert_accepted(backup.subscribe("/queue/ab", "b").headers)
    producer = clients(broker.port)
    for i in range(3):
        send_raw(producer, "/queue/ab", b"m%d" % i)
    taken = active.receive(3)
    assert bodies(taken) == [b"m0", b"m1", b"m2"]
    backup.sync()
    assert backup.drain() == []  # a backup receives nothing while the active one is there

    third = clients(broker.port, failed_receipts="true")
    refused = third.subscribe("/queue/ab", "c")
    assert_refused(refused.headers, 409, "/queue/ab", "maxNumBackupConsumers", "1")
    plain = clients(broker.port)
    plain.send("SUBSCRIBE", {"destination": "/queue/ab", "id": "p", "receipt": "sub"})
    error = expect_error_and_close(plain)
    assert_refused(error.headers, 409, "/queue/ab", "maxNumBackupConsumers", "1")

    # The active one leaves (UNSUBSCRIBE): the backup becomes active and gets what was not acked.
    active.ack(taken[0])
    active.request("UNSUBSCRIBE", {"id": "a"})
    again = backup.receive(2)
    assert bodies(again) == [b"m1", b"m2"]
    assert all(m.headers["redelivered"] == "true" for m in again)
    for message in again:
        backup.ack(message)
    send_raw(producer, "/queue/ab", b"m3")
    (m3,) = backup.receive(1)
    assert m3.body == b"m3"

    # Room for a backup again; when the active one disconnects, the backup receives.
    assert_accepted(third.subscribe("/queue/ab", "c").headers)
    send_raw(producer, "/queue/ab", b"m4")
    (m4,) = backup.receive(1)
    third.sync()
    assert third.drain() == []
    backup.ack(m3)
    backup.request("DISCONNECT")  # m4 was not acknowledged: it goes back to the queue
    (again4,) = third.receive(1)
    assert again4.headers["message-id"] == m4.headers["message-id"]
    send_raw(producer, "/queue/ab", b"m5")
    (m5,) = third.receive(1)
    assert m5.body == b"m5"


def test_oldest_backup_is_promoted_first(
    make_broker: BrokerFactory, clients: ClientFactory
) -> None:
    # Queue-only properties have per-kind auto-create names.
    broker = make_broker(
        {
            "imq.autocreate.queue.maxNumActiveConsumers": "1",
            "imq.autocreate.queue.maxNumBackupConsumers": "2",
        }
    )
    active, older, newer = clients(broker.port), clients(broker.port), clients(broker.port)
    for client in (active, older, newer):
        client.subscribe("/queue/order", "s", ack="auto")
    producer = clients(broker.port)
    active.close()  # abruptly: the oldest backup takes over
    wait_connection_count(broker, 3)  # else "1" could be written (ack:auto) to the closed socket
    send_raw(producer, "/queue/order", b"1")
    (first,) = older.receive(1)
    assert first.body == b"1"
    newer.sync()
    assert newer.drain() == []
    older.request("UNSUBSCRIBE", {"id": "s"})
    send_raw(producer, "/queue/order", b"2")
    (second,) = newer.receive(1)
    assert second.body == b"2"


# -- 8. maxNumProducers ---------------------------------------------------------------------------


def test_max_num_producers_refuses_a_second_connection(
    make_broker: BrokerFactory, clients: ClientFactory
) -> None:
    broker = make_broker({"imq.destination.queue.solo.maxNumProducers": "1"})
    first = clients(broker.port)
    assert_accepted(send_raw(first, "/queue/solo", b"1").headers)
    assert_accepted(send_raw(first, "/queue/solo", b"2").headers)  # still the same producer

    second = clients(broker.port, failed_receipts="true")
    refused = send_raw(second, "/queue/solo", b"3")
    assert_refused(refused.headers, 409, "/queue/solo", "maxNumProducers", "1")
    assert_accepted(send_raw(second, "/queue/other").headers)  # other destinations are fine
    plain = clients(broker.port)
    plain.send("SEND", {"destination": "/queue/solo", "persistent": "true"}, b"4")
    error = expect_error_and_close(plain)
    assert_refused(error.headers, 409, "/queue/solo", "maxNumProducers", "1")

    # A connection stops being a producer when it closes.
    first.request("DISCONNECT")
    assert_accepted(send_raw(second, "/queue/solo", b"5").headers)
    third = clients(broker.port, failed_receipts="true")
    refused = send_raw(third, "/queue/solo", b"6")
    assert_refused(refused.headers, 409, "/queue/solo", "maxNumProducers", "1")
    second.close()  # abruptly, without DISCONNECT
    wait_until(
        lambda: (
            on_loop(
                broker, lambda b: len(b.destination(parse_destination("/queue/solo")).producers)
            )
            == 0
        )
    )
    assert_accepted(send_raw(third, "/queue/solo", b"7").headers)

    consumer = clients(broker.port)
    consumer.subscribe("/queue/solo", "s", ack="auto")
    assert bodies(consumer.receive(4)) == [b"1", b"2", b"5", b"7"]


# -- 9. run-time changes and auto-created defaults ------------------------------------------------


def test_update_destination_applies_to_the_next_message(
    broker: BrokerThread, clients: ClientFactory
) -> None:
    watcher = clients(broker.port)
    watcher.subscribe(DMQ, "dmq", ack="auto")
    client = clients(broker.port, failed_receipts="true")
    for i in range(3):
        assert_accepted(send_raw(client, "/queue/live", b"m%d" % i).headers)

    assert update(broker, "/queue/live", {"maxNumMsgs": "3"}).max_num_msgs == 3
    refused = send_raw(client, "/queue/live", b"m3")
    assert_refused(refused.headers, 414, "/queue/live", "maxNumMsgs", "3")
    update(broker, "/queue/live", {"maxNumMsgs": "4"})
    assert_accepted(send_raw(client, "/queue/live", b"m3").headers)
    refused = send_raw(client, "/queue/live", b"m4")
    assert_refused(refused.headers, 414, "/queue/live", "maxNumMsgs", "4")

    since = now_ms()
    update(broker, "/queue/live", {"limitBehavior": "REMOVE_OLDEST"})
    assert_accepted(send_raw(client, "/queue/live", b"m4").headers)
    (dead,) = watcher.receive(1)
    assert_dead(dead.headers, reason="OLDEST", origin="/queue/live", since_ms=since)
    assert dead.body == b"m0"

    update(broker, "/queue/live", {"maxBytesPerMsg": "2"})
    refused = send_raw(client, "/queue/live", b"abc")
    assert_refused(refused.headers, 423, "/queue/live", "maxBytesPerMsg", "2")
    update(broker, "/queue/live", {"maxTotalMsgBytes": "8", "maxNumMsgs": "-1"})
    update(broker, "/queue/live", {"limitBehavior": "REJECT_NEWEST"})
    refused = send_raw(client, "/queue/live", b"m5")  # 4 messages of 2 bytes held already
    assert_refused(refused.headers, 414, "/queue/live", "maxTotalMsgBytes", "8")

    client.subscribe("/queue/live", "s", ack="auto")
    assert bodies(client.receive(4)) == [b"m1", b"m2", b"m3", b"m4"]


def test_autocreate_defaults_apply_to_queues_and_topic_subscriptions(
    make_broker: BrokerFactory, clients: ClientFactory
) -> None:
    broker = make_broker({"imq.autocreate.destination.maxNumMsgs": "2"})
    client = clients(broker.port, failed_receipts="true")
    assert_accepted(send_raw(client, "/queue/auto", b"1").headers)
    assert_accepted(send_raw(client, "/queue/auto", b"2").headers)
    refused = send_raw(client, "/queue/auto", b"3")
    assert_refused(refused.headers, 414, "/queue/auto", "maxNumMsgs", "2")

    # On a topic the limit applies to each subscription's backlog: the slow one decides.
    fast, slow = clients(broker.port), clients(broker.port)
    fast.subscribe("/topic/auto", "fast", ack="auto")
    slow.subscribe("/topic/auto", "slow")  # never acknowledges
    assert_accepted(send_raw(client, "/topic/auto", b"1").headers)
    assert_accepted(send_raw(client, "/topic/auto", b"2").headers)
    assert bodies(fast.receive(2)) == [b"1", b"2"]
    held = slow.receive(2)
    refused = send_raw(client, "/topic/auto", b"3")
    assert_refused(refused.headers, 414, "/topic/auto", "maxNumMsgs", "2")
    slow.ack(held[0])
    slow.sync()
    assert_accepted(send_raw(client, "/topic/auto", b"4").headers)
    assert bodies(fast.receive(1)) == [b"4"]
    assert bodies(slow.receive(1)) == [b"4"]


def test_autocreated_and_configured_destination_defaults(
    make_broker: BrokerFactory, clients: ClientFactory
) -> None:
    broker = make_broker({"imq.destination.queue.admin.consumerFlowLimit": "5"})
    client = clients(broker.port, failed_receipts="true")
    assert_accepted(send_raw(client, "/queue/auto").headers)
    auto = settings_of(broker, "/queue/auto")
    assert auto.max_num_msgs == 100_000
    assert auto.max_total_msg_bytes == 10 * GIB
    assert auto.max_bytes_per_msg == 10 * MIB
    assert auto.limit_behavior is LimitBehavior.REJECT_NEWEST
    # A destination defined in the configuration has Open MQ's admin defaults.
    admin = settings_of(broker, "/queue/admin")
    assert (admin.max_num_msgs, admin.max_total_msg_bytes, admin.max_bytes_per_msg) == (-1, -1, -1)
    assert admin.max_num_producers == 100
    assert admin.limit_behavior is LimitBehavior.REJECT_NEWEST
    assert admin.use_dmq

    big = b"x" * (10 * MIB + 1)
    refused = send_raw(client, "/queue/auto", big)
    assert_refused(refused.headers, 423, "/queue/auto", "maxBytesPerMsg", str(10 * MIB))
    assert_accepted(send_raw(client, "/queue/admin", big).headers)  # no per-message limit
