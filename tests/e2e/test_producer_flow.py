"""Producer flow control over real sockets: held SENDs, their receipts, deadlines and pauses.

A FLOW_CONTROL queue never refuses for being full: the broker holds the SEND (and its RECEIPT)
until a consumer makes room, while the connection's other frames go on being handled. These tests
drive that with raw frames, with stomp.py and with the project's asyncio client. Barriers are
receipts of non-SEND frames (BEGIN, SUBSCRIBE), which may overtake a held SEND's receipt; the
few "it has not arrived" checks are short and bounded.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Mapping
from typing import Any

import pytest

from sluiceway.client import AckMode, ConnectionFactory, Message, ResourceFull
from sluiceway.client.pipeline import PipelineConnection, PipelineSettings
from sluiceway.core.broker import Broker, PauseTarget
from sluiceway.core.model.holding import HeldProducer
from sluiceway.errors import Forbidden
from sluiceway.naming import parse_destination
from sluiceway.protocol.codec import encode_frame
from sluiceway.protocol.frames import Frame, StompVersion
from sluiceway.server.snapshots import ConnectionInfo
from sluiceway.testing import BrokerThread
from tests.e2e.conftest import BrokerFactory, ClientFactory
from tests.e2e.rawclient import RawClient
from tests.e2e.stomppy import Recorder, connect, subscribe, sync, with_receipt
from tests.e2e.support import connection_infos, wait_connection_count, wait_until

Q = "/queue/q"
QUIET = 0.2  # seconds a bounded "nothing arrives" check waits


# -- helpers ---------------------------------------------------------------------------------------


def flow_broker(
    make_broker: BrokerFactory, limit: int, properties: Mapping[str, str] | None = None
) -> BrokerThread:
    """A broker whose /queue/q holds at most `limit` messages and holds producers beyond."""
    return make_broker(
        {
            "imq.destination.queue.q.maxNumMsgs": str(limit),
            "imq.destination.queue.q.limitBehavior": "FLOW_CONTROL",
            # JMS IQ Manager throttling holds SENDs too; keep it out of these tests.
            "imq.throttling.server.threshold": "0",
            **(properties or {}),
        }
    )


def core(broker: BrokerThread) -> Broker:
    assert broker.broker is not None
    return broker.broker


def held_producers(broker: BrokerThread) -> list[HeldProducer]:
    """The broker's held producers, in pause order, read on its own loop."""

    def snapshot() -> list[HeldProducer]:
        return core(broker).producers.held()

    return broker.call(snapshot)


def pause(broker: BrokerThread, path: str, target: PauseTarget) -> None:
    """An administrator's `pause dst` (core API, on the broker's loop)."""
    name = parse_destination(path)
    broker.call(lambda: core(broker).pause(name, target))


def resume(broker: BrokerThread, path: str, target: PauseTarget) -> None:
    name = parse_destination(path)
    broker.call(lambda: core(broker).resume(name, target))


def send_confirmed(connection: Any, recorder: Recorder, destination: str, body: str) -> None:
    """Send with stomp.py and wait for the RECEIPT."""
    with_receipt(recorder, lambda r: connection.send(destination, body, headers={"receipt": r}))


def info_of(broker: BrokerThread, number: int) -> ConnectionInfo:
    (info,) = [i for i in connection_infos(broker) if i.number == number]
    return info


def raw_connect(clients: ClientFactory, port: int, **headers: str) -> tuple[RawClient, int]:
    """A connected raw client and its core connection number (from CONNECTED's session)."""
    client = clients(port, connect=False)
    connected = client.connect(**headers)
    return client, int(connected.headers["session"].rsplit("-", 1)[1])


def send_frame(destination: str, body: bytes, **headers: str) -> bytes:
    fields = {"destination": destination, **{k.replace("_", "-"): v for k, v in headers.items()}}
    return encode_frame(Frame("SEND", fields, body), StompVersion.V1_2)


def bodies(frames: list[Frame]) -> list[bytes]:
    return [frame.body for frame in frames]


def texts(frames: list[Any]) -> list[str]:
    """Bodies of stomp.py frames."""
    return [str(frame.body) for frame in frames]


def assert_nothing_arrives(client: RawClient) -> None:
    """A short bounded check that no frame at all arrives on `client`."""
    with pytest.raises(TimeoutError):
        client.read_some(time.monotonic() + QUIET)
    assert not client.other
    assert not client.messages


def consume_acking(client: RawClient, count: int) -> list[Frame]:
    """Receive `count` messages one at a time, acknowledging each."""
    received = []
    for _ in range(count):
        (message,) = client.receive(1)
        client.ack(message)
        received.append(message)
    return received


# -- 1. the RECEIPT of a held SEND -----------------------------------------------------------------


def test_receipt_of_a_held_send_comes_when_a_consumer_makes_room(
    make_broker: BrokerFactory,
) -> None:
    broker = flow_broker(make_broker, 2)
    producer, recorder = connect(broker.port)
    for i in range(2):
        send_confirmed(producer, recorder, Q, f"{i}")
    producer.send(Q, "2", headers={"receipt": "held-send"})
    # A BEGIN's receipt overtakes the held SEND's: the SEND was handled (and held) before it.
    with_receipt(recorder, lambda r: producer.begin("tx-1", headers={"receipt": r}))
    with_receipt(recorder, lambda r: producer.abort("tx-1", headers={"receipt": r}))
    assert "held-send" not in recorder.receipts
    assert [h.held_sends for h in held_producers(broker)] == [1]

    consumer, consumed = connect(broker.port)
    subscribe(consumer, consumed, Q, "s1")
    first = consumed.wait_messages(2)
    sync(consumer, consumed)
    assert texts(consumed.take()) == ["0", "1"]  # the held one is not in the queue yet
    assert "held-send" not in recorder.receipts
    consumer.ack(first[0].headers["ack"])
    recorder.wait_for(lambda: "held-send" in recorder.receipts)
    assert "status" not in recorder.receipts["held-send"]  # accepted, not refused
    assert texts(consumed.wait_messages(1)) == ["2"]
    assert held_producers(broker) == []
    producer.disconnect()
    consumer.disconnect()


# -- 2. one connection producing to and consuming from a full queue --------------------------------


def test_one_stomp_py_connection_produces_and_consumes_200_persistent(
    make_broker: BrokerFactory,
) -> None:
    broker = flow_broker(make_broker, 10)
    client, recorder = connect(broker.port)
    subscribe(client, recorder, Q, "s1")
    received: list[Any] = []

    def ack_arrived() -> None:
        for frame in recorder.take():
            client.ack(frame.headers["ack"])
            received.append(frame)

    for i in range(200):
        client.send(Q, f"{i}", headers={"persistent": "true", "receipt": f"p{i}"})
        if i == 10:
            # Nothing acknowledged yet: 10 delivered fill the queue and the 11th is held.
            sync(client, recorder)
            assert len(recorder.messages) == 10
            assert [h.held_sends for h in held_producers(broker)] == [1]
        if i >= 10:
            ack_arrived()
    deadline = time.monotonic() + 10
    while len(received) < 200:
        recorder.wait_for(lambda: bool(recorder.messages), deadline - time.monotonic())
        ack_arrived()
    assert texts(received) == [str(i) for i in range(200)]
    recorder.wait_for(lambda: all(f"p{i}" in recorder.receipts for i in range(200)))
    assert not any("status" in recorder.receipts[f"p{i}"] for i in range(200))
    assert recorder.errors == []
    assert held_producers(broker) == []
    client.disconnect()


async def test_one_client_connection_produces_and_consumes_200_persistent(
    make_broker: BrokerFactory,
) -> None:
    broker = flow_broker(make_broker, 10)
    address = f"stomp://127.0.0.1:{broker.port}"
    # imqAckTimeout bounds every wait for the broker (sends, SUBSCRIBE, acknowledge, close).
    connection = await ConnectionFactory(address, ack_timeout=5.0).connect()
    session = connection.session(AckMode.CLIENT)
    producer = session.producer(Q)  # persistent: each send waits for its RECEIPT
    received: list[str] = []
    all_received = asyncio.Event()

    async def produce() -> None:
        for i in range(200):
            await producer.send(f"{i}")

    async def on_message(message: Message) -> None:
        received.append(message.text)
        # A BEGIN round trip on the connection whose SEND is held: its receipt overtakes.
        await message.acknowledge()
        if len(received) == 200:
            all_received.set()

    try:
        async with asyncio.timeout(10), asyncio.TaskGroup() as tasks:
            sending = tasks.create_task(produce())
            # The queue fills with no consumer: the 11th send is held, its RECEIPT withheld.
            await asyncio.to_thread(wait_until, lambda: bool(held_producers(broker)))
            assert not sending.done()
            consumer = await session.consumer(Q)  # a SUBSCRIBE handled while the SEND is held
            consumer.set_listener(on_message)
            await all_received.wait()
        assert received == [str(i) for i in range(200)]
        await consumer.close()
    finally:
        await connection.close()
    assert held_producers(broker) == []


def test_one_raw_connection_sends_200_without_receipts_between_acks(
    make_broker: BrokerFactory, clients: ClientFactory
) -> None:
    broker = flow_broker(make_broker, 10)
    client = clients(broker.port)
    client.subscribe(Q)
    received: list[Frame] = []
    for batch in range(10):
        client.send_bytes(
            b"".join(
                send_frame(Q, b"%d" % i, persistent="false")
                for i in range(batch * 20, batch * 20 + 20)
            )
        )
        client.sync()  # its receipts overtake the held SENDs; every MESSAGE due has come
        for message in client.drain():
            client.ack(message)
            received.append(message)
    received += consume_acking(client, 200 - len(received))
    client.sync()
    assert client.drain() == []
    assert bodies(received) == [b"%d" % i for i in range(200)]
    assert held_producers(broker) == []


def test_other_frames_are_handled_while_a_send_is_held(
    make_broker: BrokerFactory, clients: ClientFactory
) -> None:
    broker = flow_broker(make_broker, 2)
    client = clients(broker.port)
    for i in range(2):
        client.request("SEND", {"destination": Q}, b"%d" % i)
    client.send("SEND", {"destination": Q, "receipt": "held"}, b"2")
    client.subscribe(Q)  # SUBSCRIBE: its RECEIPT overtakes the held SEND's
    zero, one = client.receive(2)
    assert bodies([zero, one]) == [b"0", b"1"]
    client.ack(zero, "NACK")  # NACK: delivered again, still in the queue
    (again,) = client.receive(1)
    assert again.body == b"0"
    client.sync()
    assert client.drain() == []
    assert [h.held_sends for h in held_producers(broker)] == [1]
    client.request("BEGIN", {"transaction": "t"})
    client.send("ACK", {"id": again.headers["ack"], "transaction": "t"})
    client.sync()
    assert [h.held_sends for h in held_producers(broker)] == [1]  # not consumed before COMMIT
    commit = client.request("COMMIT", {"transaction": "t"})
    assert "status" not in commit.headers
    # The COMMIT made room: the held SEND is accepted and delivered to this very subscription.
    assert client.expect("RECEIPT").headers["receipt-id"] == "held"
    (two,) = client.receive(1)
    assert two.body == b"2"
    client.request("UNSUBSCRIBE", {"id": "s1"})  # "1" and "2" go back to the queue
    assert held_producers(broker) == []
    other = clients(broker.port)
    other.subscribe(Q)
    assert sorted(bodies(other.receive(2))) == [b"1", b"2"]


# -- 3. why a producer waits -----------------------------------------------------------------------


def test_held_producer_shows_destination_reason_and_limit(
    make_broker: BrokerFactory, clients: ClientFactory
) -> None:
    broker = flow_broker(make_broker, 2)
    producer, number = raw_connect(clients, broker.port)
    for i in range(2):
        producer.request("SEND", {"destination": Q}, b"%d" % i)
    producer.send("SEND", {"destination": Q, "receipt": "held"}, b"held!")
    # Behind the held SEND, though its own destination has room: one connection keeps its order.
    producer.send("SEND", {"destination": "/queue/other", "receipt": "behind"}, b"x")
    producer.sync()

    (held,) = held_producers(broker)
    assert held.connection == number
    assert held.destination == Q
    assert held.reason == "destination full"
    assert held.limit == "maxNumMsgs"
    assert "maxNumMsgs is 2 messages" in held.detail
    assert held.held_sends == 2
    assert held.held_bytes == len(b"held!") + len(b"x")
    info = info_of(broker, number)
    assert info.held_sends == 2
    assert info.held_reason is not None
    assert Q in info.held_reason
    assert "maxNumMsgs" in info.held_reason
    assert not info.reading_paused  # 2 held is far below imq.producer.hold.max_messages

    other = clients(broker.port)
    other.subscribe("/queue/other")
    other.sync()
    assert other.drain() == []  # still held behind the SEND to the full queue
    consumer = clients(broker.port)
    consumer.subscribe(Q)
    consumer.ack(consumer.receive(1)[0])
    assert producer.expect("RECEIPT").headers["receipt-id"] == "held"
    assert producer.expect("RECEIPT").headers["receipt-id"] == "behind"
    assert bodies(other.receive(1)) == [b"x"]
    assert held_producers(broker) == []
    assert info_of(broker, number).held_sends == 0
    assert info_of(broker, number).held_reason is None


# -- 4. the hold deadline --------------------------------------------------------------------------


def test_send_held_past_the_deadline_gets_an_error_and_the_connection_closes(
    make_broker: BrokerFactory,
) -> None:
    broker = flow_broker(make_broker, 1, {"imq.producer.hold.timeout": "500"})
    producer, recorder = connect(broker.port)
    send_confirmed(producer, recorder, Q, "fills")
    producer.send(Q, "waits", headers={"receipt": "late"})
    recorder.wait_for(lambda: bool(recorder.errors), timeout=4)
    (error,) = recorder.errors
    headers = error.headers
    assert headers["status"] == "414"
    assert headers["message"] == "send held too long"
    assert headers["destination"] == Q
    assert headers["limit"] == "maxNumMsgs"
    assert headers["limit-value"] == "1"
    assert headers.get("receipt-id") == "late"
    assert re.search(r"held for \d+\.\d s", error.body)
    assert "waiting for: " in error.body
    assert "late" not in recorder.receipts
    recorder.wait_for(lambda: recorder.disconnected)
    wait_connection_count(broker, 0)
    assert held_producers(broker) == []


async def test_client_send_held_past_the_deadline_raises_and_stays_connected(
    make_broker: BrokerFactory,
) -> None:
    broker = flow_broker(make_broker, 1, {"imq.producer.hold.timeout": "500"})
    connection = await ConnectionFactory(f"stomp://127.0.0.1:{broker.port}").connect()
    try:
        producer = connection.session().producer(Q)
        await producer.send("fills", timeout=5)
        with pytest.raises(ResourceFull) as raised:
            await producer.send("waits", timeout=5)
        error = raised.value
        assert "held for" in str(error)
        assert "waiting for" in str(error)
        assert error.summary == "send held too long"
        assert error.status == 414
        assert error.destination == Q
        assert error.limit == "maxNumMsgs"
        assert not connection.closed
        await producer.send("elsewhere", "/queue/other", timeout=5)  # still open
    finally:
        await connection.close()
    assert held_producers(broker) == []


# -- 5. release order ------------------------------------------------------------------------------


def test_held_connections_are_released_in_the_order_they_were_held(
    make_broker: BrokerFactory, clients: ClientFactory
) -> None:
    broker = flow_broker(make_broker, 1)
    filler = clients(broker.port)
    filler.request("SEND", {"destination": Q}, b"filler")
    producers: list[tuple[RawClient, int]] = []
    for name in (b"first", b"second", b"third"):
        client, number = raw_connect(clients, broker.port)
        client.send("SEND", {"destination": Q, "receipt": "held"}, name)
        client.sync()  # held before the next connection sends
        producers.append((client, number))
    assert [h.connection for h in held_producers(broker)] == [n for _, n in producers]

    consumer = clients(broker.port)
    consumer.subscribe(Q, consumer_flow_limit="1")
    received = consume_acking(consumer, 4)
    assert bodies(received) == [b"filler", b"first", b"second", b"third"]
    for client, _ in producers:
        assert client.expect("RECEIPT").headers["receipt-id"] == "held"
    assert held_producers(broker) == []


def test_each_held_connection_takes_at_most_its_batch_per_round(
    make_broker: BrokerFactory, clients: ClientFactory
) -> None:
    # Batch = maxNumMsgs / maxNumProducers = 4 / 2 = 2 messages per connection per round.
    broker = flow_broker(make_broker, 4, {"imq.destination.queue.q.maxNumProducers": "2"})
    first, first_number = raw_connect(clients, broker.port)
    second, second_number = raw_connect(clients, broker.port)
    for i in range(4):
        first.request("SEND", {"destination": Q}, b"fill%d" % i)
    first.send_bytes(b"".join(send_frame(Q, b"a%d" % i) for i in range(4)))
    first.sync()
    second.send_bytes(b"".join(send_frame(Q, b"b%d" % i) for i in range(4)))
    second.sync()
    assert [(h.connection, h.held_sends) for h in held_producers(broker)] == [
        (first_number, 4),
        (second_number, 4),
    ]

    consumer = clients(broker.port)
    consumer.subscribe(Q)
    fills = consumer.receive(4)
    # Room for 4 at once: acknowledged in one transaction, made room by its COMMIT.
    consumer.request("BEGIN", {"transaction": "t"})
    for message in fills:
        consumer.send("ACK", {"id": message.headers["ack"], "transaction": "t"})
    consumer.request("COMMIT", {"transaction": "t"})
    released = consumer.receive(4)
    assert bodies(released) == [b"a0", b"a1", b"b0", b"b1"]  # not all four from the first
    consumer.sync()
    assert consumer.drain() == []
    assert [(h.connection, h.held_sends) for h in held_producers(broker)] == [
        (first_number, 2),
        (second_number, 2),
    ]
    for message in released:
        consumer.ack(message)
    assert bodies(consumer.receive(4)) == [b"a2", b"a3", b"b2", b"b3"]
    assert held_producers(broker) == []


# -- 6. the bound on what one connection may have held ---------------------------------------------


@pytest.mark.parametrize(
    ("bound", "size", "held"),
    [
        pytest.param({"imq.producer.hold.max_messages": "5"}, 8, 5, id="max_messages"),
        # 4 bodies of 256 bytes reach 1 KiB.
        pytest.param({"imq.producer.hold.max_bytes": "1k"}, 256, 4, id="max_bytes"),
    ],
)
def test_connection_at_its_hold_bound_is_not_read_until_a_send_is_released(
    make_broker: BrokerFactory,
    clients: ClientFactory,
    bound: dict[str, str],
    size: int,
    held: int,
) -> None:
    broker = flow_broker(make_broker, 2, bound)
    producer, number = raw_connect(clients, broker.port)
    # 2 fill the queue, `held` are held, the rest and the BEGIN must wait unread.
    payloads = [(b"%d " % i).ljust(size, b".") for i in range(20)]
    burst = b"".join(send_frame(Q, body, persistent="false") for body in payloads)
    burst += encode_frame(
        Frame("BEGIN", {"transaction": "after", "receipt": "after-burst"}), StompVersion.V1_2
    )
    producer.send_bytes(burst)
    wait_until(lambda: info_of(broker, number).reading_paused)
    assert info_of(broker, number).held_sends == held
    (producer_held,) = held_producers(broker)
    assert (producer_held.held_sends, producer_held.held_bytes) == (held, held * size)
    assert_nothing_arrives(producer)  # the BEGIN behind the held SENDs is not handled yet
    assert info_of(broker, number).held_sends == held

    consumer = clients(broker.port)
    consumer.subscribe(Q)
    received = consume_acking(consumer, 20)
    assert bodies(received) == payloads  # nothing lost, in order
    assert producer.expect("RECEIPT").headers["receipt-id"] == "after-burst"
    consumer.sync()
    assert consumer.drain() == []
    info = info_of(broker, number)
    assert (info.held_sends, info.reading_paused) == (0, False)
    assert held_producers(broker) == []


# -- 7. DISCONNECT while a SEND is held ------------------------------------------------------------


def test_disconnect_receipt_waits_for_the_held_send(
    make_broker: BrokerFactory, clients: ClientFactory
) -> None:
    broker = flow_broker(make_broker, 1)
    producer, number = raw_connect(clients, broker.port)
    producer.request("SEND", {"destination": Q}, b"fills")
    # The producer also consumes another queue and leaves a message unacknowledged.
    producer.request("SEND", {"destination": "/queue/side"}, b"unacked")
    producer.subscribe("/queue/side")
    (unacked,) = producer.receive(1)
    producer.send("SEND", {"destination": Q, "receipt": "held"}, b"held")
    producer.sync()
    producer.send("DISCONNECT", {"receipt": "bye"})
    wait_until(lambda: info_of(broker, number).state == "draining")
    # Its subscriptions ended at once: the unacknowledged message went back to its queue.
    side = clients(broker.port)
    side.subscribe("/queue/side")
    (again,) = side.receive(1)
    assert again.body == unacked.body
    assert again.headers.get("redelivered") == "true"
    assert_nothing_arrives(producer)  # no RECEIPT for the DISCONNECT yet

    consumer = clients(broker.port)
    consumer.subscribe(Q)
    consumer.ack(consumer.receive(1)[0])
    assert producer.expect("RECEIPT").headers["receipt-id"] == "held"
    assert producer.expect("RECEIPT").headers["receipt-id"] == "bye"
    producer.expect_closed()
    assert bodies(consumer.receive(1)) == [b"held"]
    assert held_producers(broker) == []


def test_disconnect_with_a_send_held_past_the_deadline_gets_an_error(
    make_broker: BrokerFactory, clients: ClientFactory
) -> None:
    broker = flow_broker(make_broker, 1, {"imq.producer.hold.timeout": "500"})
    producer = clients(broker.port)
    producer.request("SEND", {"destination": Q}, b"fills")
    producer.send("SEND", {"destination": Q, "receipt": "held"}, b"held")
    producer.sync()
    producer.send("DISCONNECT", {"receipt": "bye"})
    error = producer.expect("ERROR", timeout=4)
    assert error.headers["status"] == "414"
    assert error.headers["message"] == "send held too long"
    assert error.headers["limit"] == "maxNumMsgs"
    assert error.headers.get("receipt-id") == "held"
    assert b"held for" in error.body
    producer.expect_closed()
    assert not producer.other  # no RECEIPT for the DISCONNECT
    wait_connection_count(broker, 0)
    assert held_producers(broker) == []


def test_disconnect_with_failed_receipts_reports_the_refused_held_send(
    make_broker: BrokerFactory, clients: ClientFactory
) -> None:
    broker = flow_broker(make_broker, 1, {"imq.producer.hold.timeout": "500"})
    producer = clients(broker.port, failed_receipts="true")
    producer.request("SEND", {"destination": Q}, b"fills")
    producer.send("SEND", {"destination": Q, "receipt": "held"}, b"held")
    producer.sync()
    producer.send("DISCONNECT", {"receipt": "bye"})
    refused = producer.expect("RECEIPT", timeout=4)  # the SEND's outcome comes first
    assert refused.headers["receipt-id"] == "held"
    assert refused.headers["status"] == "414"
    assert refused.headers["limit"] == "maxNumMsgs"
    assert "held for" in refused.headers["detail"]
    producer.expect_closed()
    wait_connection_count(broker, 0)
    assert held_producers(broker) == []


# -- 8. an administrator's pause -------------------------------------------------------------------


def test_paused_producers_get_no_receipt_until_resumed(make_broker: BrokerFactory) -> None:
    broker = make_broker({"imq.throttling.server.threshold": "0"})
    producer, recorder = connect(broker.port)
    send_confirmed(producer, recorder, "/queue/p", "before")
    pause(broker, "/queue/p", PauseTarget.PRODUCERS)
    producer.send("/queue/p", "during", headers={"receipt": "paused"})
    sync(producer, recorder)
    assert "paused" not in recorder.receipts
    (held,) = held_producers(broker)
    assert (held.destination, held.reason) == ("/queue/p", "producers paused")

    consumer, consumed = connect(broker.port)
    subscribe(consumer, consumed, "/queue/p", "s1")
    consumed.wait_messages(1)
    sync(consumer, consumed)
    assert texts(consumed.take()) == ["before"]  # consumers of a producer-paused queue go on
    resume(broker, "/queue/p", PauseTarget.PRODUCERS)
    recorder.wait_for(lambda: "paused" in recorder.receipts)
    assert "status" not in recorder.receipts["paused"]
    assert texts(consumed.wait_messages(1)) == ["during"]
    assert held_producers(broker) == []
    producer.disconnect()
    consumer.disconnect()


def test_paused_consumers_get_nothing_until_resumed(make_broker: BrokerFactory) -> None:
    broker = make_broker({"imq.throttling.server.threshold": "0"})
    consumer, consumed = connect(broker.port)
    subscribe(consumer, consumed, "/queue/c", "s1", ack="auto")
    pause(broker, "/queue/c", PauseTarget.CONSUMERS)
    producer, recorder = connect(broker.port)
    for i in range(3):  # producers are not paused: each is accepted at once
        send_confirmed(producer, recorder, "/queue/c", f"{i}")
    sync(consumer, consumed)
    assert consumed.take() == []
    resume(broker, "/queue/c", PauseTarget.CONSUMERS)
    assert texts(consumed.wait_messages(3)) == ["0", "1", "2"]
    producer.disconnect()
    consumer.disconnect()


def test_browsing_and_lease_reads_go_on_while_consumers_are_paused(
    make_broker: BrokerFactory,
) -> None:
    """A browse consumes nothing: paused consumers do not hold it (nothing would wake it)."""
    broker = make_broker()
    producer, recorder = connect(broker.port)
    for i in range(3):
        send_confirmed(producer, recorder, "/queue/b", f"{i}")
    settings = PipelineSettings(port=broker.port, timeout=30.0)
    with PipelineConnection(settings) as reader:
        first = [m.body for m in reader.read_lease("/queue/b", "g/1", max_messages=2)]
        pause(broker, "/queue/b", PauseTarget.CONSUMERS)
        assert reader.head("/queue/b").message_count == 1
        browsed = reader.read_range("/queue/b", 0, None)
        assert [m.body for m in browsed] == [b"2"]
        assert [m.body for m in reader.read_lease("/queue/b", "g/1")] == first
        # A new lease takes nothing from a queue whose consumers are paused.
        assert list(reader.read_lease("/queue/b", "g/2")) == []
        resume(broker, "/queue/b", PauseTarget.CONSUMERS)
        assert [m.body for m in reader.read_lease("/queue/b", "g/3")] == [b"2"]
    producer.disconnect()


def test_dead_message_queue_cannot_be_paused(broker: BrokerThread) -> None:
    for target in PauseTarget:
        with pytest.raises(Forbidden, match="cannot be paused"):
            pause(broker, "/queue/mq.sys.dmq", target)
