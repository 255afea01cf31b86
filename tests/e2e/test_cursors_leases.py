"""Reading by sequence number, topic cursors and queue leases over real sockets
(docs/pipelines-protocol.md), with the raw client and with stomp.py."""

from __future__ import annotations

import pytest

from sluiceway.protocol.frames import Frame
from sluiceway.testing import BrokerThread
from tests.e2e import reading
from tests.e2e.conftest import BrokerFactory, ClientFactory
from tests.e2e.rawclient import RawClient
from tests.e2e.reading import read, read_cursor, read_lease, send
from tests.e2e.stomppy import connect, with_receipt

Q, T = "/queue/jobs", "/topic/events"


def lease(client: RawClient, name: str, **headers: str) -> tuple[list[Frame], Frame]:
    return read_lease(client, Q, name, **headers)


def cursor(client: RawClient, group: str, **headers: str) -> tuple[list[Frame], Frame]:
    return read_cursor(client, T, group, **headers)


def end_lease(client: RawClient, name: str, command: str = "ACK") -> Frame:
    return reading.end_lease(client, Q, name, command)


def commit(client: RawClient, group: str, sequence: int | str) -> Frame:
    return reading.commit(client, T, group, sequence)


def refused(client: RawClient, command: str, headers: dict[str, str]) -> Frame:
    """Send a frame asking for a receipt from a failed-receipts client; return the failed
    RECEIPT (the connection stays open)."""
    frame = client.request(command, headers)
    assert "status" in frame.headers, f"expected a refusal, got {frame}"
    return frame


# -- reading by sequence number --------------------------------------------------------------------


def test_the_end_marker_reports_head_first_sequence_count_and_flow_limit(
    make_broker: BrokerFactory, clients: ClientFactory
) -> None:
    broker = make_broker({"imq.destination.queue.jobs.consumerFlowLimit": "7"})
    producer, consumer, browser = (clients(broker.port) for _ in range(3))
    send(producer, Q, 5)
    consumer.subscribe(Q, "c", consumer_flow_limit="2")  # takes two and does not acknowledge
    consumer.receive(2)
    lease(browser, "g/1", lease_max_messages="1")
    messages, end = read(browser, Q, browser="true", from_sequence="4", to_sequence="4")
    assert messages == []  # to-sequence = from-sequence: only the marker
    assert end.headers["head-sequence"] == "5"
    assert end.headers["first-sequence"] == "4"  # 1 and 2 delivered, 3 leased
    assert end.headers["message-count"] == "2"
    assert end.headers["consumer-flow-limit"] == "7"
    assert end.headers["next-sequence"] == "4"


# -- queue leases ----------------------------------------------------------------------------------


def test_a_lease_read_twice_returns_the_same_messages(raw: ClientFactory) -> None:
    producer, reader, other = raw(), raw(), raw()
    send(producer, Q, 6)
    first, end = lease(reader, "spark/1", lease_max_messages="4")
    assert [m.body for m in first] == [b"m0", b"m1", b"m2", b"m3"]
    assert {m.headers["lease"] for m in first} == {"spark/1"}
    assert all("ack" not in m.headers for m in first)
    assert [m.headers["redelivered"] for m in first] == ["false"] * 4
    assert (end.headers["lease-state"], end.headers["lease-count"]) == ("open", "4")
    assert int(end.headers["lease-expires"]) > 0
    # From another connection too: a lease belongs to its name, not to a connection.
    again, end = lease(other, "spark/1")
    assert [(m.body, m.headers["message-id"]) for m in again] == [
        (m.body, m.headers["message-id"]) for m in first
    ]
    assert end.headers["message-count"] == "2"


def test_acknowledging_consumes_the_lease_once(raw: ClientFactory) -> None:
    producer, reader = raw(), raw()
    send(producer, Q, 3)
    lease(reader, "g/1")
    assert end_lease(reader, "g/1").headers["lease-state"] == "acknowledged"
    assert end_lease(reader, "g/1").headers["lease-state"] == "acknowledged"  # idempotent
    messages, end = lease(reader, "g/1")
    assert (messages, end.headers["lease-state"]) == ([], "acknowledged")
    assert lease(reader, "g/2")[0] == []  # nothing is left in the queue


def test_releasing_returns_the_messages_redelivered(raw: ClientFactory) -> None:
    producer, reader = raw(), raw()
    send(producer, Q, 2)
    lease(reader, "g/1")
    assert end_lease(reader, "g/1", "NACK").headers["lease-state"] == "expired"
    messages, _ = lease(reader, "g/2")
    assert [m.body for m in messages] == [b"m0", b"m1"]
    assert [(m.headers["redelivered"], m.headers["delivery-count"]) for m in messages] == [
        ("true", "2"),
        ("true", "2"),
    ]


def test_a_lease_past_its_ttl_expires_and_its_messages_go_back(raw: ClientFactory) -> None:
    producer, reader, consumer = raw(), raw(failed_receipts="true"), raw()
    send(producer, Q, 2)
    lease(reader, "g/1", lease_ttl="300")
    consumer.subscribe(Q, "c")
    # The broker's tick (once a second) expires it; the consumer then gets the messages.
    back = consumer.receive(2, timeout=5)
    assert [(m.body, m.headers["redelivered"]) for m in back] == [(b"m0", "true"), (b"m1", "true")]
    failed = refused(reader, "ACK", {"id": "lease", "destination": Q, "lease": "g/1"})
    assert failed.headers["status"] == "410"
    assert "g/1" in failed.headers["detail"]
    assert lease(reader, "g/1")[1].headers["lease-state"] == "expired"


def test_a_lower_number_never_makes_a_new_lease(raw: ClientFactory) -> None:
    producer, reader = raw(), raw()
    send(producer, Q, 3)
    assert len(lease(reader, "g/10", lease_max_messages="1")[0]) == 1
    messages, end = lease(reader, "g/9")
    assert (messages, end.headers["lease-state"]) == ([], "expired")
    assert [m.body for m in lease(reader, "g/11")[0]] == [b"m1", b"m2"]


def test_leased_messages_count_in_the_queue_limits_until_acknowledged(
    make_broker: BrokerFactory, clients: ClientFactory
) -> None:
    broker = make_broker(
        {
            "imq.destination.queue.jobs.maxNumMsgs": "2",
            "imq.destination.queue.jobs.limitBehavior": "FLOW_CONTROL",
        }
    )
    producer, reader = clients(broker.port), clients(broker.port)
    send(producer, Q, 2)
    lease(reader, "g/1")
    # The queue is full with the leased messages: this SEND is held, its RECEIPT owed.
    producer.send("SEND", {"destination": Q, "persistent": "true", "receipt": "held"}, b"m2")
    # Other frames are answered meanwhile, and before it (request() checks the receipt id).
    producer.request("BEGIN", {"transaction": "t"})
    end_lease(reader, "g/1")
    assert producer.expect("RECEIPT").headers["receipt-id"] == "held"
    assert [m.body for m in lease(reader, "g/2")[0]] == [b"m2"]


def test_a_forgotten_acknowledged_lease_reads_as_expired(
    make_broker: BrokerFactory, clients: ClientFactory
) -> None:
    broker = make_broker({"imq.lease.max_open": "1"})  # so one finished lease is remembered
    producer, reader = clients(broker.port), clients(broker.port)
    send(producer, Q, 2)
    for name in ("g/1", "g/2"):
        lease(reader, name, lease_max_messages="1")
        end_lease(reader, name)
    assert lease(reader, "g/2")[1].headers["lease-state"] == "acknowledged"
    messages, end = lease(reader, "g/1")
    assert (messages, end.headers["lease-state"]) == ([], "expired")


def test_a_lease_of_an_empty_queue_stays_empty(raw: ClientFactory) -> None:
    producer, reader = raw(), raw()
    messages, end = lease(reader, "g/1")
    assert (messages, end.headers["lease-state"], end.headers["lease-count"]) == ([], "open", "0")
    send(producer, Q, 1)
    assert lease(reader, "g/1")[0] == []
    assert end_lease(reader, "g/1").headers["lease-state"] == "acknowledged"
    assert [m.body for m in lease(reader, "g/2")[0]] == [b"m0"]


def test_too_many_open_leases_is_414(make_broker: BrokerFactory, clients: ClientFactory) -> None:
    broker = make_broker({"imq.lease.max_open": "1"})
    reader = clients(broker.port, failed_receipts="true")
    lease(reader, "g/1")
    failed = refused(reader, "SUBSCRIBE", {"destination": Q, "id": "x", "lease": "g/2"})
    assert (failed.headers["status"], failed.headers["limit"]) == ("414", "imq.lease.max_open")
    end_lease(reader, "g/1")
    assert lease(reader, "g/2")[1].headers["lease-state"] == "open"


@pytest.mark.parametrize(
    ("headers", "named"),
    [
        ({"lease": "g"}, "lease"),
        ({"lease": "g/-1"}, "lease"),
        ({"lease": "g/9223372036854775808"}, "lease"),
        ({"lease": "a b/1"}, "lease"),
        ({"lease": "g/1", "lease-ttl": "0"}, "lease-ttl"),
        ({"lease": "g/1", "lease-max-messages": "many"}, "lease-max-messages"),
        ({"lease": "g/1", "selector": "a = 1"}, "selector"),
    ],
)
def test_a_malformed_lease_header_is_400_naming_it(
    raw: ClientFactory, headers: dict[str, str], named: str
) -> None:
    client = raw()
    client.send("SUBSCRIBE", {"destination": Q, "id": "x", "receipt": "r", **headers})
    error = client.expect("ERROR")
    assert error.headers["status"] == "400"
    assert named in error.headers["message"]
    client.expect_closed()


def test_unknown_leases_are_404_and_an_ack_in_a_transaction_is_400(raw: ClientFactory) -> None:
    reader = raw(failed_receipts="true")
    failed = refused(reader, "ACK", {"id": "lease", "destination": Q, "lease": "g/1"})
    assert failed.headers["status"] == "404"
    lease(reader, "g/1")
    headers = {"id": "lease", "destination": Q, "lease": "g/1", "transaction": "t"}
    assert refused(reader, "ACK", headers).headers["status"] == "400"


def test_a_producer_cannot_forge_the_lease_header(raw: ClientFactory) -> None:
    producer, reader = raw(), raw()
    producer.request("SEND", {"destination": Q, "lease": "forged/1"}, b"x")
    (message,), _ = lease(reader, "real/1")
    assert message.headers["lease"] == "real/1"


def test_leases_with_stomp_py(broker: BrokerThread) -> None:
    connection, recorder = connect(broker.port)
    for i in range(3):
        connection.send(Q, f"job {i}", headers={"persistent": "true"})
    receipt = with_receipt(
        recorder,
        lambda r: connection.subscribe(
            Q, id="l", ack="auto", headers={"lease": "py/1", "receipt": r}
        ),
    )
    assert receipt["consumer-flow-limit"] == "1000"
    frames = recorder.wait_messages(4)
    assert [f.body for f in frames[:3]] == ["job 0", "job 1", "job 2"]
    assert frames[3].headers["lease-state"] == "open"
    # stomp.py's ack() takes no extra headers: the frame is sent as it is.
    acked = with_receipt(
        recorder,
        lambda r: connection.send_frame(
            "ACK", {"id": "lease", "destination": Q, "lease": "py/1", "receipt": r}
        ),
    )
    assert acked["lease-state"] == "acknowledged"
    connection.disconnect()


# -- topic cursors ---------------------------------------------------------------------------------


def test_a_cursor_created_latest_reads_what_follows(raw: ClientFactory) -> None:
    producer, reader = raw(), raw()
    send(producer, T, 2, "early")  # no cursor yet: the topic keeps nothing
    messages, end = cursor(reader, "g")
    assert (messages, end.headers["cursor-sequence"], end.headers["head-sequence"]) == (
        [],
        "3",
        "2",
    )
    send(producer, T, 3)
    messages, end = cursor(reader, "g")
    assert [m.body for m in messages] == [b"m0", b"m1", b"m2"]
    assert [m.headers["sequence"] for m in messages] == ["3", "4", "5"]
    assert end.headers["next-sequence"] == "6"
    assert end.headers["cursor-sequence"] == "3"  # reading did not move it


def test_cursor_start_earliest_and_a_sequence_number(raw: ClientFactory) -> None:
    producer, reader = raw(), raw()
    cursor(reader, "keeper")
    send(producer, T, 4)
    assert cursor(reader, "early", cursor_start="earliest")[1].headers["cursor-sequence"] == "1"
    messages, end = cursor(reader, "mid", cursor_start="3")
    assert [m.headers["sequence"] for m in messages] == ["3", "4"]
    assert end.headers["cursor-sequence"] == "3"


def test_commit_releases_retention_and_never_goes_back(raw: ClientFactory) -> None:
    producer, reader = raw(), raw()
    cursor(reader, "g")
    send(producer, T, 5)
    assert commit(reader, "g", 4).headers["cursor-sequence"] == "4"
    assert commit(reader, "g", 2).headers["cursor-sequence"] == "4"
    messages, end = cursor(reader, "g", from_sequence="1")
    assert [m.headers["sequence"] for m in messages] == ["4", "5"]
    assert (end.headers["first-sequence"], end.headers["message-count"]) == ("4", "2")


def test_data_loss_shows_as_first_sequence_above_the_cursor(
    make_broker: BrokerFactory, clients: ClientFactory
) -> None:
    broker = make_broker(
        {
            "imq.destination.topic.events.maxNumMsgs": "3",
            "imq.destination.topic.events.limitBehavior": "REMOVE_OLDEST",
        }
    )
    producer, reader = clients(broker.port), clients(broker.port)
    cursor(reader, "slow")
    send(producer, T, 5)  # the topic is full at 3: the two oldest are evicted
    messages, end = cursor(reader, "slow")
    assert end.headers["cursor-sequence"] == "1"
    assert end.headers["first-sequence"] == "3"  # 1 and 2 are gone: the reader can tell
    assert [m.headers["sequence"] for m in messages] == ["3", "4", "5"]


def test_deleting_a_cursor_and_unknown_cursors(raw: ClientFactory) -> None:
    reader = raw(failed_receipts="true")
    assert (
        refused(
            reader, "ACK", {"id": "cursor", "destination": T, "cursor": "g", "sequence": "1"}
        ).headers["status"]
        == "404"
    )
    cursor(reader, "g")
    reader.request("UNSUBSCRIBE", {"id": "any", "destination": T, "cursor": "g"})
    assert (
        refused(reader, "UNSUBSCRIBE", {"id": "any", "destination": T, "cursor": "g"}).headers[
            "status"
        ]
        == "404"
    )
    missing = refused(reader, "ACK", {"id": "cursor", "destination": T, "cursor": "g"})
    assert (missing.headers["status"], missing.headers["message"]) == (
        "400",
        "missing sequence header",
    )
    queue = refused(
        reader, "SUBSCRIBE", {"destination": Q, "id": "c", "browser": "true", "cursor": "g"}
    )
    assert queue.headers["status"] == "400"
    plain = refused(reader, "SUBSCRIBE", {"destination": T, "id": "c", "cursor": "g"})
    assert plain.headers["message"] == "cursor without browser:true"


def test_cursors_with_stomp_py(broker: BrokerThread) -> None:
    connection, recorder = connect(broker.port)

    def read_cursor(receipt: str) -> None:
        connection.subscribe(
            T,
            id=receipt,
            ack="auto",
            headers={"browser": "true", "cursor": "py", "receipt": receipt},
        )

    with_receipt(recorder, read_cursor)
    (marker,) = recorder.wait_messages(1)
    assert marker.headers["cursor-sequence"] == "1"
    recorder.take()
    for body in ("e0", "e1"):
        connection.send(T, body)
    with_receipt(recorder, read_cursor)
    frames = recorder.wait_messages(3)
    assert [f.body for f in frames[:2]] == ["e0", "e1"]
    headers = {
        "id": "cursor",
        "destination": T,
        "cursor": "py",
        "sequence": frames[2].headers["next-sequence"],
    }
    moved = with_receipt(
        recorder, lambda r: connection.send_frame("ACK", {**headers, "receipt": r})
    )
    assert moved["cursor-sequence"] == "3"
    connection.disconnect()
